"""The README's Cluster block (an etcd, three ``riverbed serve --node`` on one host, ``riverbed cluster
status``) run as a reader runs it, so that it cannot drift from what works.

Every port number written in the block moves to a free loopback port, and so does every default port
the block leaves alone: ``RIVERBED_<LISTENER>_PORT`` gives all three nodes the same stand-in for a
default, as the default itself would be. A node line that leaves a listener at its default then collides
with another node's, exactly as on the reader's host (the block once did, for all but n1). The etcd line
runs as written, plus a free peer port (etcd's default peer port is a fixed one)."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from procs import free_ports

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
CLI = [sys.executable, "-m", "riverbed.shells.cli"]
# the listeners `riverbed serve` starts unless told otherwise, by the environment setting of each default
DEFAULT_LISTENERS = ("STREAM", "BSON", "ZMQ", "WS", "REAM", "KAFKA", "HTTP")
PORT_RE = re.compile(r"(?<=127\.0\.0\.1:)\d+|(?<=-port )\d+")


def cluster_block():
    """The first ``sh`` block of the README's "## Cluster" section, its lines joined where they continue."""
    section = open(README, encoding="utf-8").read().split("\n## Cluster\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    lines = []
    for line in code.replace("\\\n", " ").splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line:
            lines.append(line[:-1].strip() if line.endswith("&") else line)
    return lines


def test_readme_cluster_block_starts_three_nodes_that_status_lists_up(tmp_path):
    if shutil.which("etcd") is None:
        pytest.skip("etcd is not installed (ci/ensure-etcd.sh installs Debian's etcd-server)")
    lines = cluster_block()
    assert [shlex.split(x)[:2] for x in lines] == [["etcd", "--data-dir"]] + [["riverbed", "serve"]] * 3 + [
        ["riverbed", "cluster"]], lines
    written = sorted({int(p) for x in lines for p in PORT_RE.findall(x)})
    ports = free_ports(len(written) + len(DEFAULT_LISTENERS) + 1)
    moved = dict(zip(written, ports))
    peer = ports[len(written)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIVERBED_")}
    for name, port in zip(DEFAULT_LISTENERS, ports[len(written) + 1:]):
        env[f"RIVERBED_{name}_PORT"] = str(port)

    def move(line):
        return PORT_RE.sub(lambda m: str(moved[int(m.group())]), line)

    etcd_args = shlex.split(move(lines[0]))
    etcd_args[etcd_args.index("--data-dir") + 1] = str(tmp_path / "etcd")
    client = etcd_args[etcd_args.index("--listen-client-urls") + 1]
    peer_url = f"http://127.0.0.1:{peer}"
    procs, logs = [], []
    try:
        log = open(tmp_path / "etcd.log", "w")
        logs.append(log)
        etcd = subprocess.Popen([shutil.which("etcd"), *etcd_args[1:], "--listen-peer-urls", peer_url,
                                 "--initial-advertise-peer-urls", peer_url, "--initial-cluster",
                                 f"default={peer_url}", "--log-level", "warn"],
                                cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        procs.append(etcd)
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(client + "/health", timeout=1) as r:
                    if json.loads(r.read()).get("health") == "true":
                        break
            except OSError:
                pass
            assert etcd.poll() is None and time.monotonic() < deadline, (tmp_path / "etcd.log").read_text()
            time.sleep(0.1)
        nodes = []
        for i, line in enumerate(lines[1:4], 1):
            log = open(tmp_path / f"n{i}.log", "w")
            logs.append(log)
            p = subprocess.Popen([*CLI, *shlex.split(move(line))[1:]], cwd=tmp_path, env=env,
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            procs.append(p)
            nodes.append(p)
        status = shlex.split(move(lines[4]))[1:]
        deadline = time.monotonic() + 60
        while True:
            for i, p in enumerate(nodes, 1):
                # a listener left at a default another node binds too: "cannot start ... address already in use"
                assert p.poll() is None, f"n{i} exited:\n" + (tmp_path / f"n{i}.log").read_text()
            r = subprocess.run([*CLI, *status, "--json"], env=env, capture_output=True, text=True, timeout=30)
            st = json.loads(r.stdout) if r.returncode == 0 else {}
            up = {n["name"]: n for n in st.get("nodes", []) if n["up"]}
            if len(up) == 3:
                break
            assert time.monotonic() < deadline, (r.stdout, r.stderr, st)
            time.sleep(0.3)
        # the ports each line gave its node, in etcd as its node wrote them
        for i, line in enumerate(lines[1:4], 1):
            args = shlex.split(move(line))
            assert up[f"n{i}"]["stream_port"] == int(args[args.index("--stream-port") + 1])
            assert up[f"n{i}"]["replication_port"] == int(args[args.index("--replication-port") + 1])
        # and the command as written (its plain text form) names all three, up
        r = subprocess.run([*CLI, *status], env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert all(re.search(rf"node n{i}\s+up\b", r.stdout) for i in (1, 2, 3)), r.stdout
        for p in nodes:
            p.send_signal(signal.SIGTERM)
        for i, p in enumerate(nodes, 1):
            assert p.wait(30) == 0, (tmp_path / f"n{i}.log").read_text()
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for log in logs:
            log.close()
