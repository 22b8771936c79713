# TxSync developer commands. Every target creates what it needs (.venv, .tools) itself.
#   make run         the main job (see README)
#   make test        everything CI checks: lint, types, fresh generated code, all tests
#   make test-quick  the tests without the slow sweeps
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
BUF_VERSION := 1.75.0
BUF := .tools/node_modules/.bin/buf
PREVIOUS_RELEASE := $(shell sed -n 's/^previous-release-commit = "\([0-9a-f]*\)"/\1/p' pyproject.toml)

.PHONY: help venv system-packages run sim-demo test test-quick test-pipeline-oldest lint proto proto-check sim nemesis image spark-image pipeline-archive pipeline-demo bench bench-rpcs bench-messages bench-waits bench-store bench-agreement bench-protocol bench-breakdown bench-apply bench-apply-cost bench-rotation bench-rotation-memory bench-verify bench-startup bench-records bench-client bench-soak dashboard clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

venv: $(INSTALLED)  ## create .venv with the project and its dev tools

$(INSTALLED): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[server,dev]'
	@# Bytecode once, here: where PYTHONDONTWRITEBYTECODE is set, every service start
	@# would otherwise compile its imports anew.
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib >/dev/null || true
	@touch $@

$(BUF):
	npm install --silent --no-audit --no-fund --prefix .tools @bufbuild/buf@$(BUF_VERSION)

run: venv  ## the main job: a local 3-DC cluster of real processes (Ctrl-C stops it)
	$(BIN)/txsync dev up --data data $(ARGS)

sim-demo: venv  ## the protocol core on a simulated 3-DC cluster, through every fault mix
	$(BIN)/txsync sim --nodes 3 --seeds 200

sim: venv  ## the protocol's acceptance sweep: 2000 seeds, 5 nodes, every fault
	$(BIN)/txsync sim --seeds 2000 --nodes 5 --faults delay,drop,duplicate,reorder,partition,flap,crash,membership

nemesis: venv  ## faults under load on real processes for 10 min (TXSYNC_NEMESIS_SEED=N to replay)
	TXSYNC_NEMESIS_S=$${TXSYNC_NEMESIS_S:-600} $(BIN)/python -m pytest -s tests/nemesis

proto: venv  ## regenerate services/txsync/v1 from proto/
	$(BIN)/python scripts/gen_proto.py

proto-check: venv  ## fail if the committed generated code is stale
	$(BIN)/python scripts/gen_proto.py --check

lint: venv $(BUF)  ## ruff, ruff format, mypy --strict, buf lint, buf breaking (previous release)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BUF) lint
	$(BUF) breaking --against ".git#ref=$(PREVIOUS_RELEASE),depth=$$(git rev-list --count HEAD)"

system-packages:  ## Debian packages the tests run (PostgreSQL, Docker, etcd, Galera...), installed if missing
	scripts/ensure_system_packages.sh
	scripts/ensure_docker.sh

# Two pytest-xdist workers: most tests wait on processes they started (one worker kept
# 0.7 of the 2 cores busy), and the suite must hold on a loaded machine anyway. Each
# module is one unit of work, and the Docker and Spark tests together are one more
# (tests/conftest.py says why). TEST_WORKERS=0 runs everything in one process.
# The 40 slowest tests are listed at the end: CI has 45 minutes for the suite.
TEST_WORKERS ?= 2

test: lint proto-check system-packages  ## everything CI checks
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=40
	$(MAKE) test-pipeline-oldest

# The pipeline supports PySpark 3.5 and 4.x: its tests run on the newest in .venv (with
# everything else) and again here on the oldest. numpy and pyarrow below 2 and 20 only
# for pyspark.testing, whose 3.5 still calls numpy 1's API (the jobs do not import it).
OLDEST := .venv-pyspark-oldest
OLDEST_PACKAGES := 'pyspark>=3.5,<3.6' 'numpy<2' 'pyarrow<20' 'pandas>=2.2,<3' \
	'matplotlib>=3.8' 'pytest>=9' 'pytest-timeout>=2.4' 'hypothesis>=6.150' 'cryptography>=46'

$(OLDEST)/.installed: pyproject.toml Makefile
	@test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST)/bin/python -m pip install --quiet -e '.[server]' $(OLDEST_PACKAGES)
	@touch $@

test-pipeline-oldest: $(OLDEST)/.installed system-packages  ## the pipeline's tests on the oldest PySpark supported (3.5)
	$(OLDEST)/bin/python -c 'import pyspark; print("pipeline tests on PySpark", pyspark.__version__)'
	$(OLDEST)/bin/python -m pytest --durations=10 tests/pipeline --ignore=tests/pipeline/test_spark_clusters.py \
		--deselect tests/pipeline/test_load.py::test_a_hundred_thousand_rows_load_once_and_resume

test-quick: venv system-packages  ## the tests without the slow ones and without Docker
	$(BIN)/python -m pytest -m "not slow and not docker"

image: venv  ## the container image txsync:dev, built offline (debootstrap base, host wheels)
	scripts/build_image.sh txsync:dev

spark-image: venv  ## the pipeline's Spark image txsync-spark:dev (k8s/spark), built offline
	DOCKERFILE=k8s/spark/Dockerfile EXTRAS=server,pipeline scripts/build_image.sh txsync-spark:dev

pipeline-archive: venv  ## build/txsync-pipeline-env.tar.gz: Spark executors' Python (--archives ...#env)
	$(BIN)/python scripts/pipeline_archive.py $(ARGS)

pipeline-demo: venv  ## every Spark job on a live local cluster; prints where the report is
	scripts/pipeline_demo.sh

bench: venv  ## TxSync beside etcd and Galera at 0/10/50 ms RTT, then scaling: docs/benchmarks.md
	scripts/ensure_system_packages.sh
	$(BIN)/python -m bench.suite

dashboard: venv  ## the chart's Grafana dashboard drawn from Prometheus over a loaded dev cluster
	scripts/ensure_system_packages.sh
	$(BIN)/python -m bench.dashboard

bench-rpcs: venv  ## work per transaction by service: gRPC messages, fsyncs, log entries, CPU
	$(BIN)/python -m bench.rpc_counts

bench-messages: venv  ## CPU of one gRPC message, one unary call, one thread hop, one fsync
	$(BIN)/python -m bench.message_cost

bench-waits: venv  ## CPU of a submit's wait in the store: each on its own, or a batch as one
	$(BIN)/python -m bench.wait_cost

bench-store: venv  ## submit throughput and latency of one transaction-store, fsync on
	$(BIN)/python -m bench.store_bench

bench-agreement: venv  ## submit -> ACCEPTED at all of 3 DCs, at 0, 10 and 50 ms RTT
	$(BIN)/python -m bench.agreement_bench

bench-protocol: venv  ## the cores alone (no processing, no disk): latency in round trips
	$(BIN)/python -m bench.protocol_model

bench-breakdown: venv  ## where a transaction's time goes, hop by hop, from a loaded cluster's txlogs
	$(BIN)/python -m bench.latency_breakdown

bench-apply: venv  ## one DC applying with 1, 2 and 4 SQLite workers: applied/s and latency
	$(BIN)/python -m bench.apply_bench

bench-apply-cost: venv  ## CPU per transaction of one SQLite worker's apply, in-process
	$(BIN)/python -m bench.apply_cost

bench-rotation: venv  ## what a txlog rotation costs one store's submits at a steady rate
	$(BIN)/python -m bench.rotation_stall

bench-rotation-memory: venv  ## what txlog rotations leave in one store's RSS, at rest (6,000 kept)
	$(BIN)/python -m bench.rotation_memory

bench-records: venv  ## bytes and copy-out CPU of a store's records (DATA=<a store's --data dir>)
	$(BIN)/python -m bench.record_cost $(DATA)

bench-client: venv  ## the client library: 48 concurrent callers, batching on and off
	$(BIN)/python -m bench.client_bench

bench-startup: venv  ## txsync --help, each service exec -> SERVING, dev up -> cluster.json
	$(BIN)/python -m bench.startup_bench

bench-soak: venv  ## 1M transactions of history, then 10 min steady: RSS, disk, p99, restarts
	$(BIN)/python -m bench.soak

bench-verify: venv  ## verify-replicas on 3 DCs x 2 workers x 1M rows, local Spark
	$(BIN)/python -m bench.verify_bench

clean:  ## remove the environments and caches
	rm -rf $(VENV) $(OLDEST) .tools .mypy_cache .ruff_cache .pytest_cache .hypothesis
