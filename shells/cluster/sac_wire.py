"""The single-active-consumer frames: a node registers the SAC members its RabbitMQ Stream clients
subscribed with the leader of the member's stream, which decides for the group and tells the member's
node what to do (shells/cluster/sac.py). They travel on the leader's replication port (wire.py framing:
``| length u32 | type u8 | payload |``, big-endian), on a connection of their own per (node, leader) that
opens with SAC_HELLO; the connection's life is the node's membership: when it drops, the leader drops
that node's members::

    SAC_HELLO        node -> leader  JSON {"node": the registering node's name}
    SAC_REGISTER     node -> leader  member u64 | order u64 (0: new) | index i32 (-1: not a super stream
                                     partition) | state u8 | stream str | name str
    SAC_UNREGISTER   node -> leader  member u64 | stream str | name str
    SAC_STEPPED_DOWN node -> leader  member u64 | stream str | name str: the client answered its step-down
                                     (or did not in time)
    SAC_REGISTERED   leader -> node  member u64 | order u64 | code u8: CODE_OK (``order`` is the member's
                                     place in its group, kept when the group moves to another leader) or
                                     CODE_NOT_LEADER (not registered: ask the leader etcd names)
    SAC_ACTIVATE     leader -> node  member u64: make it the active consumer (ConsumerUpdate active)
    SAC_STEP_DOWN    leader -> node  member u64: stop it (ConsumerUpdate inactive); answer SAC_STEPPED_DOWN

``member`` is the registering node's id of the subscription (unique on that node); ``state`` is what
the node knows of it (broker/sac.py: WAITING, ACTIVE, STEPPING_DOWN), so a new leader keeps an active
consumer active. ``str`` is ``len u16 | UTF-8``.

Frame types start at 48, away from the replication (1, 2, ...) and forwarding (32, ...) frames.

Every ``decode_*`` takes the payload (bytes-like) and returns plain values, or raises
:class:`~riverbed.shells.cluster.wire.WireError` for a malformed one (never another exception);
``DECODERS`` is fuzzed by tests/fuzz/t_replication.py.
"""

import json
import struct

from riverbed.shells.broker.sac import STEPPING_DOWN
from riverbed.shells.cluster.wire import WireError, frame

SAC_HELLO, SAC_REGISTER, SAC_UNREGISTER, SAC_STEPPED_DOWN, SAC_REGISTERED, SAC_ACTIVATE, SAC_STEP_DOWN = range(48, 55)

CODE_OK = 0
CODE_NOT_LEADER = 1

LEN_STR_MAX = 0xFFFF
MAX_INDEX = 1 << 20           # a super stream partition index; bounds a hostile one

_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_REGISTER_HEAD = struct.Struct(">QQiB")
_REGISTERED = struct.Struct(">QQB")


def _str(s):
    b = s.encode()
    if len(b) > LEN_STR_MAX:
        raise ValueError("name too long for a SAC frame")
    return _U16.pack(len(b)) + b


class _Reader:
    """Bounds-checked reads over one payload; every overrun is a WireError."""

    __slots__ = ("buf", "pos")

    def __init__(self, payload):
        self.buf = bytes(payload)
        self.pos = 0

    def unpack(self, st):
        end = self.pos + st.size
        if end > len(self.buf):
            raise WireError("truncated SAC frame")
        out = st.unpack_from(self.buf, self.pos)
        self.pos = end
        return out

    def str(self):
        (n,) = self.unpack(_U16)
        end = self.pos + n
        if end > len(self.buf):
            raise WireError("truncated SAC frame")
        try:
            out = self.buf[self.pos:end].decode()
        except UnicodeDecodeError:
            raise WireError("a name that is not UTF-8") from None
        self.pos = end
        return out

    def done(self, what):
        if self.pos != len(self.buf):
            raise WireError(f"trailing bytes after {what}")


# ------------------------------------------------------------------------------------------ encoders

def encode_hello(node):
    return frame(SAC_HELLO, json.dumps({"node": node}, separators=(",", ":")).encode())


def encode_register(member, order, index, state, stream, name):
    """Raises ValueError for what cannot be encoded (a name over 65535 bytes)."""
    return frame(SAC_REGISTER, _REGISTER_HEAD.pack(member, order, index, state) + _str(stream) + _str(name))


def encode_unregister(member, stream, name):
    return frame(SAC_UNREGISTER, _U64.pack(member) + _str(stream) + _str(name))


def encode_stepped_down(member, stream, name):
    return frame(SAC_STEPPED_DOWN, _U64.pack(member) + _str(stream) + _str(name))


def encode_registered(member, order, code=CODE_OK):
    return frame(SAC_REGISTERED, _REGISTERED.pack(member, order, code))


def encode_activate(member):
    return frame(SAC_ACTIVATE, _U64.pack(member))


def encode_step_down(member):
    return frame(SAC_STEP_DOWN, _U64.pack(member))


# ------------------------------------------------------------------------------------------ decoders

def decode_hello(payload):
    """The registering node's name. WireError when malformed."""
    try:
        obj = json.loads(bytes(payload))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise WireError("bad SAC_HELLO") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("node"), str) or not obj["node"]:
        raise WireError("SAC_HELLO without a node name")
    return obj["node"]


def _stream_and_name(r, what):
    stream = r.str()
    name = r.str()
    r.done(what)
    if not stream or not name:
        raise WireError(f"{what} without a stream or group name")
    return stream, name


def decode_register(payload):
    """``(member, order, index, state, stream, name)`` of a SAC_REGISTER payload. WireError when
    malformed."""
    r = _Reader(payload)
    member, order, index, state = r.unpack(_REGISTER_HEAD)
    if not -1 <= index <= MAX_INDEX:
        raise WireError(f"partition index {index}")
    if state > STEPPING_DOWN:
        raise WireError(f"unknown member state {state}")
    stream, name = _stream_and_name(r, "SAC_REGISTER")
    return member, order, index, state, stream, name


def decode_unregister(payload):
    """``(member, stream, name)`` of a SAC_UNREGISTER payload. WireError when malformed."""
    r = _Reader(payload)
    (member,) = r.unpack(_U64)
    return (member,) + _stream_and_name(r, "SAC_UNREGISTER")


def decode_stepped_down(payload):
    """``(member, stream, name)`` of a SAC_STEPPED_DOWN payload. WireError when malformed."""
    r = _Reader(payload)
    (member,) = r.unpack(_U64)
    return (member,) + _stream_and_name(r, "SAC_STEPPED_DOWN")


def decode_registered(payload):
    """``(member, order, code)`` of a SAC_REGISTERED payload. WireError when malformed."""
    r = _Reader(payload)
    member, order, code = r.unpack(_REGISTERED)
    r.done("SAC_REGISTERED")
    if code > CODE_NOT_LEADER:
        raise WireError(f"unknown SAC result code {code}")
    return member, order, code


def _member_only(what):
    def decode(payload):
        r = _Reader(payload)
        (member,) = r.unpack(_U64)
        r.done(what)
        return member
    decode.__name__ = f"decode_{what.lower()[4:]}"
    decode.__doc__ = f"The member id of a {what} payload. WireError when malformed."
    return decode


decode_activate = _member_only("SAC_ACTIVATE")
decode_step_down = _member_only("SAC_STEP_DOWN")

DECODERS = {SAC_HELLO: decode_hello, SAC_REGISTER: decode_register, SAC_UNREGISTER: decode_unregister,
            SAC_STEPPED_DOWN: decode_stepped_down, SAC_REGISTERED: decode_registered,
            SAC_ACTIVATE: decode_activate, SAC_STEP_DOWN: decode_step_down}


def sample_frames():
    """One frame of each type, as a node and a leader send them (seeds of the replication port's fuzz
    target, tests/fuzz/t_replication.py)."""
    return [encode_hello("n2"), encode_register(7, 0, -1, 0, "orders", "billing"),
            encode_register(8, 3, 2, STEPPING_DOWN, "inv-2", "app"), encode_unregister(7, "orders", "billing"),
            encode_stepped_down(8, "inv-2", "app"), encode_registered(7, 4), encode_registered(9, 0, CODE_NOT_LEADER),
            encode_activate(7), encode_step_down(8)]


def decode_frame(kind, payload):
    """Decode a SAC frame's payload by its type: the decoder's result, or WireError (an unknown type
    included)."""
    dec = DECODERS.get(kind)
    if dec is None:
        raise WireError(f"not a SAC frame type: {kind}")
    return dec(payload)
