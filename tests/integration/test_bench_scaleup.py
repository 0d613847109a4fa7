"""bench.compare's scale-up row (issue 26, one node per core): a super stream with one unreplicated
partition per client, on two nodes each leading one partition against one node leading both
(bench/_scaleup.py)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from bench._scaleup import RiverbedPair, scaleup_goal_lines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_scaleup_goal_is_the_pairs_rate_over_one_nodes():
    summary = {("scaleup-publish", "riverbed"): {"msgs_per_s": {"med": 100_000.0}},
               ("scaleup-publish", RiverbedPair.name): {"msgs_per_s": {"med": 160_000.0}}}
    (g,) = scaleup_goal_lines(summary)
    assert g["ratio"] == 1.6 and g["ok"] is False and "MISSED" in g["text"]
    summary[("scaleup-publish", RiverbedPair.name)]["msgs_per_s"]["med"] = 170_000.0
    assert scaleup_goal_lines(summary)[0]["ok"] is True
    assert scaleup_goal_lines({("scaleup-publish", "riverbed"): {"msgs_per_s": {"med": 1.0}}}) == []


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd: ci/ensure-etcd.sh installs it (make test does)")
def test_bench_compare_runs_the_scaleup_row_with_each_node_leading_one_partition(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "bench.compare", "--peers", "none", "--no-floors",
                        "--workloads", "scaleup-publish", "--n", "25000", "--rounds", "1", "--max-tries", "1",
                        "--quiet-wait", "0", "--durable-fsync", "none", "--no-chart", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "run.json").read_text())
    by = {run["broker"]: run for run in doc["runs"]}
    assert by["riverbed"]["ok"] and by[RiverbedPair.name]["ok"], [run.get("error") for run in doc["runs"]]
    # the row sends n_scale (8) × --n per process, so that a run lasts long enough to judge scaling
    assert by[RiverbedPair.name]["n_per_client"] == 200000 and by[RiverbedPair.name]["n"] == 400000
    # each client published to its partition on that partition's leader: one node on the single node, each
    # of the two nodes on the pair (balanced placement, initial-cluster-size 1)
    assert len(set(by["riverbed"]["partition_ports"])) == 1
    assert len(set(by[RiverbedPair.name]["partition_ports"])) == 2
    # both nodes worked; 200,000 messages a client, so that each node's CPU is well above /proc's 10 ms tick
    n1, n2 = by[RiverbedPair.name]["server_node_cpu_s"]
    assert n1 > 0 and n2 > 0
    assert doc["scaleup_goals"] and "Scale-up (issue 26, one node per core)" in r.stdout
