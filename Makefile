# Riverbed developer entry points. Everything runs inside .venv, which the first target creates.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.riverbed-installed
DATA   ?= riverbed-data
PYTEST_ARGS ?=

CORE_SOURCES := $(wildcard engine/*.pyx engine/*.pxi) setup.py pyproject.toml

.PHONY: install serve test test-compiled test-pure bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Editable install: setuptools builds the Cython core in place (engine/_core*.so) and maps the
# folders onto riverbed.engine / riverbed.shells / riverbed.spark.
$(STAMP): $(BIN)/python $(CORE_SOURCES)
	$(PIP) install -q -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

serve: install
	$(BIN)/riverbed serve --data-dir $(DATA)

# The whole suite against the compiled core, then the engine suite again against the pure-Python twin.
test: test-compiled test-pure

test-compiled: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-pure: install
	RIVERBED_NO_EXTENSIONS=1 $(BIN)/python -m pytest tests/engine -m "not slow" $(PYTEST_ARGS)

bench: install
	$(BIN)/python -m pytest bench/bench_engine.py bench/bench_core.py --benchmark-only \
		--benchmark-columns=min,median,max,ops -p no:randomly -q -s

clean:
	rm -rf $(VENV) build *.egg-info engine/_core.c engine/*.so .benchmarks
