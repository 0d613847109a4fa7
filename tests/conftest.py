"""Suite-wide fixtures. The compiled modules must be the ones in use unless RIVERBED_NO_EXTENSIONS=1: the
engine's core (``riverbed.engine._core``) and the shells' wire parsers (``riverbed.shells._wire``)."""

import pytest

from riverbed.engine import _pycore, core
from riverbed.shells import _pywire, wire


def pytest_sessionstart(session):
    for picker, name in ((core, "riverbed.engine._core"), (wire, "riverbed.shells._wire")):
        if not picker.NO_EXTENSIONS and not picker.COMPILED:
            pytest.exit(f"the compiled module {name} is not in use: the build fell back to the pure-Python "
                        "twin. Rebuild (make install) or set RIVERBED_NO_EXTENSIONS=1.", returncode=3)


def pytest_report_header(config):
    return (f"riverbed core: {'compiled' if core.COMPILED else 'pure Python (RIVERBED_NO_EXTENSIONS=1)'}; "
            f"wire parsers: {'compiled' if wire.COMPILED else 'pure Python (RIVERBED_NO_EXTENSIONS=1)'}")


@pytest.fixture(params=["compiled", "python"])
def twin(request):
    """Each core implementation in turn, for tests of the byte-level functions."""
    if request.param == "compiled":
        if core.NO_EXTENSIONS:
            pytest.skip("RIVERBED_NO_EXTENSIONS=1")
        from riverbed.engine import _core
        return _core
    return _pycore


@pytest.fixture(params=["compiled", "python"])
def wire_twin(request):
    """Each implementation of the shells' wire parsers in turn (``_wire`` compiled, ``_pywire``)."""
    if request.param == "compiled":
        if wire.NO_EXTENSIONS:
            pytest.skip("RIVERBED_NO_EXTENSIONS=1")
        from riverbed.shells import _wire
        return _wire
    return _pywire


# How `make test` spreads the suite over pytest-xdist workers (`--dist loadgroup`, scheduled by
# ModuleGroups below): one group per test module, so a module-scoped server or cluster starts once, on one
# worker; the Spark modules share one group, so one worker starts the JVM (the session-scoped
# SparkSession) and no other does. Tests whose assertions time the machine (failover bounds, a heartbeat
# within a window, RSS peaks) are marked ``serial``: `make test` runs them after the parallel run, alone
# (--serial exclude, then --serial only). The lists are node-id prefixes.
SERIAL = (
    "tests/integration/test_soak.py",              # no well-behaved request over 3 s, RSS growth
    "tests/integration/test_zmq_slow.py",          # an RSS bound while a 1 GB backlog builds
    "tests/integration/test_zmq_mc0.py::test_ttl_noop_window_and_expiry",   # a 0.85-1.25 s window
    "tests/cluster/test_failover.py",              # failover p50 and max bounds
    "tests/cluster/test_nemesis.py",               # a leader again within a bound after each fault
    "tests/cluster/test_partition_netns.py",       # lease expiry against the partition's timing
    "tests/cluster/test_timers_at_rest.py",        # heartbeats counted against the clock
    # each confirm under 0.9 s while a member is stopped; none within 0.6 s while both are
    "tests/cluster/test_send_ahead.py::test_one_message_confirms_wait_for_a_majority_also_when_the_first_member_stops",
)
# The benches share one group (one worker, one after another): each looks for processes left behind by
# its temporary directory's prefix, and none should find another bench's.
SHARED_GROUPS = {"tests/spark/": "spark", "tests/integration/test_bench_": "bench", "tests/bench/": "bench"}
# The longest groups are handed out first, so no worker starts a long module near the end (loadgroup
# hands out groups in collection order).
FIRST = ("tests/spark/", "tests/shells/test_build.py", "tests/integration/test_bench_", "tests/bench/",
         "tests/cluster/", "tests/integration/test_cli_admin.py", "tests/integration/test_rmq_compat.py",
         "tests/integration/test_rmq_sac_rstream_0_20", "tests/integration/test_tls.py",
         "tests/engine/test_recovery.py")


def _rank(nodeid):
    for i, prefix in enumerate(FIRST):
        if nodeid.startswith(prefix):
            return i
    return len(FIRST)


def group_of(nodeid):
    """The xdist work unit of a test: its SHARED_GROUPS name, else its file."""
    return next((g for prefix, g in SHARED_GROUPS.items() if nodeid.startswith(prefix)), nodeid.split("::")[0])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` by :func:`group_of`, units handed out in collection order (FIRST first).
    xdist's own loadgroup reads ``xdist_group`` marks by renaming ``item._nodeid``, which pytest 9 no
    longer reads (node ids come from ``_id``), so it silently spread every module over every worker."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return group_of(nodeid)

    config.option.loadscopereorder = False     # keep FIRST's order, not the largest unit first
    return ModuleGroups(config, log)


def pytest_addoption(parser):
    parser.addoption("--serial", choices=("all", "exclude", "only"), default="all",
                     help="exclude: leave out the tests marked serial (the parallel run of make test); only: "
                          "run just those (make test's second run). Composes with -m, which it leaves free.")


def pytest_ignore_collect(collection_path, config):
    """With --serial only, a test file that SERIAL does not name is not even imported: the second run of
    make test then collects only the SERIAL tests, not the whole suite."""
    if config.getoption("serial") != "only" or not collection_path.name.startswith("test_"):
        return None
    try:
        rel = collection_path.relative_to(config.rootpath).as_posix()
    except ValueError:
        return None
    files = [prefix.split("::")[0] for prefix in SERIAL]
    return True if not any(rel.startswith(f) or f.startswith(rel + "/") for f in files) else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        nodeid = item.nodeid
        if nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
    which = config.getoption("serial")
    if which != "all":
        keep, dropped = [], []
        for item in items:
            (keep if (item.get_closest_marker("serial") is not None) == (which == "only") else dropped).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    items.sort(key=lambda item: _rank(item.nodeid))       # stable: the order within a rank is kept
