"""docs/benchmarks.md, rendered from the results files (``make bench-report``): each table from one make target's run,
named with its commit, day and machine, so the page cannot say what no run measured. A table whose commit the
measured code (``pipelines/``, ``state/``, ``expectations/``) has moved past carries an age mark naming the target to
run again; ``tests/test_figures.py`` holds the page to what this renders, age marks aside."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
PAGE = os.path.join(ROOT, "docs", "benchmarks.md")
MEASURED_CODE = ("pipelines", "state", "expectations")
AGE_MARK = re.compile(r" \*\*\d+ code commits? ago: run `make [\w-]+` again\*\*")

Results = dict[str, dict]


def s(seconds: float | None, digits: int = 2) -> str:
    return "" if seconds is None else f"{seconds:.{digits}f} s"


def x(ratio: float | None, digits: int = 2) -> str:
    return "" if ratio is None else f"{ratio:.{digits}f}×"


def n(count: float) -> str:
    return f"{count:,}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def per_engine(runs: list[tuple[str, dict]], *columns: str) -> list[str]:
    """The headers of a table with ``columns`` for each engine's run, side by side."""
    return [f"{name}: {column}" for name, _ in runs for column in columns]


def over(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def peers(results: Results) -> str:
    runs = [
        (name, results[file]) for file, name in (("peers.json", "delta-rs"), ("peers_spark.json", "Delta on Spark"))
    ]
    systems = [
        ("lakejoin", "lakejoin"),
        ("structured-streaming", "Structured Streaming, files"),
        ("structured-streaming-delta", "Structured Streaming, Delta tables"),
        ("flink", "Flink"),
        ("one-shot", "one-shot batch join of all files"),
    ]
    header = ["system"] + [f"{name}: total, p50 a batch, lakejoin / it" for name, _ in runs]
    rows = []
    for key, label in systems:
        cells = []
        for _, run in runs:
            system = run["systems"].get(key)
            if system is None:
                cells.append("not run")
                continue
            ratio = over(run["systems"]["lakejoin"]["total_s"], system["total_s"]) if key != "lakejoin" else None
            cells.append(", ".join(filter(None, [s(system["total_s"], 1), s(system.get("batch_p50_s")), x(ratio)])))
        rows.append([label, *cells])
    tenths = [
        f"{s(run['systems']['lakejoin']['first_tenth_batch_s'])} → {s(run['systems']['lakejoin']['last_tenth_batch_s'])}"
        for _, run in runs
    ]
    rows.append(["lakejoin's batches, first tenth → last", *tenths])
    config = runs[0][1]["config"]
    return (
        f"{n(config['rows'])} records per relation, {n(config['keys'])} keys, disorder {n(config['disorder'])}, "
        f"micro-batches of {n(config['batch'])} arrivals per relation, {n(runs[0][1]['pairs'])} pairs, no window "
        f"(unbounded state).\n\n{table(header, rows)}\n\n"
        "![Seconds per micro-batch of each system, lakejoin on delta-rs](plots/peers.png)\n\n"
        "![Seconds per micro-batch of each system, lakejoin on Delta on Spark](plots/peers_spark.png)"
    )


def peers_bounded(results: Results) -> str:
    run = results["peers_bounded.json"]
    lakejoin = run["systems"]["lakejoin"]["total_s"]
    rows = [
        [
            label,
            s(system["total_s"], 1),
            s(system.get("batch_p50_s")),
            n(system["peak_state_rows"]) if system.get("peak_state_rows") is not None else "",
            x(over(lakejoin, system["total_s"])) if key != "lakejoin" else "",
        ]
        for key, label in (
            ("lakejoin", f"lakejoin on {run['config']['engine']}"),
            ("structured-streaming", "Structured Streaming, files"),
            ("structured-streaming-delta", "Structured Streaming, Delta tables"),
            ("flink", "Flink"),
        )
        if (system := run["systems"].get(key)) is not None
    ]
    system = run["systems"]["lakejoin"]
    return (
        f"The same stream with a band window of {n(run['config']['window'])} ts units and a watermark delay of the "
        f"disorder for every system; {n(run['pairs'])} pairs.\n\n"
        + table(["system", "total", "p50 a batch", "peak state rows", "lakejoin / it"], rows)
        + f"\n\nlakejoin's batches, first tenth → last: {s(system['first_tenth_batch_s'])} → "
        f"{s(system['last_tenth_batch_s'])}.\n\n"
        "![Seconds per micro-batch of each system, bounded state](plots/peers_bounded.png)"
    )


def backlog(results: Results) -> str:
    runs = [("delta-rs", results["backlog.json"]), ("Delta on Spark", results["backlog_spark.json"])]
    config = runs[0][1]["config"]
    labels = [
        ("lakejoin", "lakejoin"),
        ("by-hand", "by hand in plain Spark (the floor)"),
        ("structured-streaming", "Structured Streaming"),
        ("one-shot", "one-shot batch join"),
    ]
    rows = [
        [
            label,
            *(
                f"{s(run['systems'][key]['total_s'], 1)}"
                + (
                    ""
                    if key == "lakejoin"
                    else f": lakejoin {x(over(run['systems']['lakejoin']['total_s'], run['systems'][key]['total_s']))}"
                )
                for _, run in runs
            ),
        ]
        for key, label in labels
    ]
    steps = []
    for step in ("gold", "bronze_r", "bronze_s", "r_state", "s_state"):
        cells = []
        for _, run in runs:
            mine = run["systems"]["lakejoin"]["phases"][-1].get(step)
            floor = run["systems"]["by-hand"]["phases"][-1].get(step)
            cells += [s(mine), s(floor), x(over(mine, floor), 1)]
        steps.append([step, *cells])
    return (
        f"{n(config['files'] * config['file_rows'])} records per relation in {config['files']} Parquet files each, "
        f"landed out of order and drained by one scheduled run ({config['route']} route); "
        f"{n(runs[0][1]['pairs'])} pairs; {config['rounds']} rounds, medians.\n\n"
        + table(["system", *(name for name, _ in runs)], rows)
        + "\n\nEach step of lakejoin's batch beside the floor's write of the same table (lakejoin's steps overlap):\n\n"
        + table(["step", *per_engine(runs, "lakejoin", "by hand", "over")], steps)
    )


def small(results: Results) -> str:
    runs = [
        ("delta-rs", results["small.json"]),
        ("Delta on Spark, JVM reader", results["small_spark.json"]),
        ("Delta on Spark, public reader", results["small_spark_public_reader.json"]),
    ]
    rows = []
    for scenario, label in (
        ("scheduled run", "(a) a scheduled run landing a file per relation"),
        ("drain, per batch", "(b) a drain of bronze, per batch"),
        ("ingest + run", "(c) ingest of a file per relation, then run"),
    ):
        cells = []
        for _, run in runs:
            mine, floor = run["medians"][scenario]["lakejoin"], run["medians"][scenario]["by hand"]
            cells += [s(mine), s(floor), x(over(mine, floor))]
        rows.append([label, *cells])
    config = runs[0][1]["config"]
    return (
        f"2 records per relation a run; medians of {config['runs']} runs (a, c) and {config['rounds']} drains (b), "
        "each beside the same work by hand in the same session.\n\n"
        + table(["", *per_engine(runs, "lakejoin", "by hand", "over")], rows)
    )


def costs(results: Results) -> str:
    runs = [
        ("delta-rs", results["costs.json"]),
        ("Delta on Spark, JVM reader", results["costs_spark.json"]),
        ("Delta on Spark, public reader", results["costs_spark_public_reader.json"]),
    ]
    rows = [
        [
            step,
            *(
                f"{n(run['steps'][step]['jobs'])} jobs, {n(run['steps'][step]['round_trips'])} calls, "
                f"{run['steps'][step]['commits']} commits"
                for _, run in runs
            ),
        ]
        for step in runs[0][1]["steps"]
    ]
    return (
        "Spark jobs, calls from Python to the JVM and Delta commits of each step of the second cycle of 2 records per "
        "relation (counts, not timings: `tests/test_costs.py` holds them to budgets).\n\n"
        + table(["step", *(name for name, _ in runs)], rows)
    )


def profile(results: Results) -> str:
    runs = [
        ("delta-rs", results["profile.json"]),
        ("JVM reader", results["profile_spark.json"]),
        ("public reader", results["profile_spark_public_reader.json"]),
    ]
    sizes = list(runs[0][1]["cycles"])

    def cell(found: dict) -> str:
        return f"{s(found['seconds'])} / {len(found['jobs'])} / {len(found['collects'])}"

    rows = [
        [step, *(cell(run["cycles"][size][step]) for _, run in runs for size in sizes)]
        for step in runs[0][1]["cycles"][sizes[0]]
    ]
    return (
        "Each step of the second cycle of 2 and of 10,000 records per relation: seconds (one run) / Spark jobs / results "
        "handed to the driver (each named by the line that asked for it in the results files); the readers are Delta on "
        "Spark's.\n\n" + table(["step", *(f"{name}, {int(size):,}" for name, _ in runs for size in sizes)], rows)
    )


def history(results: Results) -> str:
    runs = [("delta-rs", results["history.json"]), ("Delta on Spark", results["history_spark.json"])]
    rows = []
    for step, label in (("ingest_s", "the batch's ingest"), ("run_s", "its run")):
        cells = []
        for _, run in runs:
            empty, after = run["systems"]["empty"][step], run["systems"]["history"][step]
            cells += [s(empty), s(after), x(over(after, empty))]
        rows.append([label, *cells])
    config = runs[0][1]["config"]
    return (
        f"A batch of {config['batch_files']} files of {n(config['file_rows'])} records per relation, on an empty "
        f"warehouse and after {n(runs[0][1]['history_rows_per_relation'])} records per relation joined; bounded "
        f"state; {config['rounds']} rounds, medians.\n\n"
        + table(["", *per_engine(runs, "empty", "after history", "over")], rows)
    )


def changes(results: Results) -> str:
    runs = [("delta-rs", results["changes.json"]), ("Delta on Spark", results["changes-spark.json"])]
    rows = []
    for variant, figures in runs[0][1]["variants"].items():
        applied = ", ".join(f"{n(count)} {what}" for what, count in (figures["changes"] or {}).items() if count)
        cells = [
            cell
            for _, run in runs
            for cell in (s(run["variants"][variant]["median_batch_s"]), x(run["variants"][variant]["over_append_only"]))
        ]
        rows.append([variant, str(figures["batches"]), n(figures["gold_rows"]), applied, figures["check"], *cells])
    config = runs[0][1]["config"]
    return (
        f"{n(config['rows'])} records per relation, {n(config['keys'])} keys, batches of {n(config['max_batch_rows'])}; "
        "median seconds a batch; each variant's gold reconciled with the join of the current records.\n\n"
        + table(
            [
                "variant",
                "batches",
                "gold rows",
                "changes",
                "check",
                *per_engine(runs, "median batch", "× append-only"),
            ],
            rows,
        )
    )


def idle(results: Results) -> str:
    run = results["idle.json"]
    released, without = run["results"]["idle_after"], run["results"]["without"]
    return (
        f"A left join replayed in real time, a run every {run['config']['trigger']:g} seconds; halfway through the "
        f"payments stop. With `idle_after: {run['config']['idle_after']} seconds`:\n\n"
        + table(
            ["", "release after the last payment", "orders released", "orders still waiting at the end"],
            [
                [
                    "`idle_after`",
                    s(released["delay_s"], 1),
                    n(released["rows_released"]),
                    n(released["waiting_at_end"]),
                ],
                ["without", "", "", n(without["waiting_at_end"])],
            ],
        )
    )


def nway(results: Results) -> str:
    run = results["nway.json"]
    rows = [
        [
            relations,
            str(figures["state_tables"]),
            s(figures["median_batch_s"]),
            x(figures["median_over_n2"]),
            s(figures["p95_batch_s"]),
            n(figures["tuples"]),
            n(figures["state_rows"]),
        ]
        for relations, figures in run["by_relations"].items()
    ]
    config = run["config"]
    return (
        f"{n(config['arrivals'])} arrivals split over 2, 3 and 4 relations, batches of {n(config['max_batch_rows'])}; "
        "median seconds a batch after warm-up.\n\n"
        + table(["relations", "state tables", "median batch", "× 2 relations", "p95", "tuples", "state rows"], rows)
    )


def cli(results: Results) -> str:
    rows = []
    for file, engine in (("cli_deltars.json", "delta-rs"), ("cli_spark.json", "Delta on Spark")):
        run = results[file]
        for step, label in (("ingest", "`ingest` of a 2-record file"), ("run", "`run` of 2 records per relation")):
            median = run["median_s"]
            rows.append(
                [
                    f"{engine}: {label}",
                    s(median["cli"][step]),
                    s(median["cli-served"][step]),
                    s(median["api"][step]),
                    x(run["ratios"][f"{step}_served_over_api"]),
                    x(run["ratios"][f"{step}_cli_over_served"], 1),
                ]
            )
    return (
        "A command starting its own Spark, the same command connected to `lakejoin serve`, and the Python API in a "
        f"warm session; medians of {results['cli_deltars.json']['rounds']} rounds.\n\n"
        + table(
            ["", "own Spark per command", "with `lakejoin serve`", "Python API", "served / API", "own / served"], rows
        )
    )


def sizing(results: Results) -> str:
    runs = [("delta-rs", results["sizing.json"]), ("Delta on Spark", results["sizing_spark.json"])]
    rows = [["ingest of a file, median", *(s(run["ingest"]["per_file_p50_s"]) for _, run in runs)]]
    for index, figures in enumerate(runs[0][1]["runs"]):
        rows.append(
            [
                f"{figures['batches']} batches of {n(figures['max_batch_rows'] or figures['arrivals'])}",
                *(
                    f"{s(run['runs'][index]['seconds'], 1)} ({s(run['runs'][index]['seconds_per_batch'])} a batch)"
                    for _, run in runs
                ),
            ]
        )
    rows.append(
        [
            "fit: per batch + per million arrivals",
            *(s(run["fit"]["per_batch_s"]) + " + " + s(run["fit"]["per_million_arrivals_s"], 1) for _, run in runs),
        ]
    )
    config = runs[0][1]["config"]
    return (
        f"{n(config['rows'])} records per relation in {config['files']} Parquet files, each file's ingest timed, then "
        "the same bronze joined in batches of several sizes, and a least-squares fit of a run's seconds "
        "([Sizing](sizing.md) reads it).\n\n" + table(["", *(name for name, _ in runs)], rows)
    )


def day(results: Results) -> str:
    run = results["day.json"]
    engines = run["engines"]
    rows = [
        [label, *(fmt(figures) for figures in engines.values())]
        for label, fmt in (
            ("a scheduled run of 2 records (`small`)", lambda f: s(f["scheduled_run_s"])),
            ("per million arrivals (`backlog`)", lambda f: s(f["per_million_arrivals_s"], 1)),
            ("a run's arrivals", lambda f: n(round(f["run_arrivals"]))),
            ("a run", lambda f: s(f["run_s"], 1)),
            ("the day", lambda f: f"{f['day_min']:.1f} min"),
        )
    ]
    config = run["config"]
    return (
        f"{n(config['records_a_day'])} records a day in {config['runs_a_day']} scheduled runs, estimated from "
        "`bench-small`'s and `bench-backlog`'s results (no Spark runs).\n\n"
        + table(["", *(("delta-rs" if name == "delta-rs" else "Delta on Spark") for name in engines)], rows)
    )


def state(results: Results) -> str:
    rows = [
        [
            label,
            s(run["early_median_s"]),
            s(run["late_median_s"]),
            f"{run['late_over_early']:.2f}",
            s(run["p95_batch_s"]),
            n(max(run["state_rows_max"].values())),
            n(run["pairs"]),
            run["check"],
        ]
        for label, run in (
            ("bounded", results["bounded_state.json"]),
            ("unbounded", results["unbounded_state.json"]),
        )
    ]
    config = results["bounded_state.json"]["config"]
    return (
        f"The demo's stream, {n(config['rows'])} records per relation in batches of {n(config['max_batch_rows'])}, "
        f"bounded (window {config['window']}, lateness {config['disorder']}) and unbounded; median seconds a batch "
        "of the first and last tenth.\n\n"
        + table(
            ["state", "first tenth", "last tenth", "last / first", "p95", "state rows, most", "pairs", "gold check"],
            rows,
        )
    )


def final(results: Results) -> str:
    run = results["final.json"]
    rows = []
    for kind, figures in run["by_kind"].items():
        waited = figures["waited"] or {}
        rows.append(
            [
                kind,
                s(figures["median_batch_s"]),
                x(figures["median_over_inner"]),
                s(figures["p95_batch_s"]),
                n(figures["gold_rows"]),
                n(waited["rows"]) if waited else "—",
                f"{n(waited['arrivals_median'])} ({n(waited['arrivals_p95'])})" if waited else "—",
                f"{waited['batches_median']} ({waited['batches_p95']})" if waited else "—",
            ]
        )
    config = run["config"]
    return (
        f"The demo's orders and payments ({n(config['rows'])} each), and the same stream as trades and quotes for the "
        f"inner and as-of joins; window and lateness {config['window']}; median seconds a batch.\n\n"
        + table(
            [
                "join",
                "median batch",
                "× its inner join",
                "p95",
                "gold rows",
                "rows that wait",
                "their wait in arrivals, median (p95)",
                "in batches",
            ],
            rows,
        )
    )


def dq(results: Results) -> str:
    run = results["expectations_cost.json"]
    batch = run["median_batch_s"]
    return (
        "The demo's stream with every rule at its default policy and with none (a benchmark-only switch), rounds "
        "alternating.\n\n"
        + table(
            ["median batch with the rules", "without", "the rules add", "share of a batch"],
            [[s(batch["rules"]), s(batch["none"]), s(run["rules_s"]), f"{run['share']:.0%}"]],
        )
    )


def engines(results: Results) -> str:
    run = results["engines.json"]
    rows = [
        [
            name,
            s(figures["total_s"], 1),
            s(figures["ingest_p50_s"]),
            s(figures["batch_p50_s"]),
        ]
        for name, figures in run["engines"].items()
    ]
    rows.append(
        ["Delta on Spark / delta-rs", *(x(run["ratios"][key]) for key in ("total_s", "ingest_p50_s", "batch_p50_s"))]
    )
    return (
        "One stream replayed on each engine in one Spark session, rounds interleaved; same gold: "
        f"{'yes' if run['same_gold'] else 'NO'}.\n\n" + table(["engine", "a round", "an ingest", "a batch"], rows)
    )


def sources(results: Results) -> str:
    rows = []
    for file, label in (
        ("table_sources.json", "the demo's records"),
        ("table_sources_wide.json", "with ten more columns"),
    ):
        run = results[file]
        ways, ratios = run["ways"], run["ratios"]
        rows.append(
            [
                label,
                f"{s(ways['tables']['batch_p50_s'])} / {s(ways['files']['batch_p50_s'])} ({x(ratios['batch_p50_s'])})",
                f"{s(ways['tables']['ingest_p50_s'])} / {s(ways['files']['ingest_p50_s'])} ({x(ratios['ingest_p50_s'])})",
                f"{n(ways['tables']['bronze_bytes'])} / {n(ways['files']['bronze_bytes'])} ({x(ratios['bronze_bytes'])})",
            ]
        )
    return (
        "The same stream from files ingested into lakejoin's bronze and from Delta tables read in place (tables / "
        "files).\n\n" + table(["records", "a batch", "an ingest step", "bronze bytes"], rows)
    )


def commit(results: Results) -> str:
    run = results["delta_commit.json"]
    rows = [
        [label, s(run["appends"][key]["commit_p50_s"], 3), s(run["appends"][key]["checkpoint_commit_p50_s"])]
        for key, label in (
            ("with_txn", "with Delta's `txnAppId`/`txnVersion`"),
            ("without_txn", "without"),
            ("lakejoin", "as lakejoin writes it"),
        )
    ]
    config = run["config"]
    return (
        f"One row appended at a time, {config['rounds']} rounds of {config['commits']} commits, medians.\n\n"
        + table(["append", "a commit", "a commit writing a checkpoint"], rows)
    )


def memory(results: Results) -> str:
    rows = []
    for file in ("driver_memory_512m.json", "driver_memory_large_file_1g.json"):
        run = results[file]
        for phase, figures in run["phases"].items():
            what = f"a {n(run['file_mib'])} MiB file" if phase == "ingest" else f"{n(figures['pairs'])} pairs"
            rows.append(
                [
                    f"{phase}, {what}",
                    run["config"]["driver_memory"],
                    s(figures["seconds"], 1),
                    f"{figures['python_peak_mib']:.0f}",
                    f"{figures['jvm_peak_mib']:,.0f}",
                    figures["error"] or "done",
                ]
            )
    return "Each phase in a fresh process with a small driver, on Delta on Spark.\n\n" + table(
        ["phase", "`spark.driver.memory`", "seconds", "Python peak MiB", "JVM peak MiB", "result"], rows
    )


def demo(results: Results) -> str:
    run = results["demo.json"]
    return (
        f"`make demo` on {run['config']['engine']}, {run['config']['runs']} runs, each in a process of its own.\n\n"
        + table(
            ["", "median"],
            [["pipeline time", s(run["medians"]["pipeline_s"], 1)], ["wall time", s(run["medians"]["wall_s"], 1)]],
        )
    )


def suite(results: Results) -> str:
    run = results["suite.json"]
    rows = [[f"`{each['test']}`", s(each["seconds"], 1)] for each in run["slowest"][:5]]
    return (
        f"`make test` with Delta's jars: {run['passed']} passed, {run['failed']} failed, {run['skipped']} skipped in "
        f"{run['wall_min']:.1f} min. The slowest tests:\n\n" + table(["test", "seconds"], rows)
    )


@dataclass(frozen=True)
class Section:
    """One make target's run: its heading, what it measures (``benchmarks/<script>.py``), its files, its table."""

    title: str
    target: str
    script: str
    files: tuple[str, ...]
    render: Callable[[Results], str]


SECTIONS = (
    Section(
        "Micro-batches against Structured Streaming and Flink",
        "bench-peers",
        "peers",
        ("peers.json", "peers_spark.json"),
        peers,
    ),
    Section("Micro-batches with bounded state", "bench-peers-bounded", "peers", ("peers_bounded.json",), peers_bounded),
    Section(
        "A backlog in one scheduled run", "bench-backlog", "backlog", ("backlog.json", "backlog_spark.json"), backlog
    ),
    Section(
        "A batch of a few rows",
        "bench-small",
        "small",
        ("small.json", "small_spark.json", "small_spark_public_reader.json"),
        small,
    ),
    Section(
        "What a batch costs, counted",
        "bench-costs",
        "costs",
        ("costs.json", "costs_spark.json", "costs_spark_public_reader.json"),
        costs,
    ),
    Section(
        "Where a step's time goes",
        "bench-profile",
        "profile",
        ("profile.json", "profile_spark.json", "profile_spark_public_reader.json"),
        profile,
    ),
    Section("A batch after its history", "bench-history", "history", ("history.json", "history_spark.json"), history),
    Section("Change feeds", "bench-changes", "changes", ("changes.json", "changes-spark.json"), changes),
    Section("A relation that stops", "bench-idle", "idle", ("idle.json",), idle),
    Section("N relations", "bench-nway", "nway", ("nway.json",), nway),
    Section(
        "A command with and without `lakejoin serve`", "bench-cli", "cli", ("cli_deltars.json", "cli_spark.json"), cli
    ),
    Section("What a file and a batch cost", "bench-sizing", "sizing", ("sizing.json", "sizing_spark.json"), sizing),
    Section("A day's work, estimated", "sizing-day", "day", ("day.json",), day),
    Section(
        "Bounded state over a long stream",
        "bench-state",
        "bounded_state",
        ("bounded_state.json", "unbounded_state.json"),
        state,
    ),
    Section("Outer, semi, anti and as-of joins", "bench-final", "final", ("final.json",), final),
    Section("Data-quality rules", "bench-dq", "expectations_cost", ("expectations_cost.json",), dq),
    Section("The two engines", "bench-engines", "engines", ("engines.json",), engines),
    Section(
        "Delta tables read in place",
        "bench-sources",
        "table_sources",
        ("table_sources.json", "table_sources_wide.json"),
        sources,
    ),
    Section("Delta's cost per commit", "bench-commit", "delta_commit", ("delta_commit.json",), commit),
    Section(
        "Driver memory",
        "bench-memory",
        "driver_memory",
        ("driver_memory_512m.json", "driver_memory_large_file_1g.json"),
        memory,
    ),
    Section("The demo", "bench-demo", "demo", ("demo.json",), demo),
    Section("The test suite", "bench-suite", "suite", ("suite.json",), suite),
)


def code_commits_since(commit: str) -> int | None:
    """How many commits changed the measured code after ``commit`` (None when git does not know it)."""
    counted = subprocess.run(
        ["git", "rev-list", "--count", f"{commit}..HEAD", "--", *MEASURED_CODE],
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout.strip()
    return int(counted) if counted.isdigit() else None


def provenance(section: Section, results: Results, age: Callable[[str], int | None]) -> str:
    """Each file's commit, day, machine and rounds, and an age mark where the measured code moved past its commit."""
    lines = []
    for file in section.files:
        run = results[file]
        commit = str(run.get("commit", "unknown"))
        rounds = (run.get("config") or {}).get("rounds") or run.get("rounds")
        facts = [
            f"`{file}`: measured at {commit}",
            run.get("day"),
            run.get("machine"),
            rounds and f"{rounds} round{'s' if rounds != 1 else ''}",
        ]
        line = ", ".join(str(fact) for fact in facts if fact)
        if not re.fullmatch(r"[0-9a-f]{7,40}", commit):
            line += f" **not measured on committed code: run `make {section.target}` again**"
        elif behind := age(commit):
            line += f" **{behind} code commit{'s' if behind > 1 else ''} ago: run `make {section.target}` again**"
        lines.append(f"- {line}")
    return "\n".join(lines)


INTRO = """\
# Benchmarks

This page is generated: `make bench-report` renders it from the results files in `benchmarks/results/`, one table per
make target's run, and `tests/test_figures.py` fails when the page and the files disagree. Each table names the
commit, day and machine of its run; a table whose commit the measured code (`pipelines/`, `state/`, `expectations/`)
has moved past says so and names the target to run again. Timings on a two-core machine are noisy: compare the
systems within one table (one run, one sitting), not seconds across tables. What the figures mean for a deployment is
in [Sizing](sizing.md) and [Limits](limits.md); the measurements of earlier code are in the [Changelog](changelog.md).
"""


def load(files: list[str]) -> Results:
    results = {}
    for file in files:
        with open(os.path.join(RESULTS, file), encoding="utf-8") as handle:
            results[file] = json.load(handle)
    return results


def render(results: Results, age: Callable[[str], int | None] = code_commits_since) -> str:
    sections = [
        f"## {section.title} (`make {section.target}`)\n\n`benchmarks/{section.script}.py`. "
        + section.render(results)
        + "\n\n"
        + provenance(section, results, age)
        for section in SECTIONS
    ]
    return "\n\n".join([INTRO, *sections]) + "\n"


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    page = render(load([file for section in SECTIONS for file in section.files]))
    with open(PAGE, "w", encoding="utf-8") as handle:
        handle.write(page)
    print(
        f"{os.path.relpath(PAGE, ROOT)}: {len(page.encode()):,} bytes from {sum(len(each.files) for each in SECTIONS)} results files"
    )


if __name__ == "__main__":
    main()
