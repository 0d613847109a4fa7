"""The bench's cluster rows (issue 23) against real processes: etcd and three ``riverbed serve --node``
beside the single node (and, where Debian's nats-server is installed, three nats-server with an R3
stream), through ``bench.compare``: every run succeeds, the figures are sane, the replicated publish was
really replicated (server CPU on the followers is summed in), the goals are printed, and no process the
bench started is left running."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER_ROWS = "cluster-publish,cluster-consume,cluster-latency"

pytestmark = [pytest.mark.integration, pytest.mark.slow]    # ~50 s: etcd, 4 riverbeds, 3 nats-server


def _processes_with(marker):
    """Processes whose command line holds ``marker`` (the bench's temporary directory prefix)."""
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    return [p for p in out if int(p) != os.getpid()]


def _run(tmp_path, peers, n=20000):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "bench.compare", "--peers", peers, "--no-floors", "--workloads", CLUSTER_ROWS,
                        "--n", str(n), "--batch", "500", "--warmup", "20", "--timed", "300", "--rounds", "1",
                        "--durable-fsync", "none", "--max-tries", "1", "--quiet-wait", "0", "--no-chart",
                        "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r, json.loads((tmp_path / "run.json").read_text())


@pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd is not installed (ci/ensure-etcd.sh)")
def test_bench_compare_cluster_rows_against_one_node(tmp_path):
    # NATS R3 beside it where both its server (Debian's nats-server) and its client (nats-py, the bench
    # extra) are here; make test installs neither
    peers = "nats" if shutil.which("nats-server") and importlib.util.find_spec("nats") else "none"
    r, doc = _run(tmp_path, peers)
    assert all(run["ok"] for run in doc["runs"]), [(run["workload"], run.get("error"), run.get("client_stderr"))
                                                   for run in doc["runs"] if not run["ok"]]
    by = {(run["workload"], run["broker"]): run for run in doc["runs"]}
    for w in ("cluster-publish", "cluster-consume", "cluster-latency"):
        one, three = by[(w, "riverbed-solo")], by[(w, "riverbed-cluster")]
        for run in (one, three):
            # /proc counts CPU in 10 ms ticks: a short consume on one node may show none
            assert run["server_cpu_s"] >= 0 and run["wall_s"] > 0
        if w != "cluster-latency":
            assert one["n"] == three["n"] == 20000 and one["msgs_per_s"] > 0 and three["msgs_per_s"] > 0
    lat = by[("cluster-latency", "riverbed-cluster")]
    assert 0 < lat["lat_p50_us"] <= lat["lat_p99_us"] <= lat["lat_max_us"] < 5e6
    # three nodes: the followers' CPU is counted, so replicated publishing costs more server CPU per message
    assert by[("cluster-publish", "riverbed-cluster")]["server_cpu_s"] > by[("cluster-publish", "riverbed-solo")][
        "server_cpu_s"]
    # n1 leads (queue-leader-locator=client-local) and n2, n3 did work too: the publish was replicated
    nodes = by[("cluster-publish", "riverbed-cluster")]["server_node_cpu_s"]
    assert len(nodes) == 3 and nodes[0] > 0 and nodes[1] + nodes[2] > 0, nodes
    # RSS is summed over the three nodes too
    assert by[("cluster-publish", "riverbed-cluster")]["server_peak_rss_mb"] > 1.5 * by[("cluster-publish", "riverbed-solo")][
        "server_peak_rss_mb"]
    # the one-node half has a node of its own, which runs the cluster rows only (the same history as the
    # cluster's nodes), not the headline node
    assert not any(b == "riverbed" and w.startswith("cluster-") for w, b in by)
    assert {w for w, b in by if b == "riverbed-solo"} == set(CLUSTER_ROWS.split(","))
    goals = {(g["workload"], g["metric"]): g for g in doc["cluster_goals"]}
    assert goals[("cluster-publish", "msgs_per_s")]["goals"][0]["ratio"] > 0
    assert "cluster: publish rstream raw" in r.stdout and "[3 nodes, R3]" in r.stdout
    assert "Cluster rows (issue 23's goals" in r.stdout and "goal >=0.5× one node" in r.stdout
    assert "no three-node cluster is started here" in r.stdout
    if peers == "nats":
        for pw in ("nats-r3-publish", "nats-r3-consume", "nats-r3-latency"):
            assert by[(pw, "nats-r3")]["ok"], by[(pw, "nats-r3")]
        assert goals[("cluster-publish", "msgs_per_s")]["goals"][1]["ratio"] is not None
    # every etcd, riverbed and nats-server of the run is gone
    assert not _processes_with("riverbed-bench-cluster-")
    assert not _processes_with("riverbed-bench-nats-r3-")
