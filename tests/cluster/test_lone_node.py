"""Without ``--etcd`` a node runs alone exactly as before: nothing of the cluster is imported and no
read limit or epoch is set (DESIGN.md, Cluster)."""

import subprocess
import sys

CHILD = r"""
import asyncio, sys
from riverbed.shells import config, cli

cfg = config.load({"data_dir": sys.argv[1], "stream_port": "0", "bson_port": "off", "zmq_port": "off",
                   "ws_port": "off", "text_port": "off", "http_port": "off", "kafka_port": "off"}, env={})
stop = asyncio.Event()
seen = {}

def started(broker):
    seen["cluster"] = broker.cluster
    seen["limits"] = dict(broker.engine._read_limits)
    seen["epochs"] = dict(broker.engine.epochs)
    stop.set()

asyncio.run(cli.run_server(cfg, stop=stop, started=started))
mods = sorted(m for m in sys.modules if m.startswith("riverbed.shells.cluster"))
print(seen["cluster"], seen["limits"], seen["epochs"], mods)
"""


def test_lone_node_imports_no_cluster_code(tmp_path):
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "data")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None {} {} []"


def test_etcd_without_node_name_is_a_config_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "riverbed.shells.cli", "serve", "--data-dir", str(tmp_path / "d"),
                          "--etcd", "http://127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--node" in out.stderr


def test_cluster_status_without_etcd_reachable_exits_2():
    out = subprocess.run([sys.executable, "-m", "riverbed.shells.cli", "cluster", "status",
                          "--etcd", "http://127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "etcd" in out.stderr


def test_serve_with_unreachable_etcd_exits_2(tmp_path):
    out = subprocess.run([sys.executable, "-m", "riverbed.shells.cli", "serve", "--data-dir", str(tmp_path / "d"),
                          "--etcd", "http://127.0.0.1:1", "--node", "a", "--replication-port", "0",
                          "--stream-port", "0", "--bson-port", "off", "--zmq-port", "off", "--ws-port", "off",
                          "--text-port", "off", "--http-port", "off", "--kafka-port", "off"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "etcd" in out.stderr, out.stderr
