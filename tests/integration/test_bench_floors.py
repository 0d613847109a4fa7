"""bench.compare measures the floors in the same run as its rows and judges issue 26's goals against them."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.integration


def test_bench_compare_measures_the_floors_in_the_run_and_judges_the_latency_rows_against_them(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "bench.compare", "--peers", "none", "--workloads", "latency-rstream",
                        "--n", "300", "--warmup", "10", "--timed", "300", "--rounds", "1", "--max-tries", "1",
                        "--quiet-wait", "0", "--floor-messages", "300", "--floor-commits", "20",
                        "--floor-records", "20000", "--no-chart", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "run.json").read_text())
    assert [s["round"] for s in doc["floor_samples"]] == [1]
    assert doc["floors"]["loop"]["p50_us"]["med"] > 0 and doc["floors"]["fsync"]["p50_us"]["med"] > 0
    judged = {(g["metric"], g["durable"], g["floor"]) for g in doc["floor_goals"]}
    # the headline row against the echo floor, the fsync=batch row against the fsync floor
    assert {("lat_p50_us", False, "loop"), ("lat_p99_us", False, "loop"), ("lat_p50_us", True, "fsync")} <= judged
    assert "Issue 26's goals against the floors" in r.stdout and "LMDB fsync floor" in r.stdout
