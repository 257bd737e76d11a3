"""Delta on Spark (``delta-spark``): used where the session has Delta (Databricks, clusters with the jars).

Same contract as the delta-rs engine. Idempotency goes through Delta's own application transactions:
``txnAppId``/``txnVersion`` writer options for appends, and for MERGE the session confs
``spark.databricks.delta.write.txnAppId/txnVersion``, set right before and unset in ``finally``.
A table is a path or, in a Unity Catalog warehouse, a three-part name (``main.lakejoin.gold_join_results``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from state.engines.base import Data, Eviction, Merged, TableInfo, Txn, applied, match_condition
from state.layout import is_catalog_schema


def is_table_name(table: str) -> bool:
    """``catalog.schema.table`` (a Unity Catalog table), not a path."""
    return "/" not in table and is_catalog_schema(table.rpartition(".")[0])

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
AUTO_MERGE = "spark.databricks.delta.schema.autoMerge.enabled"
# Tables must stay writable by delta-rs too (DESIGN.md section 5): no deletion vectors.
NO_DELETION_VECTORS = "spark.databricks.delta.properties.defaults.enableDeletionVectors"


class SparkDeltaEngine:
    name = "spark"

    def __init__(self, spark: SparkSession) -> None:
        from delta.tables import DeltaTable

        self.spark = spark
        self._delta_table = DeltaTable
        spark.conf.set(NO_DELETION_VECTORS, "false")

    def _exists(self, table: str) -> bool:
        if is_table_name(table):
            return self.spark.catalog.tableExists(table)
        return self._delta_table.isDeltaTable(self.spark, table)

    def _handle(self, table: str):  # noqa: ANN202 - delta.tables.DeltaTable, imported lazily
        if is_table_name(table):
            return self._delta_table.forName(self.spark, table)
        return self._delta_table.forPath(self.spark, table)

    def version(self, path: str) -> int | None:
        if not self._exists(path):
            return None
        return int(self._handle(path).history(1).select("version").first()[0])

    def schema(self, path: str) -> StructType | None:
        if not self._exists(path):
            return None
        return self._handle(path).toDF().schema

    def read(self, path: str, version: int | None = None, where: str | None = None) -> DataFrame | None:
        if not self._exists(path):
            return None
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        df = reader.table(path) if is_table_name(path) else reader.load(path)
        return df if where is None else df.where(where)

    def rows(self, path: str, version: int | None = None, where: str | None = None) -> pa.Table | None:
        df = self.read(path, version, where)
        return None if df is None else df.toArrow()

    def max_value(self, path: str, column: str, version: int | None = None) -> int | None:
        df = self.read(path, version)
        if df is None:
            return None
        value = df.agg(F.max(column)).first()[0]
        return None if value is None else int(value)

    def info(self, path: str, app_id: str) -> TableInfo | None:
        version = self.version(path)
        return None if version is None else TableInfo(version, self.schema(path), self.txn_version(path, app_id))

    def txn_version(self, path: str, app_id: str) -> int | None:
        if not self._exists(path):
            return None
        jvm = self.spark._jvm  # type: ignore[union-attr]
        self._handle(path).toDF()  # brings the log's snapshot up to date
        location = self._handle(path).detail().select("location").first()[0] if is_table_name(path) else path
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self.spark._jsparkSession, location)
        recorded = log.unsafeVolatileSnapshot().transactions().get(app_id)
        return int(recorded.get()) if recorded.isDefined() else None

    def drop(self, path: str) -> None:
        if is_table_name(path):
            self.spark.sql(f"DROP TABLE IF EXISTS {path}")
            return
        jvm = self.spark._jvm  # type: ignore[union-attr]
        hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
        hadoop_path.getFileSystem(self.spark._jsc.hadoopConfiguration()).delete(hadoop_path, True)  # type: ignore[union-attr]
        jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()

    def _frame(self, df: Data) -> DataFrame:
        return df if isinstance(df, DataFrame) else self.spark.createDataFrame(df)

    def append(self, path: str, df: Data, txn: Txn | None = None) -> int | None:
        if applied(self, path, txn):
            return None
        writer = self._frame(df).write.format("delta").mode("append").option("mergeSchema", "true")
        if txn is not None:
            writer = writer.option("txnAppId", txn.app_id).option("txnVersion", txn.version)
        if is_table_name(path):
            writer.saveAsTable(path)
        else:
            writer.save(path)
        return int(self._last_metrics(path).get("numOutputRows", 0))

    def merge(
        self, path: str, df: Data, key: str, evict: Eviction | None = None, txn: Txn | None = None, aligned: str | None = None
    ) -> Merged | None:
        if not self._exists(path):
            written = self.append(path, df, txn)
            return None if written is None else Merged(written, 0)
        if applied(self, path, txn):
            return None
        confs = {AUTO_MERGE: "true"}
        if txn is not None:
            confs |= {TXN_APP_ID: txn.app_id, TXN_VERSION: str(txn.version)}
        merger = (
            self._handle(path)
            .alias("target")
            .merge(self._frame(df).alias("source"), match_condition(key, df, aligned))
            .whenNotMatchedInsertAll()
        )
        if evict is not None:
            merger = merger.whenNotMatchedBySourceDelete(evict.sql("target"))
        with self._session_confs(confs):
            merger.execute()
        metrics = self._last_metrics(path)
        return Merged(int(metrics.get("numTargetRowsInserted", 0)), int(metrics.get("numTargetRowsDeleted", 0)))

    def _last_metrics(self, path: str) -> dict[str, str]:
        """The operation metrics (row counts) of the table's latest commit."""
        return self._handle(path).history(1).select("operationMetrics").first()[0] or {}

    def optimize(self, path: str, order_by: str | None = None) -> None:
        if not self._exists(path):
            return
        optimizer = self._handle(path).optimize()
        optimizer.executeZOrderBy(order_by) if order_by else optimizer.executeCompaction()

    def vacuum(self, path: str, retention_hours: int) -> None:
        if self._exists(path):
            self._handle(path).vacuum(retention_hours)

    @contextmanager
    def _session_confs(self, confs: dict[str, str]) -> Iterator[None]:
        try:
            for name, value in confs.items():
                self.spark.conf.set(name, value)
            yield
        finally:
            for name in confs:
                self.spark.conf.unset(name)
