"""bench._kafka_native without a server: the native Kafka rows are left out, with the reason, where their
C client cannot be built, and kept (the program built once) where it can."""

import os

import pytest

from bench import _kafka_native


def quiet(msg):
    pass


def test_without_a_compiler_the_native_rows_are_left_out_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(_kafka_native, "BUILD_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-cc-here")
    got, why = _kafka_native.prepare(["kafka-consume", "kafka-consume-native", "kafka-produce-native",
                                      "consume-rstream"], log=quiet)
    assert got == ["kafka-consume", "consume-rstream"]
    assert "no C compiler" in why


def test_without_the_header_the_native_rows_are_left_out_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(_kafka_native, "BUILD_DIR", str(tmp_path))
    monkeypatch.setattr(_kafka_native, "HEADER", str(tmp_path / "rdkafka.h"))
    monkeypatch.setattr(_kafka_native, "ENSURE", "true")     # no install attempt from a test
    got, why = _kafka_native.prepare(["kafka-produce-native"], log=quiet)
    assert got == [] and "librdkafka-dev" in why


def test_rows_without_a_native_workload_build_nothing(monkeypatch):
    monkeypatch.setattr(_kafka_native, "binary", lambda ensure=True: pytest.fail("built"))
    assert _kafka_native.prepare(["kafka-consume", "publish-rstream-raw"]) == (
        ["kafka-consume", "publish-rstream-raw"], None)


def test_the_program_is_built_once_and_kept():
    try:
        first = _kafka_native.binary(ensure=False)
    except _kafka_native.Unavailable as e:
        pytest.skip(f"cannot build here: {e}")
    assert os.access(first, os.X_OK) and os.path.dirname(first) == _kafka_native.BUILD_DIR
    stamp = os.stat(first).st_mtime_ns
    assert _kafka_native.binary(ensure=False) == first and os.stat(first).st_mtime_ns == stamp
