# Two commands matter on a fresh machine: `make demo` and `make test`.
# Both create .venv and install the exact pins of constraints.txt when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-unit dev lint bench clean

# uv installs the exact pins of constraints.txt in seconds (pip takes about a minute).
UV_VERSION := 0.13.9

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "uv==$(UV_VERSION)"
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/media-usage demo

# Every tier (unit, conformance, dagster, acceptance, deployment) on both dialects. Each test
# module runs on one worker, in order, so a module-scoped fixture is built once. The deployment
# tier (mostly waiting on real daemons, leases and run starts) takes one worker of its own from
# the start (tests/conftest.py), the other three run the rest (many of their tests wait on
# subprocesses, daemons and a browser, so four workers keep both cores busy).
test: $(STAMP)
	$(BIN)/pytest -n 4 --dist loadscope --durations=20

# The unit tier alone: no database, a few seconds.
test-unit: $(STAMP)
	$(BIN)/pytest tests/unit

# The UI on the demo's database and instance (.dagster_home), so the demo's runs are visible.
# The pid file (the shell execs `dg dev`, so it is dg's pid) tells `make demo` the instance is in
# use; once the process is gone the file is stale and ignored.
DEV_PORT ?= 3000
dev: $(STAMP)
	mkdir -p $(CURDIR)/.dagster_home && touch $(CURDIR)/.dagster_home/.media_usage_local_instance
	test -f $(CURDIR)/.dagster_home/dagster.yaml || printf 'telemetry:\n  enabled: false\n' > $(CURDIR)/.dagster_home/dagster.yaml
	. $(BIN)/activate && export DAGSTER_HOME=$${DAGSTER_HOME:-$(CURDIR)/.dagster_home} && \
		mkdir -p "$$DAGSTER_HOME" && \
		echo $$$$ > "$$DAGSTER_HOME/media_usage_dev.pid" && \
		exec dg dev --use-active-venv -w workspace.yaml -p $(DEV_PORT)

BENCH_ENTRIES ?= 5000
BENCH_TICK_ROWS ?= 1000000
BENCH_REPEAT ?= 3
BENCH_LARGE_POSTGRES ?= large-postgres
BENCH_LIVE ?= live
BENCH_GC_ROWS ?= 100000
BENCH_SOAK_MINUTES ?= 5
MEDIA_USAGE_BENCH_POSTGRES_URL ?= postgresql+psycopg://postgres@127.0.0.1:5432/test

# Every measurement in its own process, then one summary table with the targets: the six
# reconciliations (SQLite/PostgreSQL x driver/floor/Dagster) BENCH_REPEAT times in alternation,
# judged on their medians, each rate with project/floor beside it (the floor mode: plain bulk SQL
# and the rules' minimal bookkeeping, its end state checked equal to the driver's), 10x the entries, the drain with 2 workers
# on PostgreSQL against one, the work sensor's tick over BENCH_TICK_ROWS work rows, the projection
# GC draining a backlog of BENCH_GC_ROWS obsolete occurrence rows on both dialects, and the live
# latency of edits with a real daemon on both dialects; each Dagster-mode reconciliation beside
# its job's floor (the same graph with empty ops). BENCH_LARGE_POSTGRES=no-large-postgres skips
# the 10x run on PostgreSQL, BENCH_LIVE=no-live the live measurements. Last, a BENCH_SOAK_MINUTES
# soak of the production setup on PostgreSQL (0 skips it; `media-usage bench --workload soak
# --minutes 60` is the full one).
bench: $(STAMP)
	$(BIN)/python -m media_usage_orchestration.bench.suite --entries $(BENCH_ENTRIES) \
		--tick-rows $(BENCH_TICK_ROWS) --repeat $(BENCH_REPEAT) --$(BENCH_LARGE_POSTGRES) \
		--$(BENCH_LIVE) --gc-rows $(BENCH_GC_ROWS) --soak-minutes $(BENCH_SOAK_MINUTES) \
		--postgres-url '$(MEDIA_USAGE_BENCH_POSTGRES_URL)'

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .media_usage .pytest_cache
