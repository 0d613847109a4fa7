# Riverbed developer entry points. Everything runs inside .venv, which the first target creates.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.riverbed-installed
SERVE_STAMP := $(VENV)/.riverbed-serve-installed
DATA   ?= riverbed-data
PYTEST_ARGS ?=
TEST_WORKERS ?= 3

CORE_SOURCES := $(wildcard engine/*.pyx engine/*.pxi shells/*.pyx shells/*.pxi) setup.py pyproject.toml

.PHONY: install install-serve serve test test-compiled test-pure bench bench-compare fuzz soak clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Editable install: setuptools builds the Cython modules in place (engine/_core*.so, shells/_wire*.so) and
# maps the folders onto riverbed.engine / riverbed.shells / riverbed.spark. SERVE_STAMP is the base package, all
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

# The whole suite against the compiled modules, then the engine suite and the shells' wire-parser tests
# again against the pure-Python twins.
# The compiled run is on TEST_WORKERS pytest-xdist workers (most tests wait on servers, sockets and
# timers, so more workers than cores pay): tests/conftest.py keeps each module on one worker, so its
# module-scoped server starts once, and the Spark modules together, so one JVM starts. Then the tests
# marked serial (they time the machine: failover bounds, a heartbeat window, RSS peaks) run alone; exit 5
# there (PYTEST_ARGS selected none of them) is no failure. TEST_WORKERS=0 runs the first part in one
# process.
test: test-compiled test-pure

test-compiled: install
	@ci/ensure-java.sh
	@ci/rstream-old.sh >/dev/null
	@ci/npm-test-deps.sh >/dev/null
	@ci/npm-rmq-js-deps.sh >/dev/null
	@ci/ensure-chromium.sh
	@ci/ensure-etcd.sh
	@ci/ensure-librdkafka.sh
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --serial exclude $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(BIN)/python -m pytest --serial only $(PYTEST_ARGS) || [ $$? -eq 5 ]

test-pure: install
	RIVERBED_NO_EXTENSIONS=1 $(BIN)/python -m pytest -n 2 --dist loadgroup tests/engine tests/shells/test_wire_*.py -m "not slow" $(PYTEST_ARGS)

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

# Coverage-guided fuzzing (atheris) of every protocol's codec and sans-I/O session, and of the engine's
# record and chunk parsers: each target runs FUZZ_SECONDS in its own process, new inputs go into
# tests/fuzz/corpus/<target> (minimised at the end), findings into .fuzz/findings; prints inputs, exec/s,
# uncaught exceptions, hangs and peak RSS per target and exits 1 on any. Logs: .fuzz/fuzz-<target>.log.
# FUZZ_RUNS=1000000 stops each target after that many inputs (FUZZ_SECONDS still caps it).
# FUZZ_ACCUMULATE=1: FUZZ_RUNS is a total over runs (.fuzz/totals/), each run adds to it; `python -m
# tests.fuzz.runner totals` prints the sums.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= rmq,bson,zmq,ws,ream,kafka,record,chunk,replication
FUZZ_RUNS ?= 0
fuzz: install
	@$(BIN)/python -c "import atheris" 2>/dev/null || $(PIP) install -q -e '.[test,fuzz]'
	$(BIN)/python -m tests.fuzz.runner campaign --seconds $(FUZZ_SECONDS) --runs $(FUZZ_RUNS) --targets $(FUZZ_TARGETS) \
		$(if $(FUZZ_ACCUMULATE),--accumulate)

# Network soak: a real server, malformed traffic on every listener, well-behaved clients of every
# protocol, then a SIGTERM and restart; exits 1 on any failed check. SOAK_MINUTES=10 for the full run.
SOAK_MINUTES ?= 1
soak: install
	$(BIN)/python -m bench.soak --minutes $(SOAK_MINUTES)

clean:
	rm -rf $(VENV) build *.egg-info engine/_core.c engine/*.so .benchmarks
