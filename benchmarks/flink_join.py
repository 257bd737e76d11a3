"""The Flink row of benchmarks/peers.py: streaming regular inner joins of two folders of JSON Lines files, in PyFlink.

Runs in its own virtualenv (``make .venv-flink/.installed``: apache-flink pins pyarrow, pandas and numpy apart from
the project's), so it imports only the standard library and pyflink. One process serves many jobs, as the other
systems share one Spark session: it starts the JVM, answers ``{"ready": true}``, then runs one job per request line
on stdin and answers each with its timings, one JSON line per job on stdout. The first job in a JVM plans and runs
about three times slower than the next ones (class loading, JIT), which a warm-up job absorbs.

A job reads each relation from ``inputs/<relation>/`` with the filesystem connector, bounded, in streaming mode (the
job ends when both folders are read); joins them on the predicate, state in RocksDB, exactly-once checkpoints; and
writes what lakejoin's gold holds of each pair (both records' columns, prefixed by relation, and the owner) as JSON
Lines files under ``output`` (the wheel has no Delta connector), committed by the checkpoints (the last one once
the input is read). Without ``--watermark`` the join is a regular inner join, which keeps every record: the predicate
need not bound time. With ``--watermark COLUMN SOURCE DELAY`` each relation has a rowtime attribute COLUMN (its
bigint SOURCE, epoch seconds, as a TIMESTAMP_LTZ(3)) watermarked DELAY seconds behind the newest seen; a predicate
bounding the two COLUMNs from each other (``s.COLUMN BETWEEN r.COLUMN - INTERVAL … AND r.COLUMN + INTERVAL …``)
makes it an interval join, which evicts what the watermark has passed from its state (a record arriving behind the
watermark joins only what is left).

Timings: ``total_s``, from submitting the INSERT to the job's end (planning, the per-job mini-cluster's start, the
run, its final checkpoint); ``net_s``, the run alone as the JobManager measures it. Per-micro-batch times are not
measured: the source reads the files as one bounded stream, with no boundary between batches that Flink reports.

    printf '{"inputs": "in", "output": "out", "workdir": "work"}\\n' | .venv-flink/bin/python benchmarks/flink_join.py \\
        --predicate 'r.key = s.key' --schema 'id string, ts bigint, key string, payload string' --relations r s \\
        [--watermark ts_t ts 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import TextIO

# Two task slots on a two-core machine, as the Spark session's local[2]; the join is hash-partitioned by key.
PARALLELISM = 2
# Short: the job ends only once a checkpoint after the end of input has committed the sink's files.
CHECKPOINT_INTERVAL = "1 s"


def quoted(predicate: str, relations: list[str]) -> str:
    """``predicate`` (Spark SQL over the relations' aliases) with each ``alias.column`` quoted, as Flink SQL needs for
    a column named like one of its reserved words (``key``); the functions and operators a join condition uses
    (``=``, ``abs``, ``AND``, arithmetic) read the same in both."""
    aliases = "|".join(re.escape(name) for name in relations)
    return re.sub(rf"\b({aliases})\.([A-Za-z_]\w*)\b", r"\1.`\2`", predicate)


def columns(schema: str, watermark: tuple[str, str, int] | None) -> str:
    """A Spark DDL schema (``id string, ts bigint``) as Flink DDL columns, names quoted; with ``watermark``
    (column, source, delay), the rowtime column computed from the epoch seconds of source, and its watermark."""
    given = [f"`{name}` {kind}" for name, kind in (column.split(None, 1) for column in schema.split(","))]
    if watermark is None:
        return ", ".join(given)
    rowtime, source, delay = watermark
    return ", ".join(
        [
            *given,
            f"`{rowtime}` AS TO_TIMESTAMP_LTZ(`{source}`, 0)",
            f"WATERMARK FOR `{rowtime}` AS `{rowtime}` - {interval(delay)}",
        ]
    )


def gold(schema: str, relations: list[str]) -> tuple[str, str]:
    """What lakejoin's gold holds of a pair, as Flink DDL columns and the SELECT list computing them: both records'
    columns, prefixed by relation (``r_id``), and the owner, the upper-cased relation of the older record (the first
    relation wins ties)."""
    given = [column.split(None, 1) for column in schema.split(",")]
    prefixed = [(f"{name}_{column}", kind, f"`{name}`.`{column}`") for name in relations for column, kind in given]
    r, s = relations
    owner = f"CASE WHEN `{r}`.`ts` <= `{s}`.`ts` THEN '{r.upper()}' ELSE '{s.upper()}' END"
    ddl = ", ".join([*(f"`{name}` {kind}" for name, kind, _ in prefixed), "`owner` STRING"])
    select = ", ".join([*(f"{value} AS `{name}`" for name, _, value in prefixed), f"{owner} AS `owner`"])
    return ddl, select


def interval(seconds: int) -> str:
    """``seconds`` as an interval literal Flink SQL and Spark SQL both read: DAY TO SECOND, as Flink's SECOND takes
    two digits at most (``INTERVAL '2000' SECOND`` exceeds the precision of SECOND(2))."""
    minutes, second = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    days, hour = divmod(hours, 24)
    return f"INTERVAL '{days} {hour:02d}:{minute:02d}:{second:02d}' DAY TO SECOND"


def uri(path: str) -> str:
    return "file://" + os.path.abspath(path)


def join(
    inputs: str,
    output: str,
    workdir: str,
    predicate: str,
    schema: str,
    relations: list[str],
    watermark: tuple[str, str, int] | None,
) -> dict[str, float]:
    """Runs the join of ``inputs`` into ``output`` to its end (checkpoints under ``workdir``); its timings in seconds."""
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    config = Configuration()
    config.set_string("parallelism.default", str(PARALLELISM))
    config.set_string("state.backend.type", "rocksdb")
    config.set_string(
        "execution.checkpointing.incremental", "true"
    )  # new SST files only, as Spark's RocksDB store uploads
    config.set_string("execution.checkpointing.dir", uri(os.path.join(workdir, "checkpoints")))
    config.set_string("execution.checkpointing.mode", "EXACTLY_ONCE")
    config.set_string("execution.checkpointing.interval", CHECKPOINT_INTERVAL)
    tables = TableEnvironment.create(
        EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(config).build()
    )
    for name in relations:
        source = uri(os.path.join(inputs, name))
        tables.execute_sql(
            f"CREATE TABLE `{name}` ({columns(schema, watermark)}) WITH ('connector' = 'filesystem', 'path' = '{source}', 'format' = 'json')"
        )
    written, values = gold(schema, relations)
    tables.execute_sql(
        f"CREATE TABLE pairs ({written}) WITH ('connector' = 'filesystem', 'path' = '{uri(output)}', 'format' = 'json')"
    )
    r, s = relations
    submitted = time.perf_counter()
    result = tables.execute_sql(
        f"INSERT INTO pairs SELECT {values} FROM `{r}` JOIN `{s}` ON {quoted(predicate, relations)}"
    )
    result.wait()
    total = time.perf_counter() - submitted
    net = result.get_job_client().get_job_execution_result().result().get_net_runtime() / 1000
    return {"total_s": total, "net_s": net}


def answer(replies: TextIO, message: dict) -> None:
    replies.write(json.dumps(message) + "\n")
    replies.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--predicate", required=True, help="the join predicate, Spark SQL over the relations' names")
    parser.add_argument("--schema", required=True, help="every relation's columns, Spark DDL")
    parser.add_argument("--relations", nargs=2, default=["r", "s"])
    parser.add_argument(
        "--watermark",
        nargs=3,
        metavar=("COLUMN", "SOURCE", "DELAY"),
        help="a rowtime attribute COLUMN, the bigint SOURCE as epoch seconds, watermarked DELAY seconds behind",
    )
    args = parser.parse_args()
    watermark = None if args.watermark is None else (args.watermark[0], args.watermark[1], int(args.watermark[2]))
    # The JVM inherits this process's stdout: the replies keep the pipe, anything else goes to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    from pyflink.java_gateway import get_gateway

    get_gateway()
    answer(replies, {"ready": True})
    for line in sys.stdin:
        job = json.loads(line)
        answer(
            replies,
            join(job["inputs"], job["output"], job["workdir"], args.predicate, args.schema, args.relations, watermark),
        )


if __name__ == "__main__":
    main()
