"""Consuming commands of a RabbitMQ Stream session: Subscribe, Credit, Unsubscribe, single active
consumer (ConsumerUpdate), StoreOffset, QueryOffset, ResolveOffsetSpec. Part of
:class:`~riverbed.shells.rmq_stream.session.RmqStreamSession`.

Delivery is a broker :class:`~riverbed.shells.broker.Tail` per subscription in credit mode: one credit
per Deliver (one chunk); chunks a filter rules out, and non-user chunks, are skipped without using
credit. A subscription at offset N gets the whole chunk holding N (the client skips earlier records).
A NEXT subscription is resolved, and answered, only after every append the broker had accepted when the
Subscribe arrived has committed, so it never receives a message published before it subscribed.
"""

import logging
import struct

from riverbed.engine import core
from riverbed.engine.errors import ChunkError, RiverbedError, StreamNotFound
from riverbed.shells.broker import READ
from riverbed.shells.broker import sac as sac_groups
from riverbed.shells.broker.subscription import Subscription as BrokerSubscription
from riverbed.shells.rmq_stream.codec import (
    _CREDIT, DecodeError, Reader, decode_offset_spec, deliver_parts, encode_consumer_update,
    encode_credit_response, encode_deliver_prefix, response_code_for,
)
from riverbed.shells.rmq_stream.constants import (
    CMD_QUERY_OFFSET, CMD_RESOLVE_OFFSET_SPEC, CMD_SUBSCRIBE, CMD_UNSUBSCRIBE, LEN_KEY_VERSION, MAX_REFERENCE,
    OFFSET_TYPE_NONE, OFFSET_TYPE_OFFSET, RC_ACCESS_REFUSED, RC_INTERNAL_ERROR, RC_OK, RC_PRECONDITION_FAILED,
    RC_STREAM_DOES_NOT_EXIST, RC_SUBSCRIPTION_ID_ALREADY_EXISTS, RC_SUBSCRIPTION_ID_DOES_NOT_EXIST, SAC_ACTIVATING,
    SAC_ACTIVE, SAC_NONE, SAC_STEP_DOWN_TIMEOUT, SAC_STEPPING_DOWN, SAC_WAITING, ST_CLOSING, ST_OPEN,
)

log = logging.getLogger("riverbed.rmq")


class Subscription(BrokerSubscription):
    """One subscription of one connection (the broker's one :class:`~riverbed.shells.broker.subscription.
    Subscription`, reading chunks under credit): its Subscribe arguments and its single-active-consumer
    state. ``closed`` once unsubscribed or dropped."""

    __slots__ = ("sub_id", "spec", "filters", "match_unfiltered", "sac", "sac_name", "ready",
                 "step_down_deadline",
                 "properties")   # the Subscribe properties, as the management API shows them

    def __init__(self, session, sub_id, stream, spec, filters, match_unfiltered):
        super().__init__(session, stream)
        self.sub_id = sub_id
        self.spec = spec           # (offset type, value) as subscribed, for SAC activation "none"
        self.filters = filters     # list of bytes, empty when the subscriber does not filter
        self.match_unfiltered = match_unfiltered
        self.sac = SAC_NONE
        self.sac_name = None
        self.ready = False         # answered: delivery may start
        self.step_down_deadline = None   # broker clock (s) by which a step-down must be answered
        self.properties = {}

    @property
    def credit(self):
        return self.tail.units

    @property
    def offset(self):
        return self.tail.offset

    # as a member of a single-active-consumer group (shells/broker/sac.py, shells/cluster/sac.py)

    def sac_activate(self):
        self.session.sac_activate(self)

    def sac_step_down(self):
        self.session.sac_step_down(self)

    def sac_state(self):
        """This member's state for its group's coordinator: ACTIVE while activating or delivering,
        STEPPING_DOWN while its step-down is unanswered, else WAITING."""
        if self.sac in (SAC_ACTIVATING, SAC_ACTIVE):
            return sac_groups.ACTIVE
        return sac_groups.STEPPING_DOWN if self.sac == SAC_STEPPING_DOWN else sac_groups.WAITING


def _truthy(v):
    return v is not None and v.strip().lower() == "true"


def filter_values(props):
    """``filter.N`` subscription properties, in N order, as UTF-8 bytes."""
    found = []
    for k, v in props.items():
        if k.startswith("filter.") and v is not None:
            suffix = k[7:]
            found.append((int(suffix) if suffix.isdigit() else 1 << 30, k, v.encode("utf-8")))
    return [v for _, _, v in sorted(found)]


class ConsumeCommands:
    """Mixin: the consuming half of RmqStreamSession (uses its ``_send``, ``_flush``, ``_later``,
    ``subscriptions``, ``shell`` and ``broker``)."""

    # ------------------------------------------------------------------------------------ subscribe

    def _on_subscribe(self, f, version, copied=False):
        r = Reader(f)
        corr = r.u32()
        sub_id = r.u8()
        stream = r.string()
        spec = decode_offset_spec(r)
        credit = r.u16()
        props = r.properties()
        r.done()
        if sub_id in self.subscriptions:
            self._respond(CMD_SUBSCRIBE, corr, RC_SUBSCRIPTION_ID_ALREADY_EXISTS)
            return
        if not copied and self.broker.needs_copy(stream):
            # a cluster node holding no copy: it makes one from the leader first (remote_read.py)
            f = bytes(f)
            self.broker.when_readable(stream, self._later(lambda exc: self._on_subscribe(f, version, True)))
            return
        if not self.broker.has_stream(stream):
            self._respond(CMD_SUBSCRIBE, corr, RC_STREAM_DOES_NOT_EXIST)
            return
        if not self._can(READ, stream):
            self._respond(CMD_SUBSCRIBE, corr, RC_ACCESS_REFUSED)
            return
        sac = _truthy(props.get("single-active-consumer"))
        name = props.get("name")
        if sac and not name:
            self._respond(CMD_SUBSCRIBE, corr, RC_PRECONDITION_FAILED)
            return
        try:
            offset_spec = self.shell.offset_spec(*spec)
        except RiverbedError as e:
            self._respond(CMD_SUBSCRIBE, corr, response_code_for(e))
            return
        sub = Subscription(self, sub_id, stream, spec, filter_values(props), _truthy(props.get("match-unfiltered")))
        sub.properties = dict(props)
        sub.open_tail(lambda tail, chunk_id, raw, start: self._deliver_chunk(sub, tail, raw), credit=credit,
                      on_gone=lambda exc: self._tail_gone(sub, exc))
        self.subscriptions[sub_id] = sub   # taken from now on, though answered only once resolved

        def resolved(offset, exc):
            if sub.closed:
                return
            if exc is not None:
                self.subscriptions.pop(sub_id, None)
                sub.closed = True
                self._respond(CMD_SUBSCRIBE, corr, response_code_for(exc))
                return
            sub.tail.offset = offset
            sub.ready = True
            self._respond(CMD_SUBSCRIBE, corr, RC_OK)
            if sac:
                sub.sac = SAC_WAITING
                sub.sac_name = name
                self.shell.sac.register(stream, name, self, sub, props.get("super-stream"))
            else:
                self._start(sub)
        self.broker.resolve_after_writes(stream, offset_spec, self._later(resolved))

    def _start(self, sub, offset=None):
        sub.begin(offset)

    def _deliver_chunk(self, sub, tail, raw):
        """Tail callback: one Deliver per user chunk; returns the credit used (0 when filtered out)."""
        if sub.closed or self.state != ST_OPEN:
            tail.close()
            return 0
        if sub.filters:
            bloom = raw[44]
            if not core.bloom_match(raw[48:48 + bloom] if bloom else b"", sub.filters, sub.match_unfiltered):
                return 0
        data_len, parts = deliver_parts(raw)
        committed = self.broker.committed_chunk_id(sub.stream) if self.deliver_version == 2 else 0
        self._flush()
        parts.insert(0, encode_deliver_prefix(sub.sub_id, data_len, self.deliver_version, committed))
        self.io.writelines(parts)
        self.last_sent = self.broker.clock()
        return 1

    def _tail_gone(self, sub, exc):
        if isinstance(exc, ChunkError):
            log.error("%s: %s; closing the connection rather than skipping data", self.peer, exc)
            self._fatal(RC_INTERNAL_ERROR, f"corrupt chunk in stream {sub.stream!r}")
        # StreamNotFound: the broker's deletion notice sends MetadataUpdate and drops the subscription

    # ------------------------------------------------------------------------ single active consumer

    def sac_activate(self, sub):
        """Make ``sub`` the active consumer of its group: ConsumerUpdate(active) goes out and delivery
        starts once the client answers with the offset to start from. Called by the SAC groups."""
        if sub.closed or self.state >= ST_CLOSING:
            return
        sub.sac = SAC_ACTIVATING
        corr = self._next_corr()
        self._pending_updates[corr] = sub.sub_id
        self._send(encode_consumer_update(corr, sub.sub_id, True))
        self._flush()

    def sac_step_down(self, sub):
        """Stop delivering to ``sub`` and tell the client (ConsumerUpdate inactive); the group moves on
        once the client answers. Called by the SAC groups on a super stream rebalance."""
        if sub.closed or self.state >= ST_CLOSING:
            return
        sub.sac = SAC_STEPPING_DOWN
        sub.step_down_deadline = self.broker.clock() + SAC_STEP_DOWN_TIMEOUT
        sub.tail.stop()
        corr = self._next_corr()
        self._pending_updates[corr] = sub.sub_id
        self._send(encode_consumer_update(corr, sub.sub_id, False))
        self._flush()

    def _on_consumer_update_response(self, f, version):
        r = Reader(f)
        corr = r.u32()
        code = r.u16()
        spec = decode_offset_spec(r, allow_none=True) if r.pos < r.end else (OFFSET_TYPE_NONE, None)
        # no r.done(): rstream always appends a u64 offset, even for types that take none
        sub_id = self._pending_updates.pop(corr, None)
        sub = self.subscriptions.get(sub_id) if sub_id is not None else None
        if sub is None:
            return
        if sub.sac == SAC_STEPPING_DOWN:
            self._stepped_down(sub)
            return
        if sub.sac != SAC_ACTIVATING:
            return
        if code != RC_OK or spec[0] == OFFSET_TYPE_NONE:
            spec = sub.spec
        try:
            offset = self.broker.resolve(sub.stream, self.shell.offset_spec(*spec))
        except RiverbedError as e:
            log.warning("%s: cannot resolve the activation offset %r of %r: %s", self.peer, spec, sub.stream, e)
            return
        sub.sac = SAC_ACTIVE
        self._start(sub, offset)

    def _stepped_down(self, sub):
        sub.sac = SAC_WAITING
        sub.step_down_deadline = None
        self.shell.sac.stepped_down(sub.stream, sub.sac_name, self, sub)

    def check_step_downs(self, now):
        """A consumer that does not answer its step-down within SAC_STEP_DOWN_TIMEOUT is taken as stepped
        down (it gets nothing more either way), so its group is not stuck with no active member."""
        for sub in list(self.subscriptions.values()):
            if sub.sac == SAC_STEPPING_DOWN and sub.step_down_deadline is not None and now >= sub.step_down_deadline:
                log.warning("%s: subscription %d on %r did not answer its step-down in %.0f s; moving on",
                            self.peer, sub.sub_id, sub.stream, SAC_STEP_DOWN_TIMEOUT)
                self._stepped_down(sub)

    # ------------------------------------------------------------------------- credit, unsubscribe

    def _on_credit(self, f, version):
        if len(f) != LEN_KEY_VERSION + 3:
            raise DecodeError("Credit frame is not 3 bytes")
        sub_id, credit = _CREDIT.unpack_from(f, LEN_KEY_VERSION)
        sub = self.subscriptions.get(sub_id)
        if sub is None:
            self._send(encode_credit_response(RC_SUBSCRIPTION_ID_DOES_NOT_EXIST, sub_id))
            return
        if sub.sac == SAC_WAITING or sub.sac == SAC_STEPPING_DOWN:
            sub.tail.units += credit
            self._send(encode_credit_response(RC_PRECONDITION_FAILED, sub_id))
            return
        sub.tail.grant(credit)

    def _on_unsubscribe(self, f, version):
        r = Reader(f)
        corr = r.u32()
        sub_id = r.u8()
        r.done()
        sub = self.subscriptions.pop(sub_id, None)
        if sub is None:
            self._respond(CMD_UNSUBSCRIBE, corr, RC_SUBSCRIPTION_ID_DOES_NOT_EXIST)
            return
        self._drop_subscription(sub)
        self._respond(CMD_UNSUBSCRIBE, corr, RC_OK)

    def _drop_subscription(self, sub, sac_handover=True):
        sub.close()
        if sub.sac != SAC_NONE and sac_handover:
            self.shell.sac.unregister(sub.stream, sub.sac_name, self, sub)

    # -------------------------------------------------------------------------------------- offsets

    def _on_store_offset(self, f, version):
        r = Reader(f)
        reference = r.string()
        stream = r.string()
        offset = r.u64()
        r.done()
        # StoreOffset has no reply by design; a bad one is dropped (and logged)
        if not reference or len(reference.encode("utf-8")) > MAX_REFERENCE or not stream:
            log.info("%s: StoreOffset with an empty or over-long reference ignored", self.peer)
        elif not self._can(READ, stream):
            log.info("%s: StoreOffset on %r refused (no read permission)", self.peer, stream)
        elif self.broker.has_stream(stream):
            self.broker.store_offset(stream, reference, offset, self._later(lambda exc: None))

    def _on_query_offset(self, f, version):
        self._tracking_query(f, CMD_QUERY_OFFSET, READ, self.broker.query_offset)

    def _on_resolve_offset_spec(self, f, version):
        r = Reader(f)
        corr = r.u32()
        stream = r.string()
        spec = decode_offset_spec(r)
        props = r.properties()
        r.done()
        fail = struct.pack(">HQ", OFFSET_TYPE_OFFSET, 0)
        if not self.broker.has_stream(stream):
            self._respond(CMD_RESOLVE_OFFSET_SPEC, corr, RC_STREAM_DOES_NOT_EXIST, fail)
            return
        if not self._can(READ, stream):
            self._respond(CMD_RESOLVE_OFFSET_SPEC, corr, RC_ACCESS_REFUSED, fail)
            return
        try:
            offset = self.broker.resolve(stream, self.shell.offset_spec(*spec))
            filters = filter_values(props)
            if filters:
                offset = self.broker.first_matching_chunk(stream, offset, filters,
                                                          _truthy(props.get("match-unfiltered")))
        except (RiverbedError, StreamNotFound) as e:
            self._respond(CMD_RESOLVE_OFFSET_SPEC, corr, response_code_for(e), fail)
            return
        self._respond(CMD_RESOLVE_OFFSET_SPEC, corr, RC_OK, struct.pack(">HQ", OFFSET_TYPE_OFFSET, offset))
