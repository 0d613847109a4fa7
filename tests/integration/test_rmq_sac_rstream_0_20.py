"""rstream 0.20's single-active-consumer super stream tests against the real server (issue 19, item 5).

rstream 0.20.9's ``test_consume_superstream_with_sac_all_active``, ``..._one_non_active`` and
``test_consume_superstream_with_callback_first|next|offset`` (the offset one subscribes with the "first"
listener) run three (or four) SuperStreamConsumers in one SAC group over a three-partition super stream,
send 10,000 messages through a SuperStreamProducer, sleep 1 s and count what the callbacks saw.
``_old_rstream_sac.py`` does the same with the same client objects, in a subprocess running the old
client's python, and times two things: when each Publish frame left the client, and when each message
reached its consumer's callback.

Checked here, for each listener variant: every message is delivered exactly once; each consumer gets one
partition (with four consumers one gets none); and all 10,000 are counted by their consumers' callbacks
within 1 s of the client writing its last Publish frame: the broker's share of the path (storing, the SAC
hand-over, Deliver, credit) plus the callbacks' own work. The time from each Publish frame leaving the
client to each callback is reported too (median and max); it is not asserted, because while the test's
``send()`` loop runs the client's event loop reads nothing, so on a busy machine the early messages
wait in the client's socket for as long as that loop takes.

What rstream's own test asserts (all 10,000 counted 1 s after the last ``send()`` returned) also
depends on the client alone: ``send()`` only buffers, a 0.5 s timer then encodes and writes one
partition after the other on the event loop. The result records when the last Publish frame of each
partition left the client, relative to that 1 s deadline; on a busy machine it leaves after it, and no
broker can deliver a message before it has received it. The frames Riverbed sends on this path (the
ConsumerUpdate order and contents, delivery from the offset of the new active consumer's answer, a
credit error for an inactive subscription) follow RabbitMQ 3.13's stream reader and SAC coordinator;
tests/shells/test_rmq_session.py checks the ConsumerUpdate sequence frame by frame, and
test_rmq_sac_rstream_0_20_rmq_frames.py runs the same scenario against RabbitMQ 3.13.7's frames.
"""

import json
import subprocess

import pytest
from test_rmq_compat import old_rstream  # noqa: F401 - the session fixture: rstream 0.20.x's python


pytestmark = pytest.mark.integration

SCRIPT = __file__.replace("test_rmq_sac_rstream_0_20.py", "_old_rstream_sac.py")
MESSAGES = 10_000
COUNTED_WITHIN_S = 1.0     # from the moment the client has written its last Publish frame


def run_scenario(python, port, **args):
    try:
        proc = subprocess.run([python, SCRIPT, str(port), json.dumps(args)], capture_output=True, text=True,
                              timeout=300, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the rstream 0.20 SAC scenario did not finish in 300 s:\n{(e.stderr or '')[-3000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"the rstream 0.20 SAC scenario exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1])
    if result.get("error"):
        pytest.fail(f"the rstream 0.20 SAC scenario broke: {result['error']}\n{result.get('traceback', '')}")
    return result


def check(r, consumers):
    timing = {k: r[k] for k in ("counted_at_loop_end_plus_1s", "send_loop_s", "first_publish_write_after_loop_end",
                                "last_publish_write_after_loop_end", "client_cpu_s_in_the_1s",
                                "client_run_queue_wait_s_in_the_1s")}
    print(f"rstream {r['rstream_version']}: counted {r['counted']}, all counted "
          f"{r['last_counted_after_last_write']:.3f} s after the client's last Publish frame; Publish frame -> "
          f"callback p50 {r['latency_p50']:.3f} s max {r['latency_max']:.3f} s; client timing {timing}")
    assert r["missing"] == 0 and r["duplicates"] == 0, (
        f"{r['unique']} of {MESSAGES} messages counted ({r['missing']} missing, {r['duplicates']} duplicates); "
        f"per consumer {r['counted']}, partitions {r['partitions_by_consumer']}")
    parts = r["partitions_by_consumer"]
    owners = [v for v in parts.values() if v]
    assert all(len(v) == 1 for v in owners), f"a consumer got messages of several partitions: {parts}"
    assert sorted(v[0] for v in owners) == sorted(r["partitions"]), f"each partition should have one consumer: {parts}"
    assert len(owners) == 3 and len(parts) <= consumers
    # the client's own share, whatever the broker: nothing leaves it before its 0.5 s flush timer fires
    assert r["first_publish_write_after_first_send"] >= 0.45, timing
    assert r["latency_unmatched"] == 0, "a delivered message matched no Publish frame the client wrote"
    assert r["last_counted_after_last_write"] < COUNTED_WITHIN_S, (
        f"the last message reached its callback {r['last_counted_after_last_write']:.3f} s after the client wrote "
        f"its last Publish frame (per message: median {r['latency_p50']:.3f} s, max {r['latency_max']:.3f} s); "
        f"client timing {timing}")


def test_three_sac_super_stream_consumers_each_count_their_partition_within_1s(server, old_rstream):  # noqa: F811
    """rstream 0.20's test_consume_superstream_with_sac_all_active: no consumer update listener (the client
    answers each ConsumerUpdate with NEXT)."""
    r = run_scenario(old_rstream.python, server.port, super_stream="sac20-none", group="consumer-group-1",
                     listener="none", consumers=3, n=MESSAGES)
    check(r, 3)


@pytest.mark.slow
@pytest.mark.parametrize("listener", ["first", "next"])
def test_three_sac_super_stream_consumers_with_an_update_listener(server, old_rstream, listener):  # noqa: F811
    """test_consume_superstream_with_callback_first (and _offset, which uses the same listener) and
    _callback_next: the listener's offset is where the new active consumer starts."""
    r = run_scenario(old_rstream.python, server.port, super_stream=f"sac20-{listener}", group="consumer-group-1",
                     listener=listener, consumers=3, n=MESSAGES)
    check(r, 3)


@pytest.mark.slow
def test_four_sac_super_stream_consumers_leave_one_idle(server, old_rstream):  # noqa: F811
    """test_consume_superstream_with_sac_one_non_active: a fourth consumer of three partitions gets nothing."""
    r = run_scenario(old_rstream.python, server.port, super_stream="sac20-four", group="consumer-group-1",
                     listener="none", consumers=4, n=MESSAGES)
    check(r, 4)
    assert sum(1 for v in r["partitions_by_consumer"].values() if v) == 3
