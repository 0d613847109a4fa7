# Riverbed developer entry points. Everything runs inside .venv, which the first target creates.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.riverbed-installed
SERVE_STAMP := $(VENV)/.riverbed-serve-installed
DATA   ?= riverbed-data
PYTEST_ARGS ?=

CORE_SOURCES := $(wildcard engine/*.pyx engine/*.pxi) setup.py pyproject.toml

.PHONY: install install-serve serve test test-compiled test-pure bench bench-compare clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Editable install: setuptools builds the Cython core in place (engine/_core*.so) and maps the
# folders onto riverbed.engine / riverbed.shells / riverbed.spark. SERVE_STAMP is the base package, all
# that `riverbed serve` and the admin CLI need (make serve); STAMP adds the test and spark extras
# (pytest, playwright, pyspark, pyarrow, ...: make install, and every test and bench target).
$(SERVE_STAMP): $(BIN)/python $(CORE_SOURCES)
	$(PIP) install -q -e .
	@touch $(SERVE_STAMP)

$(STAMP): $(BIN)/python $(CORE_SOURCES)
	$(PIP) install -q -e '.[test,spark]'
	@touch $(STAMP) $(SERVE_STAMP)

install: $(STAMP)

install-serve: $(SERVE_STAMP)

serve: install-serve
	@echo "riverbed is in $(BIN): '. $(BIN)/activate' puts it on PATH in another shell"
	$(BIN)/riverbed serve --data-dir $(DATA)

# The whole suite against the compiled core, then the engine suite again against the pure-Python twin.
test: test-compiled test-pure

test-compiled: install
	@ci/ensure-java.sh
	@ci/rstream-old.sh >/dev/null
	@ci/npm-test-deps.sh >/dev/null
	@ci/npm-rmq-js-deps.sh >/dev/null
	@ci/ensure-chromium.sh
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-pure: install
	RIVERBED_NO_EXTENSIONS=1 $(BIN)/python -m pytest tests/engine -m "not slow" $(PYTEST_ARGS)

bench: install
	$(BIN)/python -m pytest bench/bench_engine.py bench/bench_core.py --benchmark-only \
		--benchmark-columns=min,median,max,ops -p no:randomly -q -s
	$(BIN)/python -m bench.bench_publish

# Riverbed against the real RabbitMQ Streams server on this machine (ci/rabbitmq.sh installs Debian's
# rabbitmq-server if missing and runs it on 127.0.0.1 only), same workloads through the same clients,
# and beside Redis 7 Streams and NATS JetStream (ci/redis.sh, ci/nats.sh: Debian's packages, free
# loopback ports, temporary directories; each with its own client), interleaved rounds; prints the ratio
# table, writes bench/results/<date>-<host>.json and .png, and stops everything it started.
# Shorter: make bench-compare ARGS='--n 200000 --rounds 1 --peers rabbitmq,redis'
bench-compare: install
	@$(BIN)/python -c "import rbfly, rstream, matplotlib, tqdm, redis, hiredis, nats" 2>/dev/null || $(PIP) install -q -e '.[test,bench]'
	$(BIN)/python -m bench.compare $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info engine/_core.c engine/*.so .benchmarks
