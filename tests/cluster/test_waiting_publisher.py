"""A publisher waiting for its confirms is not an idle connection (issue 26: in the bench's scale-up row
the broker closed a load generator's connection, with no Close frame, while it published). The
RabbitMQ Stream idle timeout (two heartbeat intervals without a frame from the client) counted the time
a publisher whose window was full of unconfirmed messages spent waiting for the broker; the load
generator sends nothing then (no heartbeats either), so a commit held up for two intervals cost it the
connection. Here a confirm is held up on purpose: the stream's only other member is paused (SIGSTOP)
for longer than two heartbeat intervals, so a majority does not hold the publish until it runs again."""

import os
import signal
import struct
import threading
import time

import pytest

from clusterfixtures import running_cluster
from test_replication import wait_placed

from bench import _loadgen
from riverbed.shells.rmq_stream import codec

pytestmark = pytest.mark.integration

HEARTBEAT = 1            # seconds: the broker closes a connection silent for 2 of them
HELD = 3.5               # seconds the member is paused, with the publisher's confirms owed meanwhile
N, BATCH = 4000, 1000


def test_a_publisher_waiting_longer_than_two_heartbeats_for_its_confirms_is_not_closed(tmp_path, etcd):
    # a lease TTL and a replication timeout well over HELD: nothing steps down, resigns or times out
    extra = ("--heartbeat", str(HEARTBEAT), "--replication-timeout", "60")
    with running_cluster(tmp_path, etcd, n=2, lease_ttl=10.0, extra=extra) as c:
        leader, member = c.nodes["n1"], c.nodes["n2"]
        setup = _loadgen.Conn("127.0.0.1", leader.port)
        try:
            setup.request(_loadgen.CMD_CREATE, codec.enc_string("held") + codec.enc_properties(
                {"initial-cluster-size": "2", "queue-leader-locator": "client-local"}))
        finally:
            setup.close()
        wait_placed(c, "held")
        # the publishing connection is opened only now: idle for 2 s before its first publish, it would be
        # closed (rightly: it owes nothing and is owed nothing)
        conn = _loadgen.Conn("127.0.0.1", leader.port)
        try:
            conn.request(_loadgen.CMD_DECLARE_PUBLISHER, struct.pack(">B", 0) + codec.enc_string("") +
                         codec.enc_string("held"))
            failure = []

            def publish():
                try:
                    _loadgen.publish(conn, N, BATCH, b"x" * 100, 16)
                except Exception as e:  # the test's verdict, below
                    failure.append(e)
            os.kill(member.pid, signal.SIGSTOP)
            try:
                t = threading.Thread(target=publish, daemon=True)
                t.start()
                time.sleep(HELD)
                assert t.is_alive() and not failure, failure      # confirms still owed, connection open
            finally:
                os.kill(member.pid, signal.SIGCONT)
            t.join(30)
            assert not t.is_alive() and not failure, failure      # every message confirmed, nothing closed
        finally:
            conn.close()
