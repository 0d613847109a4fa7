"""Every crash the fuzzing found, as a named test with its input (annotated hex), so it can never come back.

How each was found is in its docstring: ``atheris <target>`` (coverage-guided, tests/fuzz/runner.py),
``hypothesis <target>`` (tests/fuzz/strategies.py) or ``soak`` (bench/soak.py, over the network).
"""

import struct
import subprocess
import sys
import textwrap

import pytest

from riverbed.engine import _pycore, core
from riverbed.engine import format as fmt
from riverbed.engine.errors import ChunkError
from riverbed.shells import wire

from . import harness
from .t_bson import BsonTarget
from .t_ream import ReamTarget
from .t_rmq import RmqTarget
from .t_ws import WsTarget


def unhex(text):
    """Bytes from hex written with spaces, newlines and ``#`` comments."""
    return bytes.fromhex("".join(line.split("#")[0] for line in text.splitlines()).replace(" ", ""))


@pytest.fixture
def target(request, tmp_path):
    t = request.param(tmp_path)
    yield t
    t.close()


# ------------------------------------------------------------------------------ engine: chunk parser

# A data section of one sub-batch entry whose Size is 0xFFFFFFF5: 11 (its header) + Size is 2**32, which
# wrapped to 0 in the compiled scan_entries (uint32 arithmetic), so the walk never advanced: an endless
# loop appending to two lists until memory ran out. (atheris chunk: OOM at 469 MB, and the twins disagreed
# on the same inputs with other sizes near 2**32.)
WRAPPING_SUB_BATCH = unhex("""
    80                      # sub-batch entry, no compression
    0001                    # NumRecords 1
    00000000                # uncompressed size
    fffffff5                # Size: 11 + this = 2**32
""")


def test_scan_entries_size_near_2_32_is_an_overrun_not_a_wrap():
    for impl in (core, _pycore):
        with pytest.raises(ChunkError):
            impl.scan_entries(WRAPPING_SUB_BATCH)
        with pytest.raises(ChunkError):
            impl.cut_entries(WRAPPING_SUB_BATCH, 1 << 20, 100, 100)
    # a size that wraps to a small step instead of 0 (the twins disagreed: compiled "ok", pure ChunkError)
    data = unhex("80 0001 00000000 ffffffff") + b"\x00" * 12
    for impl in (core, _pycore):
        with pytest.raises(ChunkError):
            impl.scan_entries(data)


# The same entry inside an uncompressed sub-batch of an RMQ Publish: check_sub_batch walks the body with
# scan_entries, so one 79-byte frame hung the event loop and grew the server until it was killed. Run in
# a child process with a memory cap and a time limit, so the test fails (rather than hangs) if it regresses.
PUBLISH_HANGING_THE_LOOP = unhex("""
    01                                  # fuzz flags: the harness does the handshake first
    00000010 000d 0001 00000001 0002 7331 00000000           # Create s1, no arguments
    0000000f 0001 0001 00000002 01 0000 0002 7331            # DeclarePublisher 1 on s1, no reference
    00000027 0002 0001 01 00000001                           # Publish v1, publisher 1, 1 message
      0000000000000001                                       # publishing id 1
      80 0001 0000000b 0000000b                              # sub-batch: none, 1 record, 11 bytes
        80 0001 00000000 fffffff5                            # its body: the wrapping entry
""")


def test_rmq_publish_with_wrapping_inner_entry_is_refused_in_bounded_time(tmp_path):
    script = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, 1 << 30))
        sys.path.insert(0, {str(harness.Path(__file__).resolve().parents[2])!r})
        from tests.fuzz import harness, t_rmq
        t = t_rmq.RmqTarget({str(tmp_path)!r})
        harness.check_input(t, bytes.fromhex({PUBLISH_HANGING_THE_LOOP.hex()!r}))
        t.close()
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]


# --------------------------------------------------------------------- engine: sub-batch decompression

@pytest.mark.parametrize("entry", [
    # (hypothesis chunk) gzip whose stream is empty though the header says 3 bytes: ValueError escaped
    unhex("90 0000 00000003 00000008  789c030000000001"),
    # (hypothesis chunk) an lz4 frame cut after its magic: lz4's RuntimeError escaped
    unhex("b0 0000 00000000 00000004  04224d18"),
    # (atheris chunk) not gzip at all: zlib.error escaped
    unhex("90 0001 00000005 00000004  deadbeef"),
], ids=["gzip-size-lie", "lz4-truncated", "gzip-garbage"])
def test_sub_batch_that_does_not_decompress_is_a_chunk_error(entry):
    chunk = _pycore.build_chunk(entry, 1, 1, 1000, 7)
    for impl in (core, _pycore):
        with pytest.raises(ChunkError):
            impl.chunk_records(chunk)
        with pytest.raises(ChunkError):
            impl.chunk_to_arrow(chunk)
    with pytest.raises(ChunkError):
        fmt.decompress(fmt.COMPRESSION_GZIP, b"\xde\xad", 4)


# ------------------------------------------------------- sessions: unhandled exceptions (class 3, issue 21)

@pytest.mark.parametrize("target", [WsTarget], indirect=True)
@pytest.mark.parametrize("message", [
    '{"type": "\\ud800"}',                                       # (hypothesis ws) echoed in "Unknown request type"
    '{"type": "unsubscribe", "stream": {"\\ud800": null}}',      # (hypothesis ws) echoed in "Not subscribed"
], ids=["type", "echoed-request"])
def test_ws_lone_surrogate_in_a_request_gets_an_error_frame(target, message):
    from .t_ws import encode_messages

    harness.check_input(target, b"\x00" + encode_messages([message]))


# (soak, bson listener: 40 "internal error" TypeError in 30 s) a PUB whose sessID is an array
BSON_PUB_SESSID_ARRAY = unhex("""
    01                                                   # fuzz flags: CONNECT first
    56000000                                             # a document of 86 bytes
    02 7479706500 04000000 50554200                      # type: "PUB"
    03 6672616d6500 3c000000                             # frame: { (60 bytes)
      02 6368616e6e656c00 03000000 636800                #   channel: "ch"
      03 6576656e7400 0c000000 10 6100 01000000 00        #   event: {a: 1}
      04 73657373494400 0c000000 10 3000 01000000 00      #   sessID: [1]
    00                                                   # }
    00
""")


@pytest.mark.parametrize("target", [BsonTarget], indirect=True)
def test_bson_pub_with_array_session_id_gets_a_response(target):
    harness.check_input(target, BSON_PUB_SESSID_ARRAY)


# (atheris bson, 5 times in 378,059 inputs) a frame whose type is BSON JavaScript code (0x0d), which
# decodes to bson.Code: a str subclass, so it passed the "string type" check, and unhashable, so the
# handler lookup raised TypeError out of the session
BSON_TYPE_IS_CODE = unhex("""
    01                                                   # fuzz flags: CONNECT first
    28000000                                             # a document of 40 bytes
    0d 7479706500 0d000000 4c4953544348414e4e454c5300    # type: Code("LISTCHANNELS")
    03 6672616d6500 05000000 00                          # frame: {}
    00
""")


@pytest.mark.parametrize("target", [BsonTarget], indirect=True)
def test_bson_frame_type_given_as_javascript_code_is_refused(target):
    harness.check_input(target, BSON_TYPE_IS_CODE)


# (atheris bson, once in 378,059 inputs) a PUB whose channel is JavaScript code: the permission cache
# lookup raised TypeError (unhashable bson.Code); answered as the request's error since the poison fixes
BSON_PUB_CHANNEL_IS_CODE = unhex("""
    01                                                   # fuzz flags: CONNECT first
    4b000000                                             # a document of 75 bytes
    02 7479706500 04000000 50554200                      # type: "PUB"
    03 6672616d6500 31000000                             # frame: { (49 bytes)
      0d 6368616e6e656c00 03000000 636800                #   channel: Code("ch")
      03 6576656e7400 0c000000 10 6100 01000000 00        #   event: {a: 1}
      10 72494400 01000000                               #   rID: 1
    00                                                   # }
    00
""")


@pytest.mark.parametrize("target", [BsonTarget], indirect=True)
def test_bson_pub_channel_given_as_javascript_code_gets_a_response(target):
    harness.check_input(target, BSON_PUB_CHANNEL_IS_CODE)


# (soak, stream listener: 23 "internal error" AttributeError in 30 s) Create with a null argument key
RMQ_CREATE_NULL_KEY = unhex("""
    01                                                   # fuzz flags: handshake first
    00000015 000d 0001 00000009 0002 7339                # Create s9
      00000001 ffff 0001 78                              # 1 argument: key null (-1), value "x"
""")


@pytest.mark.parametrize("target", [RmqTarget], indirect=True)
def test_rmq_create_with_null_argument_key_gets_a_response(target):
    harness.check_input(target, RMQ_CREATE_NULL_KEY)


# (atheris ream, 5 times in 1,762 inputs on the final code) a REAM expression with a non-ASCII letter or
# digit: str.isalpha()/isdigit() said yes, the ASCII-only token regex did not match, and m.group raised
# AttributeError out of the session instead of an ERROR line
REAM_EXPR_NON_ASCII = (
    b"\x00"                                          # fuzz flags: none
    b"PROJECTION CREATE prj 1 n\n"
    b"PROJECTION UPDATE prj 9 7\n"                    # a selector of 9 bytes, then an update of 7
    + "{\u0791\u077b\"a\"}\n".encode()               # selector: two Arabic-supplement letters, 2 bytes each
    + b'{"n":2}\n'
)


@pytest.mark.parametrize("target", [ReamTarget], indirect=True)
def test_ream_expression_with_non_ascii_letter_or_digit_is_an_error_line(target):
    harness.check_input(target, REAM_EXPR_NON_ASCII)
    lines = REAM_EXPR_NON_ASCII.split(b"\n")
    assert [len(lines[2]), len(lines[3])] == [9, 7]


def test_annotated_inputs_are_well_formed():
    """The hex above is what it says: lengths add up (a typo would make a test pass for the wrong reason)."""
    frames, used = wire.split_frames(PUBLISH_HANGING_THE_LOOP[1:], 1 << 20)
    assert used == len(PUBLISH_HANGING_THE_LOOP) - 1 and len(frames) == 3
    docs, used = wire.split_bson_frames(BSON_PUB_SESSID_ARRAY[1:], 1 << 20)
    assert used == len(BSON_PUB_SESSID_ARRAY) - 1 and len(docs) == 1
    import bson
    assert bson.decode(bytes(docs[0]))["frame"]["sessID"] == [1]
    docs, used = wire.split_bson_frames(BSON_PUB_CHANNEL_IS_CODE[1:], 1 << 20)
    assert used == len(BSON_PUB_CHANNEL_IS_CODE) - 1
    assert type(bson.decode(bytes(docs[0]))["frame"]["channel"]).__name__ == "Code"
    docs, used = wire.split_bson_frames(BSON_TYPE_IS_CODE[1:], 1 << 20)
    assert used == len(BSON_TYPE_IS_CODE) - 1 and type(bson.decode(bytes(docs[0]))["type"]).__name__ == "Code"
    frames, used = wire.split_frames(RMQ_CREATE_NULL_KEY[1:], 1 << 20)
    assert used == len(RMQ_CREATE_NULL_KEY) - 1 and len(frames) == 1
    assert struct.unpack_from(">HH", frames[0])[0] == 0x0D


# ------------------------------------------------------------------------------ cluster: replication port

# A HELLO whose JSON nests 4,000 arrays: json.loads raises RecursionError, not ValueError, and the leader's
# connection handler logged it as an internal failure instead of dropping a malformed peer. (Found by
# reading the parser while writing the hypothesis strategy for the replication target; the 100,000-input
# atheris run had not reached a depth past the interpreter's recursion limit.)
def test_replication_json_nested_past_the_recursion_limit_is_a_wire_error():
    from riverbed.shells.cluster import wire as cluster_wire

    from .t_replication import ReplicationTarget

    deep = cluster_wire.frame(cluster_wire.HELLO, b"[" * 4000)
    with pytest.raises(cluster_wire.WireError):
        cluster_wire.decode_hello(deep[5:])
    t = ReplicationTarget()
    try:
        harness.check_input(t, b"\x00" + deep)
        harness.check_input(t, bytes([harness.FLAG_PRELUDE]) + b"{\"a\":" * 3000)
    finally:
        t.close()


# ------------------------------------------------------------------------------------- Kafka: topics

# (atheris kafka, out-of-memory after 6,192 inputs) a CreateTopics v0 whose num_partitions had one byte
# changed: 0x002F0003, 3,080,195 partitions, each a stream; the session made them until the process went
# past 300 MB. Now a topic has at most MAX_TOPIC_PARTITIONS and the request is INVALID_PARTITIONS.
KAFKA_CREATE_3M_PARTITIONS = unhex("""
    00                                                   # fuzz flags: none
    0000003d 0013 0000 00000001 0004 66757a7a            # CreateTopics v0, correlation 1, client "fuzz"
      00000001 0002 6374                                 # 1 topic: "ct"
      002f0003 0001 00000000                             # num_partitions 3,080,195, replication 1, no assignments
      00000001 000c 726574656e74696f6e2e6d73 0005 3630303030   # 1 config: retention.ms = 60000
      0000ea60                                           # timeout 60,000 ms
""")


def test_kafka_create_topics_with_millions_of_partitions_is_refused_before_any_stream(tmp_path):
    from riverbed.shells.kafka import codec as C
    from riverbed.shells.kafka import shell as kafka_shell

    from .t_kafka import KafkaTarget

    t = KafkaTarget(tmp_path)
    try:
        dt, peak = harness.check_input(t, KAFKA_CREATE_3M_PARTITIONS, measure_memory=True)
        assert dt < 2 and not t.rig.broker.has_stream("ct") and not t.rig.broker.has_stream("ct-0")
        # the answer, from a session of the target's own: INVALID_PARTITIONS naming the bound
        s = t.open_session()
        s.data_received(KAFKA_CREATE_3M_PARTITIONS[1:])
        t.rig.settle()
        frames, _ = C.split_frames(bytes(s.io.out))
        corr, body = C.decode_response(C.API_CREATE_TOPICS, 0, bytes(frames[0]))
        assert corr == 1 and body["topics"][0]["error_code"] == C.ERR_INVALID_PARTITIONS
        assert not t.rig.broker.has_stream("ct") and kafka_shell.MAX_TOPIC_PARTITIONS == 1024
    finally:
        t.close()
