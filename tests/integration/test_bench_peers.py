"""bench.compare's Redis and NATS peers against the real servers (Debian's redis-server and nats-server,
which ci/redis.sh and ci/nats.sh install; these tests only use them when already installed): each server
starts on a free loopback port, answers its own client, and is gone after stop; a short bench run fills
the peers' columns and leaves no server behind."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from bench._nats import Nats
from bench._redis import Redis

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.integration]


def need(binary, module):
    if shutil.which(binary) is None:
        pytest.skip(f"{binary} is not installed (ci/{'redis' if 'redis' in binary else 'nats'}.sh install)")
    pytest.importorskip(module)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_redis_starts_with_the_aof_everysec_answers_and_stops():
    need("redis-server", "redis")
    import redis
    srv = Redis(log=lambda msg: None).start()
    tmp, pid = srv.tmp, srv.pid
    try:
        assert srv.version.startswith("redis-server 5:7.")
        r = redis.Redis(host="127.0.0.1", port=srv.port)
        assert r.config_get("appendonly") == {"appendonly": "yes"}
        assert r.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert r.config_get("bind")["bind"] == "127.0.0.1"
        r.xadd("s", {"d": b"x"})
        assert r.xlen("s") == 1
        r.close()
    finally:
        srv.stop()
    assert not alive(pid)
    assert not os.path.exists(tmp)
    srv.stop()   # idempotent


def test_nats_starts_with_jetstream_answers_and_stops():
    need("nats-server", "nats")
    import asyncio

    import nats
    srv = Nats(log=lambda msg: None).start()
    tmp, pid = srv.tmp, srv.pid

    async def use():
        nc = await nats.connect(f"nats://127.0.0.1:{srv.port}", allow_reconnect=False)
        js = nc.jetstream()
        await js.add_stream(name="s", subjects=["s"])
        ack = await js.publish("s", b"x")
        await nc.close()
        return ack

    try:
        assert asyncio.run(use()).seq == 1
        assert os.path.isdir(os.path.join(tmp, "jetstream"))   # the store is in the bench's own directory
    finally:
        srv.stop()
    assert not alive(pid)
    assert not os.path.exists(tmp)


@pytest.mark.slow
def test_a_short_bench_run_fills_the_peer_columns_and_stops_the_peers(tmp_path):
    need("redis-server", "redis")
    need("nats-server", "nats")
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "bench.compare", "--peers", "redis,nats", "--no-floors",
                        "--workloads", "latency-rstream,consume-rstream", "--n", "2000", "--timed", "200",
                        "--warmup", "20", "--rounds", "1", "--durable-fsync", "none", "--max-tries", "1",
                        "--quiet-wait", "0", "--no-chart", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "run.json").read_text())
    assert all(run["ok"] for run in doc["runs"]), [run.get("error") for run in doc["runs"]]
    by = {row["workload"]: row for row in doc["rows"]}
    assert by["latency-rstream"]["ratios"]["redis"]["lat_p50_us"]["med"] > 0
    assert by["consume-rstream"]["ratios"]["nats"]["msgs_per_s"]["med"] > 0
    header = doc["table"][0]
    assert "Riverbed ÷ Redis" in header and "Riverbed ÷ NATS" in header and "RabbitMQ" not in header
    for name in ("redis", "nats"):
        assert not alive(doc["meta"]["brokers"][name]["pid"])
    assert "Redis column" in r.stdout and "NATS column" in r.stdout


def test_a_peer_that_cannot_be_installed_is_skipped_and_the_output_says_so(tmp_path):
    # ci/no-such-peer.sh stands for a peer whose package cannot be installed: the run goes on without it.
    code = ("import sys; import bench._redis as r; r.Redis.script = 'no-such-peer.sh'; "
            "from bench import compare; sys.exit(compare.main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "--peers", "redis", "--workloads", "latency-rstream",
                        "--timed", "50", "--warmup", "5", "--rounds", "1", "--durable-fsync", "none",
                        "--max-tries", "1", "--quiet-wait", "0", "--no-chart", "--out", str(tmp_path / "run")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Redis: skipped, it could not be installed or started" in r.stdout
    assert "skipping Redis" in r.stderr
    doc = json.loads((tmp_path / "run.json").read_text())
    assert "redis" in doc["meta"]["skipped_peers"]
    assert [run["broker"] for run in doc["runs"]] == ["riverbed"]
    assert "Riverbed ÷ Redis" not in doc["table"][0]
