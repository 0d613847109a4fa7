"""The broker's one Subscription (shells/broker/subscription.py): the state and bookkeeping every protocol's
subscription shares, over a real engine and Tail."""

import pytest

from riverbed.engine.record import CT_JSON, encode_record
from riverbed.shells.broker import MODE_WINDOW, Subscription

from .harness import Loop


class Session:
    """What a Subscription needs of its session: the broker, an io with ``defer``, ``_write_paused``."""

    def __init__(self, loop):
        self.broker = loop.broker
        self.io = loop.new_io()
        self._write_paused = False


@pytest.fixture
def lp(tmp_path):
    loop = Loop(tmp_path)
    yield loop
    loop.close()


def publish(lp, stream, n):
    lp.broker.append_or_create(stream, [encode_record(b'{"i": %d}' % i, CT_JSON) for i in range(n)],
                               lambda res, exc: None)
    lp.settle()


def test_open_begin_deliver_stop_close(lp):
    publish(lp, "s", 3)
    session, got = Session(lp), []
    sub = Subscription(session, "s", start=1)
    assert (sub.tail, sub.closed) == (None, False)

    def deliver(tail, batch):
        got.extend(off for off, _ts, _view in batch.records())
        return 1
    tail = sub.open_tail(deliver, mode=MODE_WINDOW, records=True)
    assert tail.offset == 1 and tail.defer == session.io.defer
    lp.settle()
    assert got == []                      # nothing before begin()
    sub.begin()
    lp.settle()
    assert got == [1, 2]
    sub.stop_tail()                       # the subscription waits (its stream went away, say)
    assert sub.tail is None and tail.closed and not sub.closed
    publish(lp, "s", 1)
    assert got == [1, 2]
    sub.open_tail(deliver, offset=3, mode=MODE_WINDOW, records=True)
    sub.begin()
    lp.settle()
    assert got == [1, 2, 3]
    sub.close()
    sub.close()                           # idempotent
    assert sub.closed and sub.tail is None


def test_a_subscription_that_begins_on_a_full_transport_starts_paused(lp):
    publish(lp, "s", 2)
    session, got = Session(lp), []
    session._write_paused = True
    sub = Subscription(session, "s")
    tail = sub.open_tail(lambda t, b: got.extend(o for o, _, _ in b.records()) or 1, mode=MODE_WINDOW,
                         records=True)
    sub.begin()
    lp.settle()
    assert got == []
    tail.resume()                         # what the kernel's resume_writing does for every tail
    lp.settle()
    assert got == [0, 1]


def test_begin_without_delivery_applies_only_the_pause(lp):
    publish(lp, "s", 1)
    session, got = Session(lp), []
    sub = Subscription(session, "s")
    tail = sub.open_tail(lambda t, b: got.extend(o for o, _, _ in b.records()) or 1, mode=MODE_WINDOW,
                         records=True)
    sub.begin(deliver=False)
    lp.settle()
    assert got == []
    tail.start()
    lp.settle()
    assert got == [0]
