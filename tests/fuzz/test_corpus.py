"""The CI pass of the fuzzing: every input of every target's corpus (tests/fuzz/corpus/<target>/) replayed
through the target under the invariants (no exception escapes, no hang, bounded memory per input, the
session answers a well-formed request afterwards, nothing left registered). Each input also runs under
tracemalloc, so one that allocates over harness.INPUT_MEMORY_MAX fails here. A few seconds a target."""

import pytest

from . import harness
from .targets import TARGETS, corpus_inputs, make_target

BUDGET_SECONDS = 15.0        # per target: the corpus is trimmed so a replay stays well under this


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_corpus_replays_clean(tmp_path, name):
    inputs = corpus_inputs(name)
    assert inputs, f"tests/fuzz/corpus/{name} is empty: run `python -m tests.fuzz.runner seed {name}`"
    target = make_target(name, tmp_path)
    failures = []
    total = 0.0
    try:
        for fname, data in inputs:
            try:
                dt, _ = harness.check_input(target, data, measure_memory=True)
                total += dt
            except Exception as e:  # noqa: BLE001 - every failure is listed with its input file
                cause = getattr(e, "logged", None) or e
                failures.append(f"{fname}: {harness.signature(cause)}: {str(cause)[:160]}")
    finally:
        target.close()
    assert not failures, "\n".join(failures[:20])
    assert total < BUDGET_SECONDS, f"{name}: corpus replay took {total:.1f} s"


def test_flag_byte_layout():
    assert harness.pieces(0, b"abcdef") == [b"abcdef"]
    assert harness.pieces(3 << harness.SPLIT_SHIFT, b"abcdefgh") == [b"ab", b"cd", b"ef", b"gh"]
    assert harness.flags_and_body(b"") == (0, b"")
