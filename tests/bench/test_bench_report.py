"""bench.compare's peers without servers: the table's columns and ratios, the --peers flag, the workload
mapping, and a peer that cannot be started."""

import os

import pytest

from bench import _client, _report, compare
from bench._procs import ScriptServer
from bench._workloads import PEER_MAP, PEER_W, W


def stat(*values):
    return {"med": sorted(values)[len(values) // 2], "min": min(values), "max": max(values), "values": list(values)}


def summary_for(riverbed_msgs, peers_msgs):
    s = {("publish-rstream-raw", "riverbed"): {"msgs_per_s": stat(riverbed_msgs)},
         ("publish-rbfly-raw-1", "riverbed"): {"msgs_per_s": stat(4000.0)},
         ("publish-rbfly-raw-1", "rabbitmq"): {"msgs_per_s": stat(3200.0)}}
    for peer, (wname, v) in peers_msgs.items():
        s[(wname, peer)] = {"msgs_per_s": stat(v)}
    return s


def rows_for(peers):
    out = []
    for w in ("publish-rstream-raw", "publish-rbfly-raw-1"):
        cols = {"rabbitmq": (w, "rabbitmq")} if "rabbitmq" in peers else {}
        cols.update({p: (pw, p) for p, pw in PEER_MAP.get(w, {}).items() if p in peers})
        out.append({"workload": w, "riverbed": "riverbed", "label": W[w]["label"], "cols": cols})
    return out


def msgs_line(lines, label):
    return next(line for line in lines if line[0] == label and line[1] == "msgs/s")


def test_table_has_a_ratio_column_per_peer_and_a_dash_where_no_workload_maps():
    peers = ["rabbitmq", "redis", "nats"]
    summary = summary_for(300_000.0, {"rabbitmq": ("publish-rstream-raw", 250_000.0),
                                      "redis": ("redis-publish", 100_000.0), "nats": ("nats-publish", 60_000.0)})
    lines = _report.table_rows(summary, rows_for(peers), peers)
    assert lines[0] == ("workload", "metric", "RabbitMQ", "Riverbed", "Riverbed ÷ RabbitMQ", "Redis",
                        "Riverbed ÷ Redis", "NATS", "Riverbed ÷ NATS", "goal")
    batch = msgs_line(lines, W["publish-rstream-raw"]["label"])
    assert batch[2:9] == ("250,000", "300,000", "1.20", "100,000", "3.00", "60,000", "5.00")
    assert batch[9] == "MISSED (>=1.3×)"
    send = msgs_line(lines, W["publish-rbfly-raw-1"]["label"])   # one message per frame: no Redis/NATS twin
    assert send[2:9] == ("3,200", "4,000", "1.25", "—", "—", "—", "—")


def test_without_rabbitmq_a_ratio_goal_cannot_be_judged_and_says_so():
    peers = ["redis"]
    summary = summary_for(300_000.0, {"redis": ("redis-publish", 150_000.0)})
    lines = _report.table_rows(summary, rows_for(peers), peers)
    assert lines[0] == ("workload", "metric", "Riverbed", "Redis", "Riverbed ÷ Redis", "goal")
    assert msgs_line(lines, W["publish-rstream-raw"]["label"])[2:] == ("300,000", "150,000", "2.00", "? (>=1.3×)")


def test_ratio_range_spans_min_over_max_to_max_over_min():
    r = _report.ratio(stat(100.0, 200.0, 150.0), stat(300.0, 400.0, 350.0))
    assert r == {"med": 350.0 / 150.0, "min": 300.0 / 200.0, "max": 400.0 / 100.0}
    assert _report.ratio(None, stat(1.0)) is None


def test_peers_flag_picks_orders_and_rejects():
    assert compare.parse_args(["--peers", "nats,redis"]).peer_list == ["redis", "nats"]
    assert compare.parse_args(["--peers", "none"]).peer_list == []
    assert compare.parse_args([]).peer_list == ["rabbitmq", "redis", "nats"]
    with pytest.raises(SystemExit) as e:
        compare.parse_args(["--peers", "rabbitmq,kafka"])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        compare.parse_args(["--memory-streams", "1000", "--memory-connections", "0"])
    with pytest.raises(SystemExit):
        compare.parse_args(["--memory-streams", "5", "--memory-connections", "10"])


def test_memory_row_at_10k_streams_is_judged_against_rabbitmq_at_1k():
    from bench._workloads import GOALS
    a = compare.parse_args(["--memory-streams", "10000", "--memory-connections", "2"])
    rb, rabbit = compare._procs.Riverbed(), compare._procs.RabbitMQ()
    assert (compare.memory_streams(a, rb), compare.memory_streams(a, rabbit)) == (10_000, 1_000)
    assert GOALS[("memory-streams", "server_peak_rss_mb")] == ("ratio", "<=", 0.1)
    assert GOALS[("memory-streams", "setup_s")] == ("abs", "<=", 5.0)
    assert "10,000 streams" in W["memory-streams"]["label"] and "RabbitMQ: 1,000" in W["memory-streams"]["label"]
    a = compare.parse_args([])     # back to the 1,000-stream row and its 150 MB goal
    assert compare.memory_streams(a, rabbit) == 1_000
    assert GOALS[("memory-streams", "server_peak_rss_mb")] == ("abs", "<=", 150.0)
    assert ("memory-streams", "setup_s") not in GOALS


def test_every_mapping_pairs_workloads_of_one_kind_that_a_client_can_run():
    for wname, m in PEER_MAP.items():
        for peer, pw in m.items():
            assert PEER_W[pw]["peer"] == peer
            assert PEER_W[pw]["kind"] == W[wname]["kind"], (wname, pw)
            assert PEER_W[pw].get("procs", 1) == W[wname].get("procs", 1), (wname, pw)
    for pw in PEER_W.values():
        assert pw["client"] in _client.PEER_CLIENTS


class Missing(ScriptServer):
    name = "missing"
    label = "Missing"
    script = "no-such-peer.sh"
    package = "no-such-package"
    port_env = "MISSING_PORT"
    dir_env = "MISSING_DIR"


def test_a_peer_that_cannot_start_raises_and_leaves_nothing_behind():
    srv = Missing(log=lambda msg: None)
    with pytest.raises(RuntimeError, match=r"no-such-peer.sh (install|start) failed"):
        srv.start()
    assert srv.tmp is None and srv.pid is None
    assert not [d for d in os.listdir("/tmp") if d.startswith("riverbed-missing-")]


def test_cluster_goal_lines_give_each_rounds_ratio_beside_the_ratio_of_the_medians():
    # rounds of 3 nodes vs one node, in round order: the medians' ratio (0.60 / 0.24 = 2.50) meets the goal
    # while round 1 alone (0.90 / 0.24) does not; the line shows both, the verdict stays on the medians
    s = {("cluster-publish", "riverbed-cluster"): {"server_us_per_msg": stat(0.90, 0.60, 0.45),
                                                   "msgs_per_s": stat(1.0, 1.0, 1.0)},
         ("cluster-publish", "riverbed-solo"): {"server_us_per_msg": stat(0.24, 0.30, 0.15),
                                                "msgs_per_s": stat(1.0, 1.0, 1.0)}}
    goals = {(g["workload"], g["metric"]): g
             for g in compare.cluster_goal_lines(s, "riverbed-cluster", "nats-r3", solo="riverbed-solo")}
    cpu = goals[("cluster-publish", "server_us_per_msg")]
    assert cpu["goals"][0]["ok"] is True and cpu["goals"][0]["ratio"] == pytest.approx(0.60 / 0.24)
    assert cpu["per_round"] == pytest.approx([0.90 / 0.24, 0.60 / 0.30, 0.45 / 0.15])
    assert cpu["text"].endswith("each round ÷ one node: 3.75, 2.00, 3.00")
    # one round only: no per-round list (it would repeat the ratio)
    one = {k: {m: stat(v["values"][0]) for m, v in d.items()} for k, d in s.items()}
    lone = compare.cluster_goal_lines(one, "riverbed-cluster", "nats-r3", solo="riverbed-solo")
    assert all(g["per_round"] is None and "each round" not in g["text"] for g in lone)
