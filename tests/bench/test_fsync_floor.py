"""The fsync floor that `make bench` measures beside the fsync=batch confirm (bench/fsync_floor.py)."""

import os

from bench import fsync_floor


def test_floor_commits_are_synced_and_leave_nothing_behind(tmp_path):
    r = fsync_floor.measure(commits=20, where=str(tmp_path), warmup=2)
    assert r["commits"] == 20
    # a synced commit reaches the disk: it cannot be free, and p99 is at least p50
    assert 0 < r["p50_us"] <= r["p99_us"]
    assert os.listdir(tmp_path) == []


def test_publish_bench_prints_the_floor_and_the_ratio(capsys):
    from bench import bench_publish
    bench_publish.main(["--messages", "50", "--fsync", "batch", "--floor-commits", "20"])
    out = capsys.readouterr().out
    assert "floor" in out and "fsync=batch confirm p50 / fsync floor p50:" in out
