# The two commands of the README:  `make demo`  and  `make test`.
# Both create .venv and install the project (with its dev, test and bench extras) on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev,test,bench]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/ldp demo

# two test processes (the machine's two cores), each with its own local stack; a file's tests stay together
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

bench: $(STAMP)
	$(BIN)/ldp bench protocols

clean:
	rm -rf $(VENV) .pytest_cache
