"""rstream 0.20's SAC super stream tests against RabbitMQ 3.13.7's frames (issue 19, item 5: "if the cause
is in the client, show that the same client code path fails against RabbitMQ's exact frames").

No RabbitMQ 3.13 can run on this machine (Debian ships 3.10, which has neither CreateSuperStream nor
ConsumerUpdate), so this module holds a scripted stand-in that answers every frame rstream 0.20.9 sends on
this path with the bytes RabbitMQ 3.13.7 writes, built from its sources (facts only, nothing copied):

* frame layouts: ``deps/rabbitmq_stream_common/src/rabbit_stream_core.erl`` (``frame/1``,
  ``response_body/1``, ``request_body/1``): PeerProperties' map in Erlang's key order, SASL mechanisms
  PLAIN and AMQPLAIN, the server's Tune after SaslAuthenticate, Open's advertised_host/_port, Metadata with
  its endpoint list, Partitions, the ConsumerUpdate request (subscription id, active flag);
* the reader, ``deps/rabbitmq_stream/src/rabbit_stream_reader.erl``: the Subscribe response goes out
  before the coordinator's ConsumerUpdate; a SAC subscription has no reader until the answer to an
  "active" ConsumerUpdate, which starts it at the answered offset (``none``: the Subscribe's); Credit to an
  inactive subscription is kept and answered with PRECONDITION_FAILED; an inactive subscriber's answer to a
  stepping-down update makes the coordinator activate the next;
* the coordinator, ``deps/rabbit/src/rabbit_stream_sac_coordinator.erl``: for a partition of index ``p``
  the active consumer is ``consumers[p rem len(consumers)]`` in arrival order; a newcomer is passive; if
  the evaluation changes, the current active is told ``active=false`` (stepping down) and the new one is
  activated once that answer arrives; removal evaluates again.
* storage as Osiris presents it: one chunk per Publish frame (48-byte header, magic/version 0x50, epoch
  1, CRC32 of the data, simple entries), one PublishConfirm per chunk.

It keeps nothing but that: streams in memory, no durability. It is a test double of RabbitMQ for the
client, not a broker.

What it shows: the same client code (``_old_rstream_sac.py``, rstream's own scenario with timestamps)
against these frames has the same shape as against Riverbed: every message is delivered once, each
consumer owns one partition, everything is counted shortly after the client's last Publish frame, and
rstream's own assertion ("10,000 counted 1 s after the last ``send()`` returned") holds exactly when the
client's last Publish frame left early enough. When that frame leaves after the deadline (on this shared
machine it always does: the 0.5 s flush timer encodes the partitions one after another on the event loop
that also runs the three consumers' callbacks), rstream's assertion fails against RabbitMQ's frames too,
with the partitions the client flushed last at 0: the report's "3,324 + 0 + 3,379".
"""

import asyncio
import json
import struct
import threading
import time
import zlib
from collections import defaultdict

import pytest
from test_rmq_compat import old_rstream  # noqa: F401 - the session fixture: rstream 0.20.x's python
from test_rmq_sac_rstream_0_20 import MESSAGES, check, run_scenario

pytestmark = pytest.mark.integration

# command keys (rabbit_stream_core.erl command_id/1)
CMD_DECLARE_PUBLISHER, CMD_PUBLISH, CMD_PUBLISH_CONFIRM = 0x01, 0x02, 0x03
CMD_QUERY_PUBLISHER_SEQUENCE, CMD_DELETE_PUBLISHER, CMD_SUBSCRIBE = 0x05, 0x06, 0x07
CMD_DELIVER, CMD_CREDIT = 0x08, 0x09
CMD_STORE_OFFSET, CMD_QUERY_OFFSET, CMD_UNSUBSCRIBE, CMD_METADATA = 0x0A, 0x0B, 0x0C, 0x0F
CMD_PEER_PROPERTIES, CMD_SASL_HANDSHAKE, CMD_SASL_AUTHENTICATE, CMD_TUNE = 0x11, 0x12, 0x13, 0x14
CMD_OPEN, CMD_CLOSE, CMD_HEARTBEAT, CMD_ROUTE, CMD_PARTITIONS = 0x15, 0x16, 0x17, 0x18, 0x19
CMD_CONSUMER_UPDATE, CMD_EXCHANGE_COMMAND_VERSIONS = 0x1A, 0x1B
CMD_STREAM_STATS, CMD_CREATE_SUPER_STREAM, CMD_DELETE_SUPER_STREAM = 0x1C, 0x1D, 0x1E
RESPONSE = 0x8000
CODE_OK, CODE_STREAM_DOES_NOT_EXIST, CODE_SUBSCRIPTION_DOES_NOT_EXIST = 1, 2, 4
CODE_STREAM_ALREADY_EXISTS, CODE_PRECONDITION_FAILED, CODE_NO_OFFSET = 5, 17, 19
OFFSET_FIRST, OFFSET_LAST, OFFSET_NEXT, OFFSET_OFFSET, OFFSET_TIMESTAMP = 1, 2, 3, 4, 5

# what RabbitMQ 3.13.7 says of itself in PeerProperties (rabbit_stream_reader.erl; rabbit.hrl's messages)
RMQ_SERVER_PROPERTIES = {
    "cluster_name": "rabbit@localhost",
    "copyright": "Copyright (c) 2007-2024 Broadcom Inc and/or its subsidiaries",
    "information": "Licensed under the MPL 2.0. Website: https://rabbitmq.com",
    "platform": "Erlang/OTP 26.2.5",
    "product": "RabbitMQ",
    "version": "3.13.7",
}
RMQ_SASL_MECHANISMS = ("PLAIN", "AMQPLAIN")        # rabbit's default auth_mechanisms
RMQ_FRAME_MAX, RMQ_HEARTBEAT = 1048576, 60
# (command, min version, max version), rabbit_stream_utils:command_versions/0 with stream_filtering on
RMQ_COMMAND_VERSIONS = ((CMD_DECLARE_PUBLISHER, 1, 1), (CMD_PUBLISH, 1, 2), (CMD_QUERY_PUBLISHER_SEQUENCE, 1, 1),
                        (CMD_DELETE_PUBLISHER, 1, 1), (CMD_SUBSCRIBE, 1, 1), (CMD_CREDIT, 1, 1),
                        (CMD_STORE_OFFSET, 1, 1), (CMD_QUERY_OFFSET, 1, 1), (CMD_UNSUBSCRIBE, 1, 1), (0x0D, 1, 1),
                        (0x0E, 1, 1), (CMD_METADATA, 1, 1), (CMD_CLOSE, 1, 1), (CMD_HEARTBEAT, 1, 1),
                        (CMD_ROUTE, 1, 1), (CMD_PARTITIONS, 1, 1), (CMD_STREAM_STATS, 1, 1),
                        (CMD_CREATE_SUPER_STREAM, 1, 1), (CMD_DELETE_SUPER_STREAM, 1, 1))
CHUNK_HEADER = struct.Struct(">BBHIqQQIIIB3s")     # Osiris: magic/version .. bloom size, reserved
CHUNK_MAGIC_VERSION, CHUNK_TYPE_USER, CHUNK_EPOCH = 0x50, 0, 1


# ------------------------------------------------------------------------------------------ encoding

def _frame(*parts):
    body = b"".join(parts)
    return struct.pack(">I", len(body)) + body


def _str(s):
    b = s.encode()
    return struct.pack(">H", len(b)) + b


def _map(d):
    # small Erlang maps fold in key order
    return struct.pack(">I", len(d)) + b"".join(_str(k) + _str(v) for k, v in sorted(d.items()))


def _response(key, corr, body=b""):
    return _frame(struct.pack(">HHI", RESPONSE | key, 1, corr), body)


def _ok(key, corr, code=CODE_OK):
    return _response(key, corr, struct.pack(">H", code))


class _Reader:
    def __init__(self, data, pos=0):
        self.data, self.pos = data, pos

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v if len(v) > 1 else v[0]

    def str(self):
        n = self.take(">h")
        if n < 0:
            return None
        s = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def bytes32(self):
        n = self.take(">I")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def strs(self):
        return [self.str() for _ in range(self.take(">I"))]

    def map(self):
        return {self.str(): self.str() for _ in range(self.take(">I"))}

    def offset_spec(self):
        kind = self.take(">H")
        return (kind, self.take(">q")) if kind in (OFFSET_OFFSET, OFFSET_TIMESTAMP) else (kind, None)


def chunk(first_offset, messages, timestamp_ms):
    data = b"".join(struct.pack(">I", len(m)) + m for m in messages)      # simple entries
    header = CHUNK_HEADER.pack(CHUNK_MAGIC_VERSION, CHUNK_TYPE_USER, len(messages), len(messages), timestamp_ms,
                               CHUNK_EPOCH, first_offset, zlib.crc32(data), len(data), 0, 0, b"\0\0\0")
    return header + data


# ------------------------------------------------------------------------------------------ the stand-in

class _Sub:
    def __init__(self, conn, sub_id, stream, spec, credit, props):
        self.conn, self.sub_id, self.stream, self.spec = conn, sub_id, stream, spec
        self.credit, self.props = credit, props
        self.sac = props.get("single-active-consumer") == "true"
        self.group = props.get("name")
        self.active = not self.sac
        self.next_chunk = None         # None: no reader (a SAC subscription not told to read)


class RabbitMQ313Frames:
    """A scripted RabbitMQ 3.13.7 for one client scenario: see the module docstring. Runs its own event
    loop in a thread; ``start()`` returns the port; ``stop()`` ends it. ``log`` records (monotonic time,
    connection, "in"/"out", command key, detail) for the frames that matter to the SAC sequence."""

    def __init__(self):
        self.streams = {}               # stream -> [(first offset, [messages])]
        self.next_offset = {}
        self.super_streams = {}         # super stream -> [partitions in binding order]
        self.groups = defaultdict(list)  # (stream, group name) -> [_Sub] in arrival order
        self.publishers = {}            # (connection's writer, publisher id) -> stream
        self.plain_subs = []            # subscriptions without single-active-consumer
        self.log = []
        self.errors = []
        self._loop = self._server = None
        self._thread = None
        self._conns = set()

    # ---- lifecycle

    def start(self):
        ready = threading.Event()

        def run():
            self._loop = asyncio.new_event_loop()
            self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
            ready.set()
            self._loop.run_forever()
            self._loop.close()
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self._server.sockets[0].getsockname()[1]

    def stop(self):
        def close():
            self._server.close()
            for w in list(self._conns):
                w.close()
            self._loop.stop()
        self._loop.call_soon_threadsafe(close)
        self._thread.join(10)

    # ---- per connection

    async def _serve(self, reader, writer):
        conn = {"w": writer, "subs": {}, "corr": 0, "pending": {}, "port": writer.get_extra_info("sockname")[1]}
        self._conns.add(writer)
        try:
            while True:
                size = struct.unpack(">I", await reader.readexactly(4))[0]
                self._handle(conn, await reader.readexactly(size))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception as e:     # a frame this stand-in does not script: the test reports it
            self.errors.append(f"{type(e).__name__}: {e}")
        finally:
            self._conns.discard(writer)
            for sub in list(conn["subs"].values()):
                self._unregister(sub)
            for key in [k for k in self.publishers if k[0] is writer]:
                del self.publishers[key]
            writer.close()

    def _send(self, conn, data):
        conn["w"].write(data)

    def _handle(self, conn, body):
        key, _version = struct.unpack_from(">HH", body)
        r = _Reader(body, 4)
        if key == CMD_PUBLISH:
            return self._publish(conn, r)
        if key == CMD_CREDIT:
            return self._credit(conn, *r.take(">BH"))
        if key in (CMD_HEARTBEAT, CMD_TUNE, RESPONSE | CMD_TUNE, CMD_STORE_OFFSET):
            return None
        if key == RESPONSE | CMD_CONSUMER_UPDATE:
            corr, code = r.take(">IH")
            return self._consumer_update_answer(conn, corr, r.offset_spec())
        corr = r.take(">I")
        handler = self._REQUESTS.get(key)
        if handler is None:
            raise ValueError(f"no script for command 0x{key:04x}")
        return handler(self, conn, corr, r)

    # ---- connection setup (rabbit_stream_reader handle_frame_pre_auth)

    def _peer_properties(self, conn, corr, r):
        body = struct.pack(">H", CODE_OK) + _map(RMQ_SERVER_PROPERTIES)
        self._send(conn, _response(CMD_PEER_PROPERTIES, corr, body))

    def _sasl_handshake(self, conn, corr, r):
        mechs = b"".join(_str(m) for m in RMQ_SASL_MECHANISMS)
        body = struct.pack(">HI", CODE_OK, len(RMQ_SASL_MECHANISMS)) + mechs
        self._send(conn, _response(CMD_SASL_HANDSHAKE, corr, body))

    def _sasl_authenticate(self, conn, corr, r):
        self._send(conn, _ok(CMD_SASL_AUTHENTICATE, corr))
        self._send(conn, _frame(struct.pack(">HHII", CMD_TUNE, 1, RMQ_FRAME_MAX, RMQ_HEARTBEAT)))

    def _open(self, conn, corr, r):
        # stream.advertised_host/port as ci/rabbitmq.sh configures them: the loopback address and port
        props = {"advertised_host": "127.0.0.1", "advertised_port": str(conn["port"])}
        self._send(conn, _response(CMD_OPEN, corr, struct.pack(">H", CODE_OK) + _map(props)))

    def _close(self, conn, corr, r):
        self._send(conn, _ok(CMD_CLOSE, corr))

    def _exchange_command_versions(self, conn, corr, r):
        body = struct.pack(">HI", CODE_OK, len(RMQ_COMMAND_VERSIONS))
        body += b"".join(struct.pack(">HHH", *c) for c in RMQ_COMMAND_VERSIONS)
        self._send(conn, _response(CMD_EXCHANGE_COMMAND_VERSIONS, corr, body))

    # ---- topology

    def _create_super_stream(self, conn, corr, r):
        name, partitions, _keys, _args = r.str(), r.strs(), r.strs(), r.map()
        if name in self.super_streams or any(p in self.streams for p in partitions):
            return self._send(conn, _ok(CMD_CREATE_SUPER_STREAM, corr, CODE_STREAM_ALREADY_EXISTS))
        self.super_streams[name] = partitions
        for p in partitions:
            self.streams[p], self.next_offset[p] = [], 0
        self._send(conn, _ok(CMD_CREATE_SUPER_STREAM, corr))

    def _delete_super_stream(self, conn, corr, r):
        name = r.str()
        partitions = self.super_streams.pop(name, None)
        if partitions is None:
            return self._send(conn, _ok(CMD_DELETE_SUPER_STREAM, corr, CODE_STREAM_DOES_NOT_EXIST))
        for p in partitions:
            self.streams.pop(p, None)
        self._send(conn, _ok(CMD_DELETE_SUPER_STREAM, corr))

    def _partitions(self, conn, corr, r):
        parts = self.super_streams.get(r.str())
        code = CODE_OK if parts is not None else CODE_STREAM_DOES_NOT_EXIST
        parts = parts or []
        body = struct.pack(">HI", code, len(parts)) + b"".join(_str(p) for p in parts)
        self._send(conn, _response(CMD_PARTITIONS, corr, body))

    def _metadata(self, conn, corr, r):
        streams = r.strs()
        body = struct.pack(">I", 1) + struct.pack(">H", 0) + _str("127.0.0.1") + struct.pack(">I", conn["port"])
        entries = []
        for s in sorted(set(streams)):
            if s in self.streams:
                entries.append(_str(s) + struct.pack(">HhI", CODE_OK, 0, 0))
            else:
                entries.append(_str(s) + struct.pack(">HhI", CODE_STREAM_DOES_NOT_EXIST, -1, 0))
        # maps:fold prepends: the streams come out in reverse key order
        body += struct.pack(">I", len(entries)) + b"".join(reversed(entries))
        self._send(conn, _response(CMD_METADATA, corr, body))

    # ---- publishing

    def _declare_publisher(self, conn, corr, r):
        pub_id, _ref, stream = r.take(">B"), r.str(), r.str()
        if stream not in self.streams:
            return self._send(conn, _ok(CMD_DECLARE_PUBLISHER, corr, CODE_STREAM_DOES_NOT_EXIST))
        self.publishers[(conn["w"], pub_id)] = stream
        self._send(conn, _ok(CMD_DECLARE_PUBLISHER, corr))

    def _query_publisher_sequence(self, conn, corr, r):
        self._send(conn, _response(CMD_QUERY_PUBLISHER_SEQUENCE, corr, struct.pack(">HQ", CODE_OK, 0)))

    def _delete_publisher(self, conn, corr, r):
        self.publishers.pop((conn["w"], r.take(">B")), None)
        self._send(conn, _ok(CMD_DELETE_PUBLISHER, corr))

    def _publish(self, conn, r):
        pub_id, count = r.take(">BI")
        stream = self.publishers[(conn["w"], pub_id)]
        ids, messages = [], []
        for _ in range(count):
            ids.append(r.take(">Q"))
            messages.append(r.bytes32())
        self.log.append((time.monotonic(), id(conn), "in", CMD_PUBLISH, (stream, count)))
        first = self.next_offset[stream]
        self.streams[stream].append((first, messages))
        self.next_offset[stream] = first + count
        self._send(conn, _frame(struct.pack(">HHBI", CMD_PUBLISH_CONFIRM, 1, pub_id, len(ids)),
                                b"".join(struct.pack(">Q", i) for i in ids)))
        for subs in self.groups.values():
            for sub in subs:
                if sub.stream == stream:
                    self._send_chunks(sub)
        for other in self.plain_subs:
            if other.stream == stream:
                self._send_chunks(other)

    # ---- consuming

    def _subscribe(self, conn, corr, r):
        sub_id, stream, spec, credit = r.take(">B"), r.str(), r.offset_spec(), r.take(">H")
        props = r.map() if r.pos < len(r.data) else {}
        if stream not in self.streams:
            return self._send(conn, _ok(CMD_SUBSCRIBE, corr, CODE_STREAM_DOES_NOT_EXIST))
        sub = _Sub(conn, sub_id, stream, spec, credit, props)
        conn["subs"][sub_id] = sub
        self._send(conn, _ok(CMD_SUBSCRIBE, corr))       # the response first, then the coordinator
        self.log.append((time.monotonic(), id(conn), "in", CMD_SUBSCRIBE, (stream, sub_id)))
        if not sub.sac:
            self.plain_subs.append(sub)
            self._start_reader(sub, spec)
            return None
        group = self.groups[(stream, sub.group)]
        group.append(sub)
        if len(group) == 1:
            return self._notify(sub, True)
        current = next((c for c in group if c.active), None)
        if current is not None and self._evaluate(group) is not current:
            self._notify(current, False, stepping_down=True)
        return None

    def _partition_index(self, sub):
        parts = self.super_streams.get(sub.props.get("super-stream"), [])
        return parts.index(sub.stream) if sub.stream in parts else -1

    def _evaluate(self, group):
        return group[self._partition_index(group[0]) % len(group)]

    def _notify(self, sub, active, stepping_down=False):
        # the reader closes an inactive subscription's segment reader before it sends the update
        sub.active = active
        if not active:
            sub.next_chunk = None
        conn = sub.conn
        conn["corr"] += 1
        conn["pending"][conn["corr"]] = (sub, stepping_down)
        self.log.append((time.monotonic(), id(conn), "out", CMD_CONSUMER_UPDATE, (sub.stream, sub.sub_id, active)))
        self._send(conn, _frame(struct.pack(">HHIBB", CMD_CONSUMER_UPDATE, 1, conn["corr"], sub.sub_id, int(active))))

    def _consumer_update_answer(self, conn, corr, spec):
        sub, stepping_down = conn["pending"].pop(corr, (None, False))
        if sub is None or conn["subs"].get(sub.sub_id) is not sub:
            return None
        if sub.active:
            self._start_reader(sub, sub.spec if spec[0] == 0 else spec)
        elif stepping_down:
            group = self.groups.get((sub.stream, sub.group))
            if group:
                nxt = self._evaluate(group)
                self._notify(nxt, True)
        return None

    def _start_reader(self, sub, spec):
        chunks = self.streams.get(sub.stream, [])
        kind, value = spec
        if kind == OFFSET_FIRST:
            sub.next_chunk = 0
        elif kind == OFFSET_LAST:
            sub.next_chunk = max(len(chunks) - 1, 0)
        elif kind == OFFSET_NEXT:
            sub.next_chunk = len(chunks)
        else:
            sub.next_chunk = next((i for i, (first, ms) in enumerate(chunks) if first + len(ms) > (value or 0)),
                                  len(chunks))
        self._send_chunks(sub)

    def _send_chunks(self, sub):
        chunks = self.streams.get(sub.stream, [])
        while sub.next_chunk is not None and sub.credit > 0 and sub.next_chunk < len(chunks):
            first, messages = chunks[sub.next_chunk]
            self._send(sub.conn, _frame(struct.pack(">HHB", CMD_DELIVER, 1, sub.sub_id),
                                        chunk(first, messages, int(time.time() * 1000))))
            self.log.append((time.monotonic(), id(sub.conn), "out", CMD_DELIVER,
                             (sub.stream, sub.sub_id, len(messages))))
            sub.credit -= 1
            sub.next_chunk += 1

    def _credit(self, conn, sub_id, credit):
        sub = conn["subs"].get(sub_id)
        if sub is None:
            return self._send(conn, _frame(struct.pack(">HHHB", RESPONSE | CMD_CREDIT, 1,
                                                       CODE_SUBSCRIPTION_DOES_NOT_EXIST, sub_id)))
        sub.credit += credit
        if sub.next_chunk is None:
            return self._send(conn, _frame(struct.pack(">HHHB", RESPONSE | CMD_CREDIT, 1,
                                                       CODE_PRECONDITION_FAILED, sub_id)))
        return self._send_chunks(sub)

    def _unsubscribe(self, conn, corr, r):
        sub = conn["subs"].get(r.take(">B"))
        if sub is None:
            return self._send(conn, _ok(CMD_UNSUBSCRIBE, corr, CODE_SUBSCRIPTION_DOES_NOT_EXIST))
        self._unregister(sub)
        return self._send(conn, _ok(CMD_UNSUBSCRIBE, corr))

    def _unregister(self, sub):
        sub.conn["subs"].pop(sub.sub_id, None)
        if not sub.sac:
            self.plain_subs.remove(sub)
            return
        group = self.groups.get((sub.stream, sub.group))
        if not group or sub not in group:
            return
        group.remove(sub)
        if not group:
            return
        current = next((c for c in group if c.active), None)
        if current is not None:
            if self._evaluate(group) is not current:
                self._notify(current, False, stepping_down=True)
        elif sub.active:
            self._notify(self._evaluate(group), True)

    def _query_offset(self, conn, corr, r):
        self._send(conn, _response(CMD_QUERY_OFFSET, corr, struct.pack(">HQ", CODE_NO_OFFSET, 0)))

    _REQUESTS = {
        CMD_PEER_PROPERTIES: _peer_properties, CMD_SASL_HANDSHAKE: _sasl_handshake,
        CMD_SASL_AUTHENTICATE: _sasl_authenticate, CMD_OPEN: _open, CMD_CLOSE: _close,
        CMD_EXCHANGE_COMMAND_VERSIONS: _exchange_command_versions, CMD_CREATE_SUPER_STREAM: _create_super_stream,
        CMD_DELETE_SUPER_STREAM: _delete_super_stream, CMD_PARTITIONS: _partitions, CMD_METADATA: _metadata,
        CMD_DECLARE_PUBLISHER: _declare_publisher, CMD_QUERY_PUBLISHER_SEQUENCE: _query_publisher_sequence,
        CMD_DELETE_PUBLISHER: _delete_publisher, CMD_SUBSCRIBE: _subscribe, CMD_UNSUBSCRIBE: _unsubscribe,
        CMD_QUERY_OFFSET: _query_offset,
    }


# ------------------------------------------------------------------------------------------ the tests

@pytest.fixture
def rabbitmq_frames():
    stand_in = RabbitMQ313Frames()
    port = stand_in.start()
    yield stand_in, port
    stand_in.stop()


# rstream 0.20.9's own fixtures: conftest's --rmq-host default "localhost", --rmq-port as given on the
# command line (a string; pytest's addoption has no type), vhost "/", guest/guest, "test-super-stream"
# with partitions -0..-2 bound to key1..key3, group "consumer-group-1"
RSTREAM_OWN_SETUP = dict(super_stream="test-super-stream", group="consumer-group-1", host="localhost",
                         port_as_str=True, n=MESSAGES)
MARGIN_S = 0.6          # a partition written this long before rstream's deadline is counted by then


def consumer_updates_before_publish(log):
    """[(consumer index by first Subscribe, partition, active)] up to the first Publish."""
    order, out = {}, []
    for _, conn, _, key, detail in log:
        if key == CMD_PUBLISH:
            break
        if key == CMD_SUBSCRIBE:
            order.setdefault(conn, len(order))
        elif key == CMD_CONSUMER_UPDATE:
            out.append((order[conn], detail[0], detail[2]))
    return out


def rstream_deadline_outcome(r):
    """What rstream's own assertion sees 1 s after the send loop, per partition, and why: the partitions
    whose last Publish frame left the client long before that moment must be counted by then (the
    broker's share), those whose first frame left after it cannot be."""
    owner = {parts[0]: int(i) for i, parts in r["partitions_by_consumer"].items() if parts}
    at_1s = {p: r["counted_at_loop_end_plus_1s"].get(str(i), 0) for p, i in owner.items()}
    size = {p: r["counted"][str(i)] for p, i in owner.items()}
    last_write = r["last_publish_write_after_loop_end"]
    for p, t in last_write.items():
        if t <= 1.0 - MARGIN_S:
            assert at_1s[p] == size[p], (
                f"{p}: its last Publish frame left the client {t:.3f} s after the send loop, yet only {at_1s[p]} "
                f"of {size[p]} were counted 1 s after it")
    return {"rstream_assertion_holds": sum(at_1s.values()) == MESSAGES, "counted_at_1s": at_1s,
            "last_publish_write_after_loop_end": {p: round(t, 3) for p, t in last_write.items()},
            "client_last_write_after_deadline": max(last_write.values()) > 1.0}


@pytest.mark.slow
def test_rstream_020_sac_fails_its_deadline_against_rabbitmq_3_13_frames_as_against_riverbed(
        rabbitmq_frames, server, old_rstream):  # noqa: F811
    """rstream 0.20.9's test_consume_superstream_with_sac_all_active with its own fixtures' setup, once
    against RabbitMQ 3.13.7's frames and once against Riverbed: the same outcome, decided by when the
    client writes its last Publish frame."""
    stand_in, port = rabbitmq_frames
    outcomes = {}
    for name, target in (("rabbitmq-3.13.7-frames", port), ("riverbed", server.port)):
        r = run_scenario(old_rstream.python, target, listener="none", consumers=3, **RSTREAM_OWN_SETUP)
        check(r, 3)
        outcomes[name] = rstream_deadline_outcome(r)
        print(name, outcomes[name])
        if name.startswith("rabbitmq"):
            assert not stand_in.errors, stand_in.errors
            # the coordinator's sequence: the first consumer takes every partition; the second makes the
            # first step down from partition 1 (1 rem 2) and is then activated; the third, partition 2
            # (per partition: the connections run concurrently, so only each partition's order is fixed)
            updates = consumer_updates_before_publish(stand_in.log)
            by_partition = {p: [(c, active) for c, q, active in updates if q == p] for _, p, _ in updates}
            assert by_partition == {
                "test-super-stream-0": [(0, True)],
                "test-super-stream-1": [(0, True), (0, False), (1, True)],
                "test-super-stream-2": [(0, True), (0, False), (2, True)]}, updates
    for name, o in outcomes.items():
        if o["client_last_write_after_deadline"]:
            # no broker delivers a message before the client has sent it
            assert not o["rstream_assertion_holds"], (name, o)
        elif max(o["last_publish_write_after_loop_end"].values()) <= 1.0 - MARGIN_S:
            assert o["rstream_assertion_holds"], (name, o)
    # the point of item 5: RabbitMQ's frames do not save the client. Wherever its flush comes after the
    # deadline, rstream's assertion fails against them exactly as it does against Riverbed
    late = [n for n, o in outcomes.items() if o["client_last_write_after_deadline"]]
    print("client flushed its last partition after rstream's 1 s deadline against:", late)
