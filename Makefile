# The two commands of the README:  `make demo`  and  `make test`.
# Both create .venv and install the project (with its test and bench extras) on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test,bench]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/ldp demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/ldp bench protocols

clean:
	rm -rf $(VENV) .pytest_cache
