# The two commands of the README:  `make demo`  and  `make test`.
# Both create .venv and install the project (with its dev, test and bench extras) and the light device SDK
# (clients/python) on first use, with uv (a third of pip's time: 19 s against 51 s on the 2-core machine; the bytecode
# compiled at install, as pip does); the JavaScript client's tests install Node and its packages themselves.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml clients/python/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode -e ".[dev,test,bench]" -e clients/python
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/ldp demo

# Test processes: two per core (at least 4). Most tests wait on services and child processes as much as they
# compute, so two per core keep both cores busy; each process has its own local stack. The longest tests start
# first, a module's tests that share a module-scoped fixture stay on one process (tests/conftest.py schedules).
# Prints the 15 slowest tests and the wall time.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); n=$$((2 * n)); [ $$n -lt 4 ] && n=4; echo $$n)

# The project's bytecode is compiled once before the tests: with PYTHONDONTWRITEBYTECODE set (as on the CI machines)
# every worker, ingest and producer a test starts would compile the project's modules again (0.1 CPU s each).
test: $(STAMP)
	@start=$$(date +%s); \
	$(BIN)/python -m compileall -q -j 0 estimators wire producers stream_app ldpstream_dev ldpstream_cli \
		clients/python/ldp_device > /dev/null; \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope --durations=15; rc=$$?; \
	echo "make test: wall time $$(( $$(date +%s) - start )) s with $(TEST_WORKERS) test processes"; exit $$rc

bench: $(STAMP)
	$(BIN)/ldp bench protocols

clean:
	rm -rf $(VENV) .pytest_cache
