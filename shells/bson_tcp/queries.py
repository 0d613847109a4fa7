"""Subscriptions and queries of a BSON/TCP connection: the two server-to-client streams, each under a
4 MiB / 2 MiB byte window (ACKEV / QUERYACK give bytes back)."""

import bson

from riverbed.engine import core
from riverbed.engine.predicate import compile_predicate, raw_program
from riverbed.engine.record import to_bson_bytes
from riverbed.shells.bson_tcp.codec import WINDOW_HIGH, WINDOW_LOW, encode_query_result, encode_recev
from riverbed.shells.broker import MODE_WINDOW
from riverbed.shells.broker.subscription import Subscription as BrokerSubscription


class Matcher:
    """A compiled matcher over raw BSON: the core's raw matcher, with the document evaluator for what
    it cannot decide. Immutable."""

    __slots__ = ("raw", "fn")

    def __init__(self, node):
        self.raw = core.DocMatcher(raw_program(node))
        self.fn = compile_predicate(node)

    def __call__(self, raw):
        r = self.raw.match(raw)
        if r < 0:
            try:
                return bool(self.fn(bson.decode(raw)))
            except Exception:  # noqa: BLE001 - an undecodable payload matches nothing
                return False
        return r == 1


class Subscription(BrokerSubscription):
    """One SUBSCRIBE of a connection (the broker's one :class:`~riverbed.shells.broker.subscription.
    Subscription`): a record Tail of the channel in window mode, writing RECEV frames.
    A RECEV's ``timestamp`` is the record's by the broker's one rule (records.py: its creation-time, else
    its chunk's); ``startTimestamp`` (``min_ts``) skips the records whose timestamp is before it."""

    __slots__ = ("sub_id", "matcher", "min_ts", "durable_ref", "sent")

    def __init__(self, session, sub_id, channel, offset, matcher=None, min_ts=None, durable_ref=None):
        super().__init__(session, channel, offset)
        self.sub_id = sub_id
        self.matcher = matcher
        self.min_ts = min_ts
        self.durable_ref = durable_ref
        self.sent = 0
        self.open_tail(self._on_records, on_gone=self._gone, mode=MODE_WINDOW, window_high=WINDOW_HIGH,
                       window_low=WINDOW_LOW, records=True)

    @property
    def channel(self):
        """The channel (mewbase's word for the stream)."""
        return self.stream

    def _gone(self, exc):
        self.session._subscription_gone(self, exc)

    def _on_records(self, tail, batch):
        budget = tail.window_high - tail.outstanding
        used = 0
        out = []
        sub_id, matcher, min_ts = self.sub_id, self.matcher, self.min_ts
        last = batch.next_offset - 1
        for offset, ts, view in batch.records():
            if min_ts is not None and ts < min_ts:
                continue
            ev = to_bson_bytes(view)
            if matcher is not None and not matcher(ev):
                continue
            f = encode_recev(sub_id, offset, ts, ev)
            out.append(f)
            used += len(f)
            if used > budget and offset < last:
                # over the window in the middle of a chunk: the rest of it is read again after ACKEVs
                tail.offset = offset + 1
                break
        if out:
            self.sent += len(out)
            self.session._send_many(out)
        return used


class QueryRun:
    """One QUERY in flight: its results (stored BSON bytes) go out as QUERYRESULT frames while fewer
    than 4 MiB of them are unacknowledged; the last carries ``last: true``."""

    __slots__ = ("session", "query_id", "results", "index", "outstanding", "stalled", "done")

    def __init__(self, session, query_id, results):
        self.session = session
        self.query_id = query_id
        self.results = results
        self.index = 0
        self.outstanding = 0
        self.stalled = False
        self.done = False

    def ack(self, nbytes):
        self.outstanding = max(0, self.outstanding - nbytes)
        if self.stalled and self.outstanding <= WINDOW_LOW:
            self.stalled = False
            self.pump()

    def pump(self):
        s = self.session
        out = []
        results, n = self.results, len(self.results)
        while not self.done and not self.stalled and not s._write_paused:
            if n == 0:
                out.append(encode_query_result(self.query_id, None, True))
                self.done = True
                break
            i = self.index
            f = encode_query_result(self.query_id, results[i], i + 1 == n)
            out.append(f)
            self.outstanding += len(f)
            self.index = i + 1
            if self.index == n:
                self.done = True
            elif self.outstanding > WINDOW_HIGH:
                self.stalled = True
        if out:
            s._send_many(out)
        if self.done:
            s._query_done(self)
