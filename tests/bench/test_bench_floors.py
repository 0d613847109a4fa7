"""The floors bench.compare measures in the same run as its rows, and issue 26's goals judged against
them (bench/_floors.py)."""

import os

from bench import _floors


def test_append_floor_costs_cpu_per_record_and_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    r = _floors.append_floor(records=20000, batch=5000)
    assert r["records"] == 20000 and r["cpu_us"] > 0
    assert os.listdir(tmp_path) == []


def test_one_sample_has_every_floor_and_medians_span_the_samples():
    a = {"round": 1, "loop": {"messages": 9, "cpu_us": 30.0, "p50_us": 60.0, "p99_us": 90.0},
         "fsync": {"commits": 9, "p50_us": 200.0, "p99_us": 400.0}, "append": {"records": 9, "cpu_us": 0.1}}
    b = {"round": 2, "loop": {"messages": 9, "cpu_us": 34.0, "p50_us": 70.0, "p99_us": 80.0},
         "fsync": {"commits": 9, "p50_us": 100.0, "p99_us": 300.0}, "append": {"records": 9, "cpu_us": 0.3}}
    m = _floors.medians([a, b])
    assert m["loop"]["cpu_us"] == {"med": 32.0, "min": 30.0, "max": 34.0}
    assert m["fsync"]["p50_us"]["med"] == 150.0 and m["append"]["cpu_us"]["max"] == 0.3
    assert "messages" not in m["loop"] and "records" not in m["append"]     # counts are not floors
    assert any(line.startswith("uvloop echo floor: cpu_us 32.00") for line in _floors.floor_text(m))


def test_goals_are_judged_against_the_floor_of_the_same_run():
    floors = {"loop": {"cpu_us": {"med": 30.0}, "p50_us": {"med": 60.0}, "p99_us": {"med": 100.0}},
              "fsync": {"p50_us": {"med": 200.0}}, "append": {"cpu_us": {"med": 0.1}}}
    summary = {
        ("publish-rbfly-raw-1", "riverbed"): {"server_us_per_msg": {"med": 44.0}},      # 1.47x: met
        ("latency-rstream", "riverbed"): {"lat_p50_us": {"med": 120.0}, "lat_p99_us": {"med": 301.0}},
        ("redis-latency", "redis"): {"lat_p50_us": {"med": 130.0}},
        ("latency-rstream", "riverbed-batch"): {"lat_p50_us": {"med": 500.0}},          # 2.5x: missed
        ("publish-rstream-raw", "riverbed"): {"server_us_per_msg": {"med": 0.4}},       # 4x: missed
    }
    got = {(g["workload"], g["metric"], g["durable"], g["floor"]): g
           for g in _floors.floor_goal_lines(summary, floors, "riverbed-batch")}
    assert got[("publish-rbfly-raw-1", "server_us_per_msg", False, "loop")]["ok"] is True
    assert got[("latency-rstream", "lat_p50_us", False, "loop")]["ok"] is False          # 2.0x > 1.5x
    assert got[("latency-rstream", "lat_p50_us", False, "redis")]["ok"] is True          # 120 <= 130
    assert got[("latency-rstream", "lat_p99_us", False, "loop")]["ratio"] == 3.01
    assert got[("latency-rstream", "lat_p50_us", True, "fsync")]["ok"] is False
    assert got[("publish-rstream-raw", "server_us_per_msg", False, "append")]["ratio"] == 4.0
    assert "MISSED" in got[("publish-rstream-raw", "server_us_per_msg", False, "append")]["text"]
    # a row that did not run is not judged
    assert not any(k[0] == "latency-rbfly" for k in got)


def test_a_durable_row_copies_its_own_workloads_row_when_cluster_rows_come_first():
    # cluster and scale-up workloads have two rows each: the durable row must still copy latency-rstream's
    from bench.compare import table_layout
    rows = table_layout(["scaleup-publish", "cluster-latency", "latency-rstream"], ["latency-rstream"],
                        "riverbed-batch", "batch", peers={})
    assert [(r["workload"], r["riverbed"]) for r in rows] == [
        ("scaleup-publish", "riverbed"), ("scaleup-publish", "riverbed-pair"),
        ("cluster-latency", "riverbed-solo"), ("cluster-latency", "riverbed-cluster"),
        ("latency-rstream", "riverbed"), ("latency-rstream", "riverbed-batch")]
    assert rows[-1]["label"].endswith("[Riverbed fsync=batch]") and rows[-1]["label"].startswith("confirm latency")
    assert table_layout(["latency-rstream"], ["latency-rstream"], None, "none", peers={})[-1]["riverbed"] == "riverbed"


def test_the_loadgen_latency_row_is_judged_like_the_real_clients_rows_and_for_its_server_cpu():
    floors = {"loop": {"cpu_us": {"med": 20.0}, "p50_us": {"med": 40.0}, "p99_us": {"med": 100.0}}}
    summary = {
        ("loadgen-latency", "riverbed"): {"lat_p50_us": {"med": 55.0}, "lat_p99_us": {"med": 320.0},
                                          "server_us_per_msg": {"med": 31.0}},
        ("redis-latency", "redis"): {"lat_p50_us": {"med": 50.0}},
    }
    got = {(g["metric"], g["floor"]): g for g in _floors.floor_goal_lines(summary, floors, "riverbed-batch")
           if g["workload"] == "loadgen-latency"}
    assert got[("lat_p50_us", "loop")]["ok"] is True                  # 1.375x <= 1.5x
    assert got[("lat_p50_us", "redis")]["ok"] is False                # 55 > Redis's 50
    assert got[("lat_p99_us", "loop")]["ok"] is False                 # 3.2x > 3x
    assert got[("server_us_per_msg", "loop")]["ratio"] == 1.55 and not got[("server_us_per_msg", "loop")]["ok"]
