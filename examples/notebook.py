# Databricks notebook source
# MAGIC %md
# MAGIC # lakejoin in a notebook
# MAGIC
# MAGIC Orders and payments arrive out of order on two streams. Each stream lands its micro-batches in the warehouse's
# MAGIC bronze tables through `foreach_batch`; `run` joins what landed into gold, each payment with the orders of its
# MAGIC customer in the hour before it; `validate` checks every table.
# MAGIC
# MAGIC On Databricks: install the lakejoin wheel on the cluster (`databricks bundle deploy` builds it), import this
# MAGIC file as a notebook and set `ROOT` to a Volume path. Run as a script (`python examples/notebook.py`), it makes a
# MAGIC local session and a folder of its own.

# COMMAND ----------

import json
import os
import random
import tempfile

from pipelines import Pipeline

try:
    spark  # noqa: B018 - the notebook's session on Databricks
except NameError:  # run as a script: a local session
    from pipelines.spark import get_spark

    spark = get_spark()

ROOT = os.environ.get("LAKEJOIN_EXAMPLE_ROOT") or tempfile.mkdtemp(
    prefix="lakejoin-notebook-"
)  # e.g. /Volumes/main/lakejoin/example

# COMMAND ----------

# MAGIC %md
# MAGIC ## Raw arrivals
# MAGIC Two folders of JSON files, one per stream, their records in no order of event time. In production these are
# MAGIC where your streams come from: Auto Loader (`cloudFiles`), Kafka, a Delta table's change feed.

# COMMAND ----------

rng = random.Random(7)
customers = [f"c{i}" for i in range(20)]
orders = [
    {
        "order_id": f"o{i}",
        "customer": rng.choice(customers),
        "order_time": f"2026-03-01T09:{rng.randrange(60):02d}:00Z",
        "amount": rng.randrange(5, 500),
    }
    for i in range(60)
]
payments = [
    {
        "payment_id": f"p{i}",
        "customer": rng.choice(customers),
        "paid_at": f"2026-03-01T{rng.choice(['09', '10'])}:{rng.randrange(60):02d}:00Z",
    }
    for i in range(60)
]
for name, records in (("orders", orders), ("payments", payments)):
    folder = os.path.join(ROOT, "landing", name)
    os.makedirs(folder, exist_ok=True)
    for part in range(3):
        with open(os.path.join(folder, f"part-{part}.json"), "w", encoding="utf-8") as handle:
            handle.write("\n".join(json.dumps(record) for record in records[part::3]))

# COMMAND ----------

# MAGIC %md
# MAGIC ## The pipeline
# MAGIC The config is a mapping (or a YAML file's path). The first one a warehouse is given is recorded as its
# MAGIC definition; later calls may leave it out.

# COMMAND ----------

pipeline = Pipeline(
    os.path.join(ROOT, "warehouse"),
    config={
        "relations": {
            "orders": {"id": "order_id", "event_time": "order_time"},
            "payments": {"id": "payment_id", "event_time": "paid_at"},
        },
        "predicate": "orders.customer = payments.customer AND payments.paid_at >= orders.order_time",
        "window": "1 hour",
    },
    spark=spark,
)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Two streams feed it
# MAGIC Each query lands its micro-batches in its relation's bronze table exactly once: a micro-batch replayed after a
# MAGIC restart from the checkpoint adds nothing.

# COMMAND ----------

schemas = {
    "orders": "order_id STRING, customer STRING, order_time TIMESTAMP, amount INT",
    "payments": "payment_id STRING, customer STRING, paid_at TIMESTAMP",
}
queries = [
    spark.readStream.schema(schemas[name])
    .option("maxFilesPerTrigger", 1)
    .json(os.path.join(ROOT, "landing", name))
    .writeStream.foreachBatch(pipeline.foreach_batch(name))
    .option("checkpointLocation", os.path.join(ROOT, "checkpoints", name))
    .trigger(availableNow=True)
    .start()
    for name in ("orders", "payments")
]
for query in queries:
    query.awaitTermination()

# COMMAND ----------

# MAGIC %md
# MAGIC ## Join, look, validate

# COMMAND ----------

report = pipeline.run(max_batch_rows=40)
print(report.describe())

# COMMAND ----------

pipeline.table("gold").select(
    "orders_order_id", "payments_payment_id", "orders_customer", "orders_order_time", "payments_paid_at"
).orderBy("payments_payment_id").show(5, truncate=False)

# COMMAND ----------

audit = pipeline.validate()
print(audit.describe())
assert audit.success, audit.failures
