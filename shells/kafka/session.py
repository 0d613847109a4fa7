"""A Kafka connection on the session kernel (:mod:`riverbed.shells.broker.session`: io contract,
lifecycle, guard, flow control, shutdown drain): this module is its framing, its commands
(:data:`COMMANDS`, handlers ``_on_<api name>``, here and in the group and admin mixins) and their error
rendering. Storage is reached only through the broker layer.

Requests are answered in the order they came, as Kafka clients require of a connection; an answer that
waits (Produce until its records are stored, Fetch until data or ``max_wait_ms``) holds back the ones
after it. The connection stops being read while ``PENDING_HIGH`` answers wait (until ``PENDING_LOW``),
besides the kernel's reasons (transport output full, in-flight appends, the broker's budget).

Bad input, as Kafka treats it: a frame over ``max_frame_size`` (limits.py, 64 MiB) or with a negative
size (counted in ``riverbed_rejected_total``), an unknown API key, a version outside the served range (but ApiVersions), or a body that
does not parse closes this connection and only this one. An ApiVersions above the served versions is
answered UNSUPPORTED_VERSION (35) with the served ranges, at version 0. A record batch with a wrong CRC
is answered CORRUPT_MESSAGE and nothing of that partition is stored; one whose records decompress past
``max_decompressed_size`` is answered MESSAGE_TOO_LARGE (counted too), decompression stopped there.
"""

import collections
import functools
import logging
import struct

from riverbed.engine import OffsetSpec, PublishingIds
from riverbed.engine.errors import InvalidArgument, RiverbedError, StreamExists, StreamNotFound
from riverbed.shells import auth as _auth
from riverbed.shells import wire
from riverbed.shells.broker import CONFIGURE, READ, WRITE
from riverbed.shells.broker.core import NotLeaderError
from riverbed.shells.broker import limits as _limits
from riverbed.shells.broker.session import SessionKernel, State, commands
from riverbed.shells.kafka import codec as C
from riverbed.shells.kafka.admin_commands import AdminCommands, producer_reference
from riverbed.shells.kafka.fetch_read import read_batches
from riverbed.shells.kafka.group_commands import GroupCommands
from riverbed.shells.kafka import records as R
from riverbed.shells.kafka.shell import CLUSTER_ID, MAX_TOPIC_PARTITIONS, NODE_ID, retention_arguments
from riverbed.shells.protocols import KAFKA

log = logging.getLogger("riverbed.kafka")
LISTENER = KAFKA   # the one name (protocols.py): the listener label of riverbed_rejected_total

TS_LATEST, TS_EARLIEST = -1, -2
ERR_ILLEGAL_SASL_STATE = 34
ERR_UNSUPPORTED_SASL_MECHANISM = 33
ERR_SASL_AUTHENTICATION_FAILED = 58
READ_CHUNKS = 16            # chunks read per step of a ListOffsets by time
MAX_WAIT_MS_CAP = 30000     # a Fetch waits at most this long whatever it asks
FETCH_MAX_BYTES = 55 << 20  # record bytes of one Fetch answer at most (Kafka's default fetch.max.bytes)
TIME_SKEW_MS = 60_000       # ListOffsets by time: how much later than stored a record's creation time may be
TIME_SCAN_BUDGET = 200_000  # ListOffsets by time: records decoded per request at most
PENDING_HIGH = 1000         # requests waiting for their answer before the connection stops being read ...
PENDING_LOW = 500           # ... until this few are left (clients keep 5 in flight: only a flood hits it)


class _Slot:
    """One request waiting for its answer, in arrival order."""

    __slots__ = ("data",)

    def __init__(self):
        self.data = None


class KafkaSession(GroupCommands, AdminCommands, SessionKernel):
    """One Kafka connection on the session kernel (see the module docstring). ``HANDSHAKE`` until SASL
    succeeds (``OPEN`` at once when the peer needs no login). Loop-thread only; bad input never raises out."""

    LISTENER = LISTENER
    PROTOCOL = LISTENER     # the management API's protocol: the same one name

    def __init__(self, shell, io, *, peer="?", local=None, remote=None, peer_loopback=True):
        super().__init__(shell, io, peer=peer, local=local, remote=remote, peer_loopback=peer_loopback)
        self.user = self.broker.auth.implicit_user(peer_loopback)
        if self.user is not None:
            self.username = self.user.name
            self.state = State.OPEN
        self.client_id = None
        self._buf = bytearray()
        self._slots = collections.deque()
        self._fetches = set()           # Fetches waiting for data (long polling)
        self._mechanism = None          # the SASL mechanism a SaslHandshake chose, until SaslAuthenticate

    # ------------------------------------------------------------------------------- the kernel's hooks

    def _received(self, data):
        # input already buffered, or this read's bytes themselves (immutable): either way the frames
        # are views of a buffer that is never changed again, so a Produce's records are not copied
        buf = self._buf
        if buf:
            buf += data
        elif type(data) is bytes:
            buf = data
        else:
            buf = bytearray(data)
        try:
            frames, used = C.split_frames(buf, self.limits.max_frame_size)
        except C.FrameTooLarge as e:
            _limits.reject(LISTENER, _limits.REASON_FRAME_SIZE, str(e), self.peer)
            self._fatal(f"bad frame: {e}")
            return
        if not frames:
            if buf is not self._buf:
                self._buf = bytearray(buf)
            return
        # a fresh buffer for what follows: the views keep this one as it is
        self._buf = bytearray(memoryview(buf)[used:]) if used < len(buf) else bytearray()
        for f in frames:
            self._request(f)
            if self.state >= State.CLOSING:
                return
        if len(self._slots) >= PENDING_HIGH:
            self._update_reading()

    def _backlogged(self):
        return len(self._slots) >= PENDING_HIGH or super()._backlogged()

    def _drained(self):
        return len(self._slots) <= PENDING_LOW and super()._drained()

    def _tails(self):
        return ()       # answers, not subscriptions: nothing is delivered unasked

    def _on_tick(self, now):
        self.shell.groups.tick(now)
        self.shell.consumer_groups.tick(now)

    def _drop_all(self):
        for f in list(self._fetches):
            f.cancel()
        self._fetches.clear()

    def _info(self):
        return {"client_properties": {"client_id": self.client_id or ""}}

    # ----------------------------------------------------------------------------- requests and answers

    def _fatal(self, why):
        log.info("%s: closing the Kafka connection: %s", self.peer, why)
        self._hard_close()

    def _request(self, frame):
        try:
            hdr = C.decode_header(frame)
        except C.DecodeError as e:
            self._fatal(f"bad request header: {e}")
            return
        self.client_id = hdr.client_id
        command = COMMANDS.get(hdr.api_key)
        if command is None or hdr.body < 0:
            self._fatal(f"unknown API key {hdr.api_key}")
            return
        if hdr.version not in command.versions:
            if hdr.api_key == C.API_API_VERSIONS:
                slot = self._slot()
                self._answer(slot, C.API_API_VERSIONS, 0, hdr.correlation_id,
                             {"error_code": C.ERR_UNSUPPORTED_VERSION, "api_keys": _api_keys()})
                return
            self._fatal(f"unsupported version {hdr.version} of API {hdr.api_key}")
            return
        try:
            req = C.decode_request(hdr.api_key, hdr.version, frame, hdr.body)
        except C.DecodeError as e:
            self._fatal(f"API {hdr.api_key} v{hdr.version} does not parse: {e}")
            return
        if command.min_state > self.state:
            self._fatal("not authenticated")      # with --users: nothing is served before SASL
            return
        command.handler(self, hdr, req)

    def _slot(self):
        slot = _Slot()
        self._slots.append(slot)
        return slot

    def _answer(self, slot, api_key, version, corr, body):
        if self.state >= State.CLOSED:
            return
        slot.data = C.encode_response_parts(api_key, version, corr, body)
        slots = self._slots
        while slots and slots[0].data is not None:
            for part in slots.popleft().data:
                self._send(part)
        self._flush()
        if self._read_paused:
            self._update_reading()

    def _reply(self, hdr, body):
        """Answer ``hdr``'s request at once with ``body``."""
        self._answer(self._slot(), hdr.api_key, hdr.version, hdr.correlation_id, body)

    def _allowed(self, what, name):
        return self.broker.allowed(self.user, what, name)

    # --------------------------------------------------------------------------------------- ApiVersions

    def _on_api_versions(self, hdr, req):
        self._reply(hdr, {"error_code": C.ERR_NONE, "api_keys": _api_keys(), "throttle_time_ms": 0})

    # ------------------------------------------------------------------------------------------ SASL

    def _on_sasl_handshake(self, hdr, req):
        mechanisms = [m for m in self.broker.auth.mechanisms() if m == "PLAIN"]
        ok = req["mechanism"] in mechanisms and self.user is None
        self._mechanism = req["mechanism"] if ok else None
        self._reply(hdr, {"error_code": 0 if ok else (ERR_UNSUPPORTED_SASL_MECHANISM if self.user is None
                                                      else ERR_ILLEGAL_SASL_STATE), "mechanisms": mechanisms})

    def _on_sasl_authenticate(self, hdr, req):
        if self._mechanism is None:
            self._reply(hdr, {"error_code": ERR_ILLEGAL_SASL_STATE, "error_message": "SaslHandshake first",
                              "auth_bytes": b""})
            self._fatal("SaslAuthenticate without SaslHandshake")
            return
        res = self.broker.auth.authenticate(self._mechanism, req["auth_bytes"] or b"", self.peer_loopback)
        self._mechanism = None
        if res.outcome != _auth.OK:
            log.info("%s: Kafka SASL %s refused: %s", self.peer, res.username, res.reason)
            self._reply(hdr, {"error_code": ERR_SASL_AUTHENTICATION_FAILED,
                              "error_message": "Authentication failed: invalid credentials", "auth_bytes": b""})
            self._fatal("authentication failed")      # Kafka closes the connection after a failed SASL
            return
        self.user = res.user
        self.username = res.user.name if res.user is not None else res.username
        self.state = State.OPEN
        self._reply(hdr, {"error_code": 0, "error_message": None, "auth_bytes": b"", "session_lifetime_ms": 0})

    # ------------------------------------------------------------------------------------------ Metadata

    def _broker_entry(self):
        sh = self.shell
        return {"node_id": NODE_ID, "host": sh.advertised_host or self.local[0] or "127.0.0.1",
                "port": sh.advertised_port or self.local[1] or sh.listen_port, "rack": None}

    def _cluster_view(self):
        """shells/cluster/kafka_view when this broker is a cluster member, else None (imported only then)."""
        if self.broker.cluster is None:
            return None
        from riverbed.shells.cluster import kafka_view
        return kafka_view

    def _topic_entry(self, name, version, topic_id=None):
        parts = self.shell.partitions(name) if name is not None else None
        if parts is None:
            if name is None:
                return {"error_code": C.ERR_UNKNOWN_TOPIC_ID, "name": None, "topic_id": topic_id, "partitions": []}
            return {"error_code": C.ERR_UNKNOWN_TOPIC_OR_PARTITION, "name": name, "partitions": []}
        if not self._allowed(READ, name) and not self._allowed(WRITE, name):
            return {"error_code": C.ERR_TOPIC_AUTHORIZATION_FAILED, "name": name, "partitions": []}
        kv = self._cluster_view()
        if kv is None:
            entries = [{"error_code": 0, "partition_index": i, "leader_id": NODE_ID, "leader_epoch": 0,
                        "replica_nodes": [NODE_ID], "isr_nodes": [NODE_ID], "offline_replicas": []}
                       for i in range(len(parts))]
        else:
            entries = []
            for i, stream in enumerate(parts):
                err, leader, epoch, replicas, isr = kv.partition(self.broker.cluster, stream)
                entries.append({"error_code": err, "partition_index": i, "leader_id": leader, "leader_epoch": epoch,
                                "replica_nodes": replicas, "isr_nodes": isr,
                                "offline_replicas": [r for r in replicas if r not in isr]})
        return {"error_code": 0, "name": name, "topic_id": self.shell.topic_id(name), "is_internal": False,
                "partitions": entries}

    def _on_metadata(self, hdr, req):
        slot = self._slot()
        topics = req["topics"]
        by_id = {}
        if topics is None or (hdr.version == 0 and not topics):
            names = self.shell.topics()
            missing = []
        else:
            # Metadata 12 may name topics by id alone (KIP-848 assignments carry ids)
            ids = {bytes(t["topic_id"]) for t in topics if t["name"] is None}
            if ids:
                by_id = {self.shell.topic_id(n): n for n in self.shell.topics()}
            names = [t["name"] if t["name"] is not None else (bytes(t["topic_id"]), by_id.get(bytes(t["topic_id"])))
                     for t in topics]
            missing = [n for n in names if isinstance(n, str) and self.shell.partitions(n) is None]
        auto = req["allow_auto_topic_creation"] if hdr.version >= 4 else True

        def entry(n):
            if isinstance(n, tuple):
                return self._topic_entry(n[1], hdr.version, n[0])
            return self._topic_entry(n, hdr.version)

        def answer():
            kv = self._cluster_view()
            me = self._broker_entry()
            if kv is None:
                brokers, controller = [me], NODE_ID
            else:
                brokers = kv.brokers(self.broker.cluster, me)
                controller = kv.node_id(self.broker.cluster.name)
            self._answer(slot, hdr.api_key, hdr.version, hdr.correlation_id, {
                "throttle_time_ms": 0, "brokers": brokers, "cluster_id": CLUSTER_ID,
                "controller_id": controller, "topics": [entry(n) for n in names]})

        def create_missing(known=()):
            creatable = [n for n in missing if n not in known and auto and self._allowed(CONFIGURE, n)
                         and self._allowed(WRITE, n)]
            if not creatable:
                answer()
                return
            left = [len(creatable)]

            def created(exc):
                left[0] -= 1
                if left[0] == 0:
                    answer()
            for n in creatable:
                self.broker.ensure_stream(n, created)
        if missing and self.broker.cluster is not None:
            # a topic made on another node a moment ago is asked of etcd before it is called unknown
            self.broker.find_streams(missing, self._later(create_missing))
            return
        create_missing()

    def _not_leader(self, topic, index):
        """(NOT_LEADER_OR_FOLLOWER, why) when this cluster member does not lead that partition, else None.
        Kafka answers so (clients then refresh Metadata and go to the leader); a Produce is never
        forwarded to the leader from here."""
        kv = self._cluster_view()
        stream = self.shell.stream_of(topic, index) if kv is not None else None
        if stream is None or kv.leads(self.broker.cluster, stream):
            return None
        return C.ERR_NOT_LEADER_OR_FOLLOWER, f"node {self.broker.cluster.name} does not lead {stream!r}"

    # -------------------------------------------------------------------------------------- CreateTopics

    def _on_create_topics(self, hdr, req):
        slot = self._slot()
        results = []
        todo = []
        for t in req["topics"]:
            name, n = t["name"], t["num_partitions"]
            res = {"name": name, "topic_id": self.shell.topic_id(name), "error_code": 0, "error_message": None,
                   "num_partitions": n if n > 0 else 1, "replication_factor": 1, "configs": []}
            results.append(res)
            if n == -1:
                n = 1
            rf = t["replication_factor"]
            if not self._allowed(CONFIGURE, name):
                res.update(error_code=C.ERR_TOPIC_AUTHORIZATION_FAILED, error_message="not allowed")
            elif not 1 <= n <= MAX_TOPIC_PARTITIONS or t["assignments"]:
                res.update(error_code=C.ERR_INVALID_PARTITIONS,
                           error_message=f"{n} partitions (1 to {MAX_TOPIC_PARTITIONS}, no assignments)")
            elif rf not in (-1, 1):
                res.update(error_code=C.ERR_INVALID_REPLICATION_FACTOR,
                           error_message=f"replication factor {rf}: this broker is one node")
            elif self.shell.partitions(name) is not None or self.broker.has_stream(name):
                res.update(error_code=C.ERR_TOPIC_ALREADY_EXISTS, error_message=f"topic {name!r} exists")
            else:
                try:
                    args = retention_arguments(t["configs"])
                except ValueError as e:
                    res.update(error_code=C.ERR_INVALID_CONFIG, error_message=str(e))
                    continue
                if not req["validate_only"]:
                    todo.append((res, name, n, args))
        left = [len(todo)]

        def answer():
            self._answer(slot, hdr.api_key, hdr.version, hdr.correlation_id,
                         {"throttle_time_ms": 0, "topics": results})
        if not todo:
            answer()
            return

        def done(res, exc):
            if isinstance(exc, StreamExists):
                res.update(error_code=C.ERR_TOPIC_ALREADY_EXISTS, error_message=str(exc))
            elif isinstance(exc, InvalidArgument):
                res.update(error_code=C.ERR_INVALID_TOPIC_EXCEPTION, error_message=str(exc))
            elif exc is not None:
                res.update(error_code=C.ERR_UNKNOWN_SERVER_ERROR, error_message=str(exc))
            left[0] -= 1
            if left[0] == 0:
                answer()
        for res, name, n, args in todo:
            self.shell.create_topic(name, n, args, lambda exc, res=res: done(res, exc))

    # ------------------------------------------------------------------------------------------- Produce

    def _on_produce(self, hdr, req):
        acks = req["acks"]
        slot = self._slot() if acks != 0 else None
        out = []
        waits = []
        if acks not in (0, 1, -1):
            for t in req["topic_data"]:
                out.append({"name": t["name"], "partition_responses": [
                    {"index": p["index"], "error_code": C.ERR_INVALID_REQUIRED_ACKS, "base_offset": -1}
                    for p in t["partition_data"]]})
        else:
            refusal = self.broker.write_refusal()
            for t in req["topic_data"]:
                parts = []
                out.append({"name": t["name"], "partition_responses": parts})
                for p in t["partition_data"]:
                    res = {"index": p["index"], "error_code": 0, "base_offset": -1, "log_append_time_ms": -1,
                           "log_start_offset": -1, "record_errors": [], "error_message": None}
                    parts.append(res)
                    err = self._not_leader(t["name"], p["index"]) or self._produce_partition(
                        t["name"], p, res, refusal, waits)
                    if err:
                        res["error_code"], res["error_message"] = err
        if slot is None:
            return
        left = [len(waits)]

        def answer():
            self._answer(slot, hdr.api_key, hdr.version, hdr.correlation_id,
                         {"responses": out, "throttle_time_ms": 0})
        if not waits:
            answer()
            return

        def stored(res, stream, ids, publisher, result, exc):
            if exc is None:
                # a retried idempotent batch the engine dropped: the offset it got the first time
                res["base_offset"] = (result.first_offset if result.first_offset >= 0
                                      else self.shell.batch_offset(stream, publisher, ids.first))
            elif isinstance(exc, StreamNotFound):
                res["error_code"] = C.ERR_UNKNOWN_TOPIC_OR_PARTITION
            elif isinstance(exc, NotLeaderError):
                # a cluster node that does not lead the partition: the client routes itself to the leader
                res["error_code"] = C.ERR_NOT_LEADER_OR_FOLLOWER
            else:
                res["error_code"] = C.ERR_KAFKA_STORAGE_ERROR
                res["error_message"] = str(exc)
            left[0] -= 1
            if left[0] == 0:
                answer()
        for res, stream, chunk, count, ids, publisher in waits:
            # counted against the connection and the drain; the answer is dropped once it is gone, but an
            # idempotent producer's batch is remembered whatever becomes of this connection
            answered = self._inflight(len(chunk), functools.partial(stored, res, stream, ids, publisher))

            def cb(result, exc, stream=stream, ids=ids, publisher=publisher, answered=answered):
                if exc is None and ids is not None and result.first_offset >= 0:
                    self.shell.remember_batch(stream, publisher, ids.first, result.first_offset)
                answered(result, exc)
            # one chunk built in one pass (codec.stored_batches); an idempotent producer's sequences are the
            # engine's publisher sequences, which drop a retried batch; the writer computes the CRC.
            # forward=False: in a cluster, Kafka answers NOT_LEADER_OR_FOLLOWER and its clients route themselves
            self.broker.append_chunk(stream, chunk, ids, publisher, cb, count, count, crc_done=False, forward=False)
        # the kernel's data_received pauses reading past the broker-wide in-flight budget

    def _produce_partition(self, topic, p, res, refusal, waits):
        """Check and decode one partition's batches; queue its append in ``waits``. Returns (error code,
        message) or None."""
        stream = self.shell.stream_of(topic, p["index"])
        if stream is None:
            return C.ERR_UNKNOWN_TOPIC_OR_PARTITION, None
        if not self._allowed(WRITE, stream):
            return C.ERR_TOPIC_AUTHORIZATION_FAILED, None
        if refusal is not None:
            return C.ERR_KAFKA_STORAGE_ERROR, str(refusal)
        data = p["records"]
        if not data:
            return None
        try:
            chunk, count, batches = C.stored_batches(data, self.limits.max_decompressed_size, R.to_stored)
        except C.BatchTooLarge as e:
            _limits.reject(LISTENER, _limits.REASON_DECOMPRESSED_SIZE, str(e), self.peer)
            return C.ERR_MESSAGE_TOO_LARGE, str(e)
        except C.CorruptBatch as e:
            return C.ERR_CORRUPT_MESSAGE, str(e)
        except C.UnsupportedCompression as e:
            return C.ERR_UNSUPPORTED_COMPRESSION_TYPE, str(e)
        seqs = []
        publisher = None
        plain = False
        for b in batches:
            if b.attributes & C.ATTR_CONTROL:
                continue
            if b.attributes & C.ATTR_TRANSACTIONAL:
                return C.ERR_INVALID_RECORD, "transactions are not served"
            if b.producer_id >= 0 and b.base_sequence >= 0:
                ref = producer_reference(b.producer_id, b.producer_epoch)
                if publisher is not None and ref != publisher:
                    return C.ERR_INVALID_RECORD, "batches of two producers in one partition"
                if plain:
                    return C.ERR_INVALID_RECORD, "idempotent and plain batches in one partition"
                publisher = ref
                seqs.append((b.base_sequence, b.records))
            elif publisher is not None:
                return C.ERR_INVALID_RECORD, "idempotent and plain batches in one partition"
            else:
                plain = True
        if count:
            waits.append((res, stream, chunk, count, _sequence_ids(seqs) if publisher is not None else None,
                          publisher))
        return None

    # --------------------------------------------------------------------------------------------- Fetch

    def _on_fetch(self, hdr, req):
        fetch = _Fetch(self, hdr, req, self._slot())
        unknown = [t["topic"] for t in req["topics"] if self.broker.cluster is not None
                   and self.shell.partitions(t["topic"]) is None]
        if unknown:
            # in a cluster, a topic made on another node a moment ago is asked of etcd first
            self.broker.find_streams(unknown, self._later(lambda found: fetch.run()))
            return
        fetch.run()

    def _unknown_here(self, stream):
        """The error of a read of ``stream`` that this node holds no copy of: NOT_LEADER_OR_FOLLOWER when a
        cluster places it on other nodes (the client asks Metadata again and goes to its leader), else
        UNKNOWN_TOPIC_OR_PARTITION."""
        if self.broker.cluster is not None and self.broker.has_stream_anywhere(stream):
            return C.ERR_NOT_LEADER_OR_FOLLOWER
        return C.ERR_UNKNOWN_TOPIC_OR_PARTITION

    # --------------------------------------------------------------------------------------- ListOffsets

    def _on_list_offsets(self, hdr, req):
        topics = []
        budget = [TIME_SCAN_BUDGET]
        for t in req["topics"]:
            parts = []
            topics.append({"name": t["name"], "partitions": parts})
            for p in t["partitions"]:
                res = {"partition_index": p["partition_index"], "error_code": 0, "timestamp": -1, "offset": -1,
                       "leader_epoch": 0}
                parts.append(res)
                stream = self.shell.stream_of(t["name"], p["partition_index"])
                if stream is None:
                    res["error_code"] = C.ERR_UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if not self._allowed(READ, stream):
                    res["error_code"] = C.ERR_TOPIC_AUTHORIZATION_FAILED
                    continue
                try:
                    ts = p["timestamp"]
                    if ts == TS_LATEST:
                        res["offset"] = self.broker.resolve(stream, OffsetSpec.next())
                    elif ts == TS_EARLIEST:
                        res["offset"] = self.broker.resolve(stream, OffsetSpec.first())
                    elif ts < 0:
                        res["error_code"] = C.ERR_INVALID_REQUEST
                    else:
                        res["offset"], res["timestamp"] = self._offset_for_time(stream, ts, budget)
                except StreamNotFound:
                    res["error_code"] = self._unknown_here(stream)
                except RiverbedError:
                    res["error_code"] = C.ERR_KAFKA_STORAGE_ERROR
        self._reply(hdr, {"throttle_time_ms": 0, "topics": topics})

    def _offset_for_time(self, stream, ts, budget):
        """The first record whose timestamp is at or after ``ts``, record by record: (offset, its
        timestamp), or (high watermark, -1) when there is none.

        A record's timestamp is its creation time, set by the producer before the broker stored it, so
        the scan starts at the first chunk stored at or after ``ts - TIME_SKEW_MS`` (the engine's index;
        a record created more than that after it was stored is not looked for earlier). ``budget`` (a
        one-item list) bounds the records decoded per request: once spent, the answer is the first chunk
        stored at or after ``ts`` (chunk precision), so no ListOffsets can hold the loop for long."""
        pos = self.broker.resolve(stream, OffsetSpec.timestamp(max(0, ts - TIME_SKEW_MS)))
        while True:
            batches, nxt = self.broker.read_records(stream, pos, READ_CHUNKS)
            if nxt == pos:
                return self.broker.resolve(stream, OffsetSpec.next()), -1
            for batch in batches:
                chunk_ts = batch.chunk_timestamp
                for offset, rec in batch:
                    budget[0] -= 1
                    if budget[0] < 0:
                        return self.broker.resolve(stream, OffsetSpec.timestamp(ts)), -1
                    rts = R.from_stored(rec, chunk_ts)[0]
                    if rts >= ts:
                        return offset, rts
            pos = nxt


class _Fetch:
    """One Fetch request: read what is there; when it is less than ``min_bytes``, wait for a commit on
    any of its partitions or for ``max_wait_ms``, then read again and answer."""

    __slots__ = ("s", "hdr", "req", "slot", "cancels", "timer", "done")

    def __init__(self, session, hdr, req, slot):
        self.s = session
        self.hdr = hdr
        self.req = req
        self.slot = slot
        self.cancels = []
        self.timer = None
        self.done = False

    def run(self):
        body, size, waits = self._read()
        wait_ms = min(self.req["max_wait_ms"], MAX_WAIT_MS_CAP)
        if size >= max(1, self.req["min_bytes"]) or wait_ms <= 0 or not waits or self.s.shell.call_later is None:
            self._finish(body)
            return
        s = self.s
        s._fetches.add(self)
        for stream, offset in waits:
            self.cancels.append(s.broker.watch(stream, offset, self._woke))
        # the shell's timer runs outside the listener: under this connection's guard, as the io's would
        self.timer = s.shell.call_later(wait_ms / 1000.0, functools.partial(s.guard, self._expired))

    def _woke(self, exc):
        if not self.done:
            self.cancel()
            self._finish(self._read()[0])

    def _expired(self):
        self.timer = None
        self._woke(None)

    def cancel(self):
        self.done = True
        for c in self.cancels:
            c()
        self.cancels = []
        if self.timer is not None:
            self.timer()
            self.timer = None
        self.s._fetches.discard(self)

    def _finish(self, body):
        self.done = True
        self.s._answer(self.slot, self.hdr.api_key, self.hdr.version, self.hdr.correlation_id, body)

    def _read(self):
        s, req = self.s, self.req
        # the broker caps what one answer holds whatever the client asks (Kafka's fetch.max.bytes)
        budget = min(req["max_bytes"], FETCH_MAX_BYTES)
        size = 0
        waits = []
        responses = []
        for t in req["topics"]:
            parts = []
            responses.append({"topic": t["topic"], "partitions": parts})
            for p in t["partitions"]:
                res = {"partition_index": p["partition"], "error_code": 0, "high_watermark": -1,
                       "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
                       "preferred_read_replica": -1, "records": b""}
                parts.append(res)
                stream = s.shell.stream_of(t["topic"], p["partition"])
                if stream is None:
                    res["error_code"] = C.ERR_UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if not s._allowed(READ, stream):
                    res["error_code"] = C.ERR_TOPIC_AUTHORIZATION_FAILED
                    continue
                try:
                    first, hw = s.shell.offsets(stream)
                except StreamNotFound:
                    res["error_code"] = s._unknown_here(stream)
                    continue
                res.update(high_watermark=hw, last_stable_offset=hw, log_start_offset=first)
                off = p["fetch_offset"]
                if off < first or off > hw:
                    res["error_code"] = C.ERR_OFFSET_OUT_OF_RANGE
                    continue
                if off == hw:
                    waits.append((stream, off))
                    continue
                limit = min(p["partition_max_bytes"], budget - size)
                # Kafka returns at least one batch whatever the limits, so a consumer always progresses
                data = read_batches(s.broker, stream, off, limit if size else max(limit, 1))
                res["records"] = data
                size += len(data)
        body = {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": responses}
        return body, size, waits


class _ProducerIds(PublishingIds):
    """An idempotent producer's sequences as the engine's PublishingIds, packed one id a record only when
    the writer asks for them: its duplicate check reads ``first``, ``last``, ``increasing`` and the count,
    and needs the ids themselves only for a batch that is a retry."""

    __slots__ = ("_seqs", "_count", "_raw")

    def __init__(self, seqs, first, last, increasing):    # noqa: super().__init__ would pack them now
        self._seqs = seqs
        self._count = sum(n for _, n in seqs)
        self._raw = None
        self.first = first
        self.last = last
        self.increasing = increasing
        self._ints = None

    def __len__(self):
        return self._count

    @property
    def raw(self):
        if self._raw is None:
            self._raw = wire.kafka_sequence_ids(self._seqs)
        return self._raw


def _sequence_ids(seqs):
    """An idempotent producer's sequences, ``(base sequence, records)`` per batch, as the engine's
    PublishingIds: first, last and whether they rise, so the writer's duplicate check costs nothing per
    record unless a batch is a retry (the ids are packed then: :class:`_ProducerIds`)."""
    seqs = [s for s in seqs if s[1]]
    increasing = all(a[0] + a[1] <= b[0] for a, b in zip(seqs, seqs[1:]))
    last_base, last_n = seqs[-1]
    return _ProducerIds(seqs, seqs[0][0], last_base + last_n - 1, increasing)


def _api_keys():
    return [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(C.SERVED.items())]


def _served(api_key):
    lo, hi = C.SERVED[api_key]
    return range(lo, hi + 1)


_H, _O = State.HANDSHAKE, State.OPEN    # before SASL (with --users), after it
COMMANDS = commands(KafkaSession, {key: (name, min_state, _served(key)) for key, name, min_state in (
    (C.API_API_VERSIONS, "ApiVersions", _H),
    (C.API_SASL_HANDSHAKE, "SaslHandshake", _H),
    (C.API_SASL_AUTHENTICATE, "SaslAuthenticate", _H),
    (C.API_METADATA, "Metadata", _O),
    (C.API_CREATE_TOPICS, "CreateTopics", _O),
    (C.API_PRODUCE, "Produce", _O),
    (C.API_FETCH, "Fetch", _O),
    (C.API_LIST_OFFSETS, "ListOffsets", _O),
    (C.API_FIND_COORDINATOR, "FindCoordinator", _O),
    (C.API_JOIN_GROUP, "JoinGroup", _O),
    (C.API_SYNC_GROUP, "SyncGroup", _O),
    (C.API_HEARTBEAT, "Heartbeat", _O),
    (C.API_LEAVE_GROUP, "LeaveGroup", _O),
    (C.API_OFFSET_COMMIT, "OffsetCommit", _O),
    (C.API_OFFSET_FETCH, "OffsetFetch", _O),
    (C.API_LIST_GROUPS, "ListGroups", _O),
    (C.API_DESCRIBE_GROUPS, "DescribeGroups", _O),
    (C.API_DELETE_TOPICS, "DeleteTopics", _O),
    (C.API_CREATE_PARTITIONS, "CreatePartitions", _O),
    (C.API_DESCRIBE_CONFIGS, "DescribeConfigs", _O),
    (C.API_INIT_PRODUCER_ID, "InitProducerId", _O),
    (C.API_CONSUMER_GROUP_HEARTBEAT, "ConsumerGroupHeartbeat", _O),
    (C.API_CONSUMER_GROUP_DESCRIBE, "ConsumerGroupDescribe", _O),
)})
"""API key -> Command (handler ``_on_<name>(session, header, request dict)``, lowest state, the served
versions: codec.SERVED). What is here is what ApiVersions advertises."""

assert set(COMMANDS) == set(C.SERVED), "ApiVersions advertises exactly the served APIs"
