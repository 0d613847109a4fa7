"""bench.compare's Spark rows (issue 26, bench/_spark_rows.py): the riverbed data source on local[2]
reading what the broker stored, judged against its own goals, and skipped with the reason when Spark
cannot run here."""

import json
import os
import subprocess
import sys
import time

import pytest

from bench import _spark_rows
from bench._workloads import GOALS, KIND_METRICS, W

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 30_001           # not a multiple of the fill's frames (5,000 raw, 2,000 JSON)


def test_spark_rows_are_riverbed_only_with_their_own_goals():
    for wname in ("spark-raw", "spark-json"):
        assert W[wname]["kind"] == "spark" and W[wname]["rabbitmq"] is False
    assert GOALS[("spark-raw", "msgs_per_s")] == ("abs", ">=", 5_000_000.0)
    assert GOALS[("spark-json", "msgs_per_s")] == ("abs", ">=", 1_000_000.0)
    assert {"msgs_per_s", "jvm_us_per_row", "pyworkers_us_per_row"} <= set(KIND_METRICS["spark"])


def test_report_lines_judge_the_median_rate_or_say_why_skipped():
    summary = {("spark-raw", "riverbed"): {"msgs_per_s": {"med": 4_200_000.0}, "jvm_us_per_row": {"med": 0.3},
                                           "pyworkers_us_per_row": {"med": 0.07}, "spark_fixed_s": {"med": 0.1},
                                           "rounds": 3},
               ("spark-json", "riverbed"): {"msgs_per_s": {"med": 1_100_000.0}, "rounds": 3}}
    raw, js = _spark_rows.report_lines(summary)
    assert "spark-raw: 4.20M rows/s, goal >= 5M: MISSED" in raw and "JVM 0.300 µs" in raw
    assert "spark-json: 1.10M rows/s, goal >= 1M: met" in js
    (line,) = _spark_rows.report_lines(summary, "no Java runtime on PATH")
    assert line == "Spark rows (spark-raw, spark-json): skipped: no Java runtime on PATH"


def test_prepare_leaves_the_rows_out_when_pyspark_is_missing(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyspark" else real(name, *a))
    seen = []
    kept, why = _spark_rows.prepare(["publish-rstream-raw", "spark-raw", "spark-json"], seen.append)
    assert kept == ["publish-rstream-raw"] and "pyspark is not installed" in why and why in seen[0]
    assert _spark_rows.prepare(["publish-rstream-raw"]) == (["publish-rstream-raw"], None)


def test_tree_cpu_keeps_a_child_that_exits_mid_window():
    # the pyspark daemon's workers are reaped by nobody: what one used must not vanish when it exits
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\ntime.sleep(1.0)\n"
    tree = _spark_rows.TreeCpu(every=0.05)
    tree.begin()
    p = subprocess.Popen([sys.executable, "-c", burn])
    assert p.wait(60) == 0
    time.sleep(0.2)
    used = tree.end()
    assert used["jvm"] == 0.0 and used["python"] >= 0.45, used


def test_server_data_dir_is_read_from_the_brokers_command_line(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--data-dir", "rel/data"],
                         cwd=tmp_path)
    want = os.path.join(os.path.realpath(tmp_path), "rel", "data")
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if _spark_rows.server_data_dir(p.pid) == want:
                    break
            except RuntimeError:
                pass     # not exec'd yet
            time.sleep(0.05)
        assert _spark_rows.server_data_dir(p.pid) == want
        with pytest.raises(RuntimeError, match="no --data-dir"):
            _spark_rows.server_data_dir(os.getpid())
    finally:
        p.kill()
        p.wait()


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.slow
def test_bench_compare_runs_both_spark_rows_and_judges_them(tmp_path):
    pytest.importorskip("pyspark")
    why = _spark_rows.unavailable()
    if why:
        pytest.skip(why)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "bench.compare", "--peers", "none", "--no-floors",
                        "--workloads", "spark-raw,spark-json", "--n", str(N), "--rounds", "1", "--max-tries", "1",
                        "--quiet-wait", "0", "--durable-fsync", "none", "--no-chart", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "run.json").read_text())
    by = {run["workload"]: run for run in doc["runs"]}
    for wname in ("spark-raw", "spark-json"):
        run = by[wname]
        assert run["ok"], (run.get("error"), run.get("client_stderr"))
        (res,) = run["results"]
        # the client checked the query's counts and sums against what it published before RESULT
        assert res["n"] == N and res["decode"] == wname.split("-")[1] and run["msgs_per_s"] > 0
        # the JVM and its Python workers did the read, and the client's CPU counts them
        assert res["jvm_cpu_s"] > 0 and res["pyworkers_cpu_s"] > 0 and res["fixed_query_s"] > 0
        assert run["client_cpu_s"] >= res["jvm_cpu_s"] + res["pyworkers_cpu_s"]
        assert run["jvm_us_per_row"] > 0 and run["pyworkers_us_per_row"] > 0
    table = "\n".join(" ".join(row) for row in doc["table"])
    assert "JVM CPU s/M rows" in table and ">=5e+06" in table and ">=1e+06" in table
    assert "Spark (issue 26) spark-raw:" in r.stdout and "Spark (issue 26) spark-json:" in r.stdout
