# The two commands of the README: `make demo` and `make test`. Each creates .venv with the pinned
# versions on first use (Python 3.11 and Java 17+ must be on the PATH), then runs.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed
# Flink for bench-peers, in a virtualenv of its own: apache-flink pins pyarrow, pandas and numpy apart from the project
FLINK_VENV := .venv-flink
FLINK_STAMP := $(FLINK_VENV)/.installed
# The client serverless environment 5 ships (Python 3.12, Databricks Connect 18: Spark 4.1), for the on-demand
# emulation of serverless (tests/test_where_spark_runs.py); it replaces pyspark, so it has a virtualenv of its own
# (a pyenv-installed 3.12 when there is one: its shim answers only where pyenv selects it)
SERVERLESS_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
SERVERLESS_VENV := .venv-serverless
SERVERLESS_STAMP := $(SERVERLESS_VENV)/.installed
DATABRICKS_CONNECT := databricks-connect==18.3.7

.PHONY: demo test bench-state bench-dq bench-peers bench-peers-bounded bench-engines bench-memory bench-commit bench-sources bench-nway bench-final bench-cli bench-changes bench-idle bench-sizing bench-backlog bench-history bench-small bench-costs bench-profile bench-demo sizing-day bench-suite bench-report

$(STAMP): pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11 is required: install it, or pass PYTHON=/path/to/python3.11"; exit 1; }
	@command -v java >/dev/null || { echo "Java 17+ is required by Spark: install openjdk-17-jre-headless"; exit 1; }
	@java_major=$$(java -version 2>&1 | sed -n 's/.* version "\([0-9]*\).*/\1/p' | head -1); [ "$${java_major:-0}" -ge 17 ] || \
		{ echo "Java 17+ is required by Spark 4, found: $$(java -version 2>&1 | head -1); install openjdk-17-jre-headless"; exit 1; }
	@echo "lakejoin: creating $(VENV) with the pinned versions (once; a few minutes)"
	@# pip -qq: errors only (its warnings are about this machine's pip settings, not lakejoin)
	@$(PYTHON) -m venv $(VENV)
	@$(VENV)/bin/pip install --quiet --quiet --upgrade pip
	@$(VENV)/bin/pip install --quiet --quiet --constraint constraints.txt --editable '.[local,test,bench]'
	@touch $(STAMP)

$(FLINK_STAMP):
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11 is required: install it, or pass PYTHON=/path/to/python3.11"; exit 1; }
	$(PYTHON) -m venv $(FLINK_VENV)
	$(FLINK_VENV)/bin/pip install --quiet apache-flink==2.3.0
	touch $(FLINK_STAMP)

$(SERVERLESS_STAMP): pyproject.toml constraints.txt
	@$(SERVERLESS_PYTHON) --version >/dev/null 2>&1 || { echo "Python 3.12 is required by Databricks Connect 18: install it, or pass SERVERLESS_PYTHON=/path/to/python3.12"; exit 1; }
	@$(SERVERLESS_PYTHON) -m venv $(SERVERLESS_VENV)
	@$(SERVERLESS_VENV)/bin/pip install --quiet --quiet --constraint constraints.txt $(DATABRICKS_CONNECT) --editable . \
		pytest==9.0.3 hypothesis==6.155.2
	@touch $(SERVERLESS_STAMP)

demo: $(STAMP)
	$(VENV)/bin/lakejoin demo

# Two workers: most of a test's time is Spark's and Delta's latency (job scheduling, log reads, JVM starts),
# which a second worker overlaps on two cores.
test: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 --dist worksteal --durations=30

# Bounded state, then the same stream with unbounded state
bench-state: $(STAMP)
	$(VENV)/bin/python -m benchmarks.bounded_state
	$(VENV)/bin/python -m benchmarks.bounded_state --unbounded --out benchmarks/results/unbounded_state.json

bench-dq: $(STAMP)
	$(VENV)/bin/python -m benchmarks.expectations_cost

# lakejoin against Structured Streaming and Flink on one stream, 3 rounds each, medians: lakejoin on delta-rs, then on
# Delta on Spark when LAKEJOIN_DELTA_JARS names Delta's jars (which also adds the Delta-table stream)
PEERS = $(VENV)/bin/python -m benchmarks.peers
bench-peers: $(STAMP) $(FLINK_STAMP)
	$(PEERS) --recompute
	if [ -n "$$LAKEJOIN_DELTA_JARS" ]; then $(PEERS) --engine spark --out benchmarks/results/peers_spark.json; \
	else echo "bench-peers: lakejoin on Delta on Spark skipped: set LAKEJOIN_DELTA_JARS to a folder of Delta's JVM jars"; fi

# The same with bounded state for every system, lakejoin on delta-rs (--engine spark runs it on Delta on Spark)
bench-peers-bounded: $(STAMP) $(FLINK_STAMP)
	$(PEERS) --bounded

bench-engines: $(STAMP)
	$(VENV)/bin/python -m benchmarks.engines

# The demo's narrow records in 3 rounds, then records with ten more text columns in one
bench-sources: $(STAMP)
	$(VENV)/bin/python -m benchmarks.table_sources
	$(VENV)/bin/python -m benchmarks.table_sources --extra-columns 10 --rounds 1 --out benchmarks/results/table_sources_wide.json

# A 317 MiB file with a 512 MiB driver, then a 1,198 MiB file with a 1 GiB driver (both need LAKEJOIN_DELTA_JARS)
bench-memory: $(STAMP)
	$(VENV)/bin/python -m benchmarks.driver_memory --driver-memory 512m --out benchmarks/results/driver_memory_512m.json
	$(VENV)/bin/python -m benchmarks.driver_memory --rows 7500000 --driver-memory 1g --out benchmarks/results/driver_memory_large_file_1g.json

bench-nway: $(STAMP)
	$(VENV)/bin/python -m benchmarks.nway

bench-final: $(STAMP)
	$(VENV)/bin/python -m benchmarks.final

# A command's cost with and without lakejoin serve, beside the Python API in a warm session: delta-rs, then Delta on
# Spark when LAKEJOIN_DELTA_JARS names Delta's jars
bench-cli: $(STAMP)
	env -u LAKEJOIN_DELTA_JARS $(VENV)/bin/python -m benchmarks.cli
	if [ -n "$$LAKEJOIN_DELTA_JARS" ]; then $(VENV)/bin/python -m benchmarks.cli; \
	else echo "bench-cli: Delta on Spark skipped: set LAKEJOIN_DELTA_JARS to a folder of Delta's JVM jars"; fi

bench-commit: $(STAMP)
	$(VENV)/bin/python -m benchmarks.delta_commit

# delta-rs, then Delta on Spark when LAKEJOIN_DELTA_JARS names Delta's jars
bench-changes: $(STAMP)
	env -u LAKEJOIN_DELTA_JARS $(VENV)/bin/python -m benchmarks.changes
	if [ -n "$$LAKEJOIN_DELTA_JARS" ]; then $(VENV)/bin/python -m benchmarks.changes --engine spark --out benchmarks/results/changes-spark.json; \
	else echo "bench-changes: Delta on Spark skipped: set LAKEJOIN_DELTA_JARS to a folder of Delta's JVM jars"; fi

bench-idle: $(STAMP)
	$(VENV)/bin/python -m benchmarks.idle

# One engine per process: delta-rs without Delta's jars, then Delta on Spark when LAKEJOIN_DELTA_JARS names them
bench-sizing: $(STAMP)
	env -u LAKEJOIN_DELTA_JARS $(VENV)/bin/python -m benchmarks.sizing
	if [ -n "$$LAKEJOIN_DELTA_JARS" ]; then $(VENV)/bin/python -m benchmarks.sizing --engine spark; \
	else echo "bench-sizing: Delta on Spark skipped: set LAKEJOIN_DELTA_JARS to a folder of Delta's JVM jars"; fi

# A day's backlog drained by one scheduled run, against Structured Streaming, 3 rounds each, medians: delta-rs, then Delta
# on Spark when LAKEJOIN_DELTA_JARS names Delta's jars. ROUTE=ingest gives lakejoin the files through ingest, then runs;
# BATCH=all (or a number) sets lakejoin's max_batch_rows instead of its default. A variant writes to
# benchmarks/experiments/, never over the run docs/benchmarks.md shows.
BACKLOG = $(VENV)/bin/python -m benchmarks.backlog $(if $(ROUTE),--route $(ROUTE)) $(if $(BATCH),--max-batch-rows $(BATCH))
bench-backlog: $(STAMP)
	env -u LAKEJOIN_DELTA_JARS $(BACKLOG)
	if [ -n "$$LAKEJOIN_DELTA_JARS" ]; then $(BACKLOG) --engine spark; \
	else echo "bench-backlog: Delta on Spark skipped: set LAKEJOIN_DELTA_JARS to a folder of Delta's JVM jars"; fi

# The same batch on an empty warehouse and after ten times its rows joined: delta-rs, then Delta on Spark when
# LAKEJOIN_DELTA_JARS names Delta's jars
bench-history: $(STAMP)
	env -u LAKEJOIN_DELTA_JARS $(VENV)/bin/python -m benchmarks.history
	if [ -n "$$LAKEJOIN_DELTA_JARS" ]; then $(VENV)/bin/python -m benchmarks.history --engine spark; \
	else echo "bench-history: Delta on Spark skipped: set LAKEJOIN_DELTA_JARS to a folder of Delta's JVM jars"; fi

# A batch of a few rows (a scheduled run finding 2 records per relation; the suite's batches of 8), beside the same work
# by hand: delta-rs, then Delta on Spark when LAKEJOIN_DELTA_JARS names Delta's jars
bench-small: $(STAMP)
	env -u LAKEJOIN_DELTA_JARS $(VENV)/bin/python -m benchmarks.small
	if [ -n "$$LAKEJOIN_DELTA_JARS" ]; then $(VENV)/bin/python -m benchmarks.small --engine spark && \
		$(VENV)/bin/python -m benchmarks.small --engine spark --log-reader public --out benchmarks/results/small_spark_public_reader.json; \
	else echo "bench-small: Delta on Spark skipped: set LAKEJOIN_DELTA_JARS to a folder of Delta's JVM jars"; fi

# What each step of a few-row cycle costs in Spark jobs, calls to the JVM and commits, beside the same work by hand:
# delta-rs, then Delta on Spark when LAKEJOIN_DELTA_JARS names Delta's jars (tests/test_costs.py holds the budgets)
bench-costs: $(STAMP)
	env -u LAKEJOIN_DELTA_JARS $(VENV)/bin/python -m benchmarks.costs
	if [ -n "$$LAKEJOIN_DELTA_JARS" ]; then $(VENV)/bin/python -m benchmarks.costs --engine spark && \
		$(VENV)/bin/python -m benchmarks.costs --engine spark --log-reader public --out benchmarks/results/costs_spark_public_reader.json; \
	else echo "bench-costs: Delta on Spark skipped: set LAKEJOIN_DELTA_JARS to a folder of Delta's JVM jars"; fi

# Where a step's time goes: its seconds, Spark jobs and driver collects, each named by the line that asked for it
bench-profile: $(STAMP)
	env -u LAKEJOIN_DELTA_JARS $(VENV)/bin/python -m benchmarks.profile
	if [ -n "$$LAKEJOIN_DELTA_JARS" ]; then $(VENV)/bin/python -m benchmarks.profile --engine spark && \
		$(VENV)/bin/python -m benchmarks.profile --engine spark --log-reader public --out benchmarks/results/profile_spark_public_reader.json; \
	else echo "bench-profile: Delta on Spark skipped: set LAKEJOIN_DELTA_JARS to a folder of Delta's JVM jars"; fi

# What `make test` costs (its wall time, the ten slowest tests); LOG=FILE reads a finished run's output instead
bench-suite: $(STAMP)
	$(VENV)/bin/python -m benchmarks.suite $(if $(LOG),--log $(LOG))

# The sizing page's worked day, estimated from bench-small's and bench-backlog's results (run those first); no Spark
sizing-day: $(STAMP)
	$(VENV)/bin/python -m benchmarks.day

# What `make demo` costs, 3 runs each in a process of its own: delta-rs (the demo's engine on a fresh machine)
bench-demo: $(STAMP)
	env -u LAKEJOIN_DELTA_JARS $(VENV)/bin/python -m benchmarks.demo

# docs/benchmarks.md from the results files, each table with its run's commit, day and machine and an age mark where
# the measured code has moved past it (tests/test_figures.py fails when the page and the files disagree); no Spark
bench-report:
	$(PYTHON) -m benchmarks.page
