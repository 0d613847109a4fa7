"""Super streams built binding by binding (RabbitMQ's management API path: an exchange, then one binding per
partition): declare, bind, unbind, forget, and how they sit beside create_super_stream."""

import pytest

from riverbed.engine import Engine, StreamExists, StreamNotFound


@pytest.fixture
def eng(tmp_path):
    e = Engine(tmp_path / "data", fsync="never", retention_interval=0)
    yield e
    e.close()


def test_declare_then_bind_in_any_order_keeps_the_partition_order(eng):
    assert eng.declare_super_stream("inv").result() is True
    assert eng.declare_super_stream("inv").result() is False           # exists: left as it is
    assert eng.super_stream("inv")["partitions"] == []
    for p in ("inv-0", "inv-1", "inv-2", "inv-x"):
        eng.create_stream(p).result()
    assert eng.bind_super_stream("inv", "inv-2", "k2", 2).result() is True
    assert eng.bind_super_stream("inv", "inv-x", "kx").result() is True     # no order: after the ordered ones
    assert eng.bind_super_stream("inv", "inv-0", "k0", 0).result() is True
    assert eng.bind_super_stream("inv", "inv-1", "k1", 1).result() is True
    assert eng.bind_super_stream("inv", "inv-1", "k1", 1).result() is False  # the same binding again
    d = eng.super_stream("inv")
    assert d["partitions"] == ["inv-0", "inv-1", "inv-2", "inv-x"]
    assert d["binding_keys"] == ["k0", "k1", "k2", "kx"] and d["orders"] == [0, 1, 2, None]
    assert eng.unbind_super_stream("inv", "inv-1", "k1").result() == 1
    assert eng.unbind_super_stream("inv", "inv-1", "k1").result() == 0
    assert eng.super_stream("inv")["partitions"] == ["inv-0", "inv-2", "inv-x"]
    eng.forget_super_stream("inv").result()
    assert eng.super_stream("inv") is None and eng.has_stream("inv-0")     # the partitions stay
    with pytest.raises(StreamNotFound):
        eng.forget_super_stream("inv").result()


def test_bind_needs_the_super_stream_and_the_partition(eng):
    eng.create_stream("p").result()
    with pytest.raises(StreamNotFound):
        eng.bind_super_stream("none", "p", "k").result()
    eng.declare_super_stream("ss").result()
    with pytest.raises(StreamNotFound):
        eng.bind_super_stream("ss", "missing", "k").result()
    with pytest.raises(StreamNotFound):
        eng.unbind_super_stream("none", "p").result()


def test_binding_onto_a_created_super_stream_and_reopening(tmp_path):
    e = Engine(tmp_path / "data", fsync="never", retention_interval=0)
    try:
        e.create_super_stream("orders", ["orders-eu", "orders-us"], ["eu", "us"]).result()
        with pytest.raises(StreamExists):
            e.create_super_stream("orders", ["orders-x"], ["x"]).result()
        e.create_stream("orders-ap").result()
        e.bind_super_stream("orders", "orders-ap", "ap", 1).result()         # ties with us (1): after it
        assert e.super_stream("orders")["partitions"] == ["orders-eu", "orders-us", "orders-ap"]
        e.create_stream("orders-first").result()
        e.bind_super_stream("orders", "orders-first", "f", -1).result()
        assert e.super_stream("orders")["partitions"][0] == "orders-first"
    finally:
        e.close()
    e = Engine(tmp_path / "data", fsync="never", retention_interval=0)
    try:
        assert e.super_stream("orders")["partitions"] == ["orders-first", "orders-eu", "orders-us", "orders-ap"]
        e.delete_super_stream("orders").result()                            # takes every partition along
        assert not e.has_stream("orders-ap") and e.super_stream("orders") is None
    finally:
        e.close()


def test_a_deleted_partition_leaves_its_super_streams_unless_the_bindings_are_kept(eng):
    """A cluster node dropping its copy of a partition (the stream lives on other nodes) keeps the super
    stream's definition whole (``keep_bindings``): Route and Partitions there still name every partition,
    and a DeleteSuperStream through that node still reaches them all."""
    eng.create_super_stream("ss", ["ss-0", "ss-1", "ss-2"], ["0", "1", "2"]).result()
    eng.delete_stream("ss-1", keep_bindings=True).result()
    assert not eng.has_stream("ss-1")
    assert eng.super_stream("ss")["partitions"] == ["ss-0", "ss-1", "ss-2"]
    eng.delete_stream("ss-2").result()                     # a client's deletion: its binding goes with it
    assert eng.super_stream("ss")["partitions"] == ["ss-0", "ss-1"]
    eng.delete_super_stream("ss").result()                 # the partitions that still exist go with it
    assert eng.super_stream("ss") is None and not eng.has_stream("ss-0")
