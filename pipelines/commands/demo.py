"""The main job: an out-of-order stream of orders and payments (or, with ``--relations 3`` or 4, of trades,
quotes, news and fills) ingested in chunks interleaved with silver runs, then checked.

This is what a scheduled deployment does — land files, run the joiner, repeat — compressed into one
process, followed by the check every user should be able to run: gold equals the batch SQL join.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame

from expectations.reconcile import BOOKKEEPING, check_gold
from pipelines.bronze.ingest import ingest_files
from pipelines.definition import record, settle
from pipelines.silver import run
from pipelines.spark import get_spark, stop_session
from state.config import Config
from state.engines import make_engine
from state.engines.jvm import classic_spark_running
from state.layout import Warehouse
from state.names import column

# The demo's pipeline: orders (R) and the payments (S) a customer makes within the hour after an order.
DEMO_SETTINGS: dict[str, object] = {
    "relations": {
        "r": {"id": "order_id", "event_time": "order_time"},
        "s": {"id": "payment_id", "event_time": "paid_at"},
    },
    "predicate": "r.customer = s.customer AND s.paid_at BETWEEN r.order_time AND r.order_time + INTERVAL 1 HOUR",
}
# With three or four relations: market events on one symbol within an hour of each other.
MARKET = {  # relation -> its id column, and a value column of its own with a base value
    "trades": ("trade_id", "price", 100.0),
    "quotes": ("quote_id", "bid", 99.5),
    "news": ("news_id", "sentiment", 0.0),
    "fills": ("fill_id", "quantity", 10.0),
}


def market_settings(relations: int) -> dict[str, object]:
    """The N-way demo's pipeline: every member on one symbol, every two within an hour."""
    names = list(MARKET)[:relations]
    return {
        "relations": {name: {"id": MARKET[name][0], "event_time": "t"} for name in names},
        "predicate": " AND ".join(f"{a}.symbol = {b}.symbol" for a, b in zip(names, names[1:])),
        "window": "1 hour",
        "allowed_lateness": "1 hour",
    }


def without_window(settings: dict[str, object]) -> dict[str, object]:
    """``settings`` for another bound: an as-of join takes a ``tolerance`` instead of a ``window``."""
    return {name: value for name, value in settings.items() if name != "window"}


DEMO_START = pd.Timestamp("2026-01-01T00:00:00Z")  # ts 0 of the generated stream; one ts unit is one second
SHOWN = (
    "r_order_id",
    "r_customer",
    "r_order_time",
    "r_amount",
    "s_payment_id",
    "s_paid_at",
    "s_amount",
    "s_method",
    "trades_trade_id",
    "trades_symbol",
    "trades_t",
    "quotes_quote_id",
    "quotes_t",
    "news_news_id",
    "news_t",
)


@dataclass(frozen=True)
class DemoOptions:
    rows: int = 20_000  # records per relation
    keys: int = 5_000
    skew: float = 0.5  # Zipf exponent of key popularity
    disorder: int = 2_000  # a record arrives up to this many ts units late
    chunk_rows: int = 4_000  # arrivals per landed chunk
    max_batch_rows: int = 2_000
    seed: int = 7
    relations: int = 2  # 2: orders and payments; 3 or 4: the market relations
    join: str = (
        "inner"  # or left | right | full | semi | anti (orders and payments), asof | asof_left (trades and quotes)
    )


def generate_stream(options: DemoOptions, relations: Sequence[str] = ("r", "s")) -> pd.DataFrame:
    """Every relation's records in arrival order: ``relation, id, ts, key, payload``.

    Event times are shared by the relations N at a time (so cross-relation ties occur), keys follow a Zipf
    law, and each record arrives up to ``disorder`` ts units after its event time.
    """
    rng = np.random.default_rng(options.seed)
    total = options.rows * len(relations)
    names = np.repeat(list(relations), options.rows)
    rng.shuffle(names)
    ts = np.arange(total) // len(relations)
    popularity = 1.0 / np.arange(1, options.keys + 1) ** options.skew
    keys = rng.choice(options.keys, size=total, p=popularity / popularity.sum())
    arrival = ts + rng.integers(0, options.disorder + 1, size=total)
    order = np.argsort(arrival, kind="stable")
    index = np.arange(total).astype(str)
    stream = pd.DataFrame(
        {
            "relation": names,
            "id": np.char.add(names, index),
            "ts": ts,
            "key": np.char.add("k", keys.astype(str)),
            "payload": np.char.add("payload-", index),
        }
    )
    return stream.iloc[order].reset_index(drop=True)


def orders_and_payments(records: pd.DataFrame, relation: str) -> pd.DataFrame:
    """A relation's records of the generated stream as orders (r) or payments (s): typed columns, an ISO-8601
    event time ``ts`` seconds after ``DEMO_START``, the key as the customer (``k7`` becomes ``c7``)."""
    number = _number(records)
    when = (DEMO_START + pd.to_timedelta(records["ts"], unit="s")).dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    amount = ((number * 7919) % 20_000 + 100) / 100
    customer = "c" + records["key"].str[1:]
    if relation == "r":
        return pd.DataFrame(
            {
                "order_id": "o-" + number.astype(str),
                "customer": customer,
                "order_time": when,
                "amount": amount,
                "items": number % 5 + 1,
                "channel": np.array(["web", "app", "store"])[number % 3],
            }
        )
    return pd.DataFrame(
        {
            "payment_id": "p-" + number.astype(str),
            "customer": customer,
            "paid_at": when,
            "amount": amount,
            "method": np.array(["card", "transfer"])[number % 2],
        }
    )


def market_events(records: pd.DataFrame, relation: str) -> pd.DataFrame:
    """A relation's records as market events: ``<name>_id``, the key as the ``symbol``, an ISO-8601 event time
    ``t`` and one value column of its own (``price``, ``bid``, …)."""
    number = _number(records)
    id_column, value, base = MARKET[relation]
    return pd.DataFrame(
        {
            id_column: relation[0] + "-" + number.astype(str),
            "symbol": "SYM" + records["key"].str[1:],
            "t": (DEMO_START + pd.to_timedelta(records["ts"], unit="s")).dt.strftime("%Y-%m-%dT%H:%M:%SZ"),
            value: base + (number % 100) / 10,
        }
    )


def _number(records: pd.DataFrame) -> pd.Series:
    """The generated record's number (its id is the relation's name followed by it)."""
    return records["id"].str.extract(r"(\d+)$")[0].astype(int)


def write_chunks(
    stream: pd.DataFrame, folder: str, chunk_rows: int, shape: Callable[[pd.DataFrame, str], pd.DataFrame] | None = None
) -> list[list[tuple[str, str]]]:
    """JSON Lines files, one per relation per chunk of consecutive arrivals: ``[[(relation, path), ...], ...]``.
    ``shape(records, relation)`` turns a relation's records into the rows written (as generated when None)."""
    relations = sorted(stream["relation"].unique())
    chunks = []
    for number, start in enumerate(range(0, len(stream), chunk_rows)):
        chunk = stream.iloc[start : start + chunk_rows]
        files = []
        for name in relations:
            part = chunk[chunk["relation"] == name].drop(columns="relation")
            part = part if shape is None else shape(part, name)
            if len(part):
                path = os.path.join(folder, f"chunk-{number:05d}-{name}.jsonl")
                part.to_json(path, orient="records", lines=True)
                files.append((name, path))
        chunks.append(files)
    return chunks


def run_demo(
    options: DemoOptions,
    given: Config | None = None,
    engine_name: str | None = None,
    warehouse_root: str | None = None,
    verbose: bool = False,
) -> bool:
    """Run the demo job, print its summary, a few gold rows and the gold check; True when gold passes. ``given``
    replaces the demo's own config (it must map the demo's columns: ``DEMO_SETTINGS``, or ``market_settings``)."""
    as_of = options.join.startswith("asof")  # trades take the latest quote
    market = options.relations > 2 or as_of
    own = market_settings(options.relations) if market else DEMO_SETTINGS
    if (
        options.join != "inner"
    ):  # a row waits for the other's watermark: lateness the stream's disorder, so none is late
        bound = "tolerance" if as_of else "window"  # the as-of join's: no quote older than that
        own = {
            **without_window(own),
            "join": options.join,
            bound: "1 hour",
            "allowed_lateness": f"{options.disorder} seconds",
        }
    config = (given or Config.of(**own)).with_overrides(engine=engine_name)
    workdir = tempfile.mkdtemp(prefix="lakejoin-demo-")
    warehouse = config.placed(Warehouse(warehouse_root or os.path.join(workdir, "warehouse")))
    names = [rel.name for rel in config.joined]
    what = (
        f"{options.rows} orders and {options.rows} payments, {options.keys} customers"
        if not market
        else (f"{options.rows} records each of {', '.join(names)}, {options.keys} symbols")
    )
    print(
        f"lakejoin demo: {what} (skew {options.skew}), "
        f"up to {options.disorder} s late, chunks of {options.chunk_rows}, batches of at most {options.max_batch_rows}"
    )
    print(f"warehouse: {warehouse.root}")
    bound = "tolerance" if config.join_kind.as_of else "window"
    reach = config.settings()[bound]
    print(f"predicate: {config.predicate}" + ("" if reach is None else f", {bound} {reach}"))
    if config.join != "inner":
        print(f"join: {config.join} (a row waits until the other relation's watermark makes it final)")
    stream = generate_stream(options, names)
    chunks = write_chunks(stream, workdir, options.chunk_rows, market_events if market else orders_and_payments)

    owned = not classic_spark_running()  # a session already running (a notebook's, the tests') is left running
    spark = get_spark(verbose=verbose)
    try:
        engine = make_engine(spark, config.engine)
        settled = settle(engine, warehouse, config, "demo")
        config = settled.config.with_overrides(max_batch_rows=options.max_batch_rows)
        print(f"engine: {engine.name}")
        started = time.perf_counter()
        batches = quarantined = late = 0
        failures: Counter[str] = Counter()
        by_name = {rel.name: rel for rel in warehouse.relations}
        for number, files in enumerate(chunks, start=1):
            landed = 0
            for name, path in files:
                (result,) = ingest_files(engine, warehouse, by_name[name], [path], config.relations)
                landed, quarantined = landed + result.landed, quarantined + result.quarantined
            reports = run(engine, warehouse, config)
            batches += len(reports)
            late += sum(sum(report.late.values()) for report in reports)
            failures.update(Counter({rule: rows for report in reports for rule, rows in report.rule_failures.items()}))
            pairs = sum(report.pairs for report in reports)
            print(
                f"[chunk {number}/{len(chunks)}] {landed} arrivals landed, {len(reports)} batches, {pairs} pairs "
                f"({time.perf_counter() - started:.1f} s)",
                flush=True,
            )
        seconds = time.perf_counter() - started

        arrivals = options.rows * len(names)
        check = check_gold(engine, warehouse, config)
        print(
            f"arrivals: {arrivals}  batches: {batches}  results: {check.actual}  quarantined: {quarantined}  late: "
            f"{late}"
        )
        print(f"seconds: {seconds:.1f}  rows per second: {arrivals / seconds:,.0f}")
        broken = (
            ", ".join(f"{rule}: {rows} rows" for rule, rows in sorted(failures.items()))
            or "every rule passed on every batch"
        )
        print(f"expectations: {broken}")
        record(engine, warehouse, settled)
        _show_gold(engine.read(warehouse.gold))
        print(check.describe())
        return check.passed
    finally:
        if owned:
            stop_session(spark)


def _show_gold(gold: DataFrame) -> None:
    """A few gold rows, the columns a reader of the demo cares about (with a ``select``, its columns)."""
    record_columns = [name for name in gold.columns if not name.startswith("_") and name not in (*BOOKKEEPING, "owner")]
    shown = [*([name for name in SHOWN if name in record_columns] or record_columns), "owner"]
    rows = gold.select(*[column(name) for name in shown]).orderBy(column(shown[0])).limit(3).collect()
    print(f"gold rows ({len(gold.columns)} columns; {', '.join(shown)}):")
    for row in rows:
        print("  " + "  ".join(str(value) for value in row))
