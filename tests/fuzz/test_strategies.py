"""Structured fuzzing with hypothesis: frames that are valid in shape, hostile in value (strategies.py),
through each target under the same invariants as the coverage-guided runs. A failing example is shrunk
by hypothesis; add it to test_regressions.py with its bytes."""

import pytest
from hypothesis import HealthCheck, given, settings

from . import harness
from .strategies import STRATEGIES
from .targets import make_target

EXAMPLES = 80


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    made = {}
    yield lambda name: made.setdefault(name, make_target(name, tmp_path_factory.mktemp(name)))
    for t in made.values():
        t.close()


def _check(target, data):
    try:
        harness.check_input(target, data)
    except harness.LoggedException as e:
        raise AssertionError(f"{data.hex()}: {e}") from e.logged


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_hostile_values_keep_every_invariant(targets, name):
    target = targets(name)

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
    @given(STRATEGIES[name])
    def run(data):
        _check(target, data)

    run()
