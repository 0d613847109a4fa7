"""Helpers of the replication-port frame tests (test_forward_wire, test_sac_wire, test_read_wire): split a
frame into (kind, payload), and mutate a payload the way a broken or hostile peer would."""

import struct

from riverbed.shells.cluster.wire import LEN_FRAME_HEADER


def payload_of(frame_bytes):
    """``(kind, payload)`` of one whole frame, checking its length prefix."""
    length, kind = struct.unpack_from(">IB", frame_bytes)
    assert len(frame_bytes) == 4 + length
    return kind, frame_bytes[LEN_FRAME_HEADER:]


def mutations(payload, rng, count=400):
    """``count`` mutants of ``payload`` (bytes): 1-4 edits each, a byte changed, the tail cut or a few
    random bytes inserted."""
    for _ in range(count):
        b = bytearray(payload)
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            if op < 0.4 and b:
                b[rng.randrange(len(b))] = rng.randrange(256)
            elif op < 0.7 and b:
                del b[rng.randrange(len(b)):]
            else:
                b[rng.randrange(len(b) + 1):0] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
        yield bytes(b)
