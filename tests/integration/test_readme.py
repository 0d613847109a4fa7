"""The README's runnable blocks, run as written against a real server, so the README cannot drift.

A block is run only when the line before its fence (blank lines aside) is an HTML comment
``<!-- test: KIND -->``; every other block is illustration and is left alone. Kinds:

* ``sh``: the block as a bash script (``set -euo pipefail``) in a fresh directory that has ``.venv``
  (a link to this checkout's) so ``. .venv/bin/activate`` works as in a clone. A line that runs
  ``riverbed serve`` starts that server in the background (it is waited for and stopped at the end), as
  a reader runs it in a terminal of its own; a block without one gets a server started for it first.
  stdin gives a password twice (``riverbed users add`` asks for one).
* ``python``: the block with this checkout's Python, beside a server started for it.
* ``node``: the block with Node and the ``streamr-client@0.12.2`` that ``ci/npm-test-deps.sh`` installs.
* ``ream``: a transcript (``C:`` lines sent, ``S:`` lines expected, exactly) over one REAM connection.

Every block gets its own free ports: the README's default ports (5552, 7451, ...) in the block's text are
replaced by them, and ``RIVERBED_<LISTENER>_PORT`` / ``RIVERBED_URI`` say them to ``riverbed serve`` and
the admin CLI, so the commands run unchanged and never touch a default port.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from procs import free_ports

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
MARK_RE = re.compile(r"<!--\s*test:\s*(\w+)\s*-->")
FENCE_RE = re.compile(r"^(\s*)```(\w*)\s*$")
# the README's default port -> the RIVERBED_* setting that moves it
DEFAULT_PORTS = {5552: "stream_port", 5551: "stream_tls_port", 7451: "bson_port", 61616: "zmq_port",
                 8890: "ws_port", 7461: "ream_port", 15692: "http_port",
                 9092: "kafka_port"}
BLOCK_TIMEOUT = 120
PASSWORD_INPUT = "readme-secret\nreadme-secret\n"


def readme_blocks(text):
    """``[(kind, language, code, line number)]`` of the blocks marked ``<!-- test: KIND -->``."""
    lines = text.splitlines()
    out = []
    pending = None          # (kind, line) of a marker waiting for its fence
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARK_RE.search(line)
        if m:
            pending = (m.group(1), i + 1)
            i += 1
            continue
        f = FENCE_RE.match(line)
        if f:
            indent, lang = f.group(1), f.group(2)
            body = []
            i += 1
            while i < len(lines) and not re.match(rf"^{re.escape(indent)}```\s*$", lines[i]):
                body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
                i += 1
            if pending is not None:
                out.append((pending[0], lang, "\n".join(body) + "\n", pending[1]))
            pending = None
            i += 1
            continue
        if line.strip():
            pending = None      # a marker applies to the very next block only
        i += 1
    return out


BLOCKS = readme_blocks(open(README, encoding="utf-8").read())


def substitute(code, ports):
    """The block's text with each README default port replaced by this block's."""
    for default, name in DEFAULT_PORTS.items():
        code = re.sub(rf"(?<![0-9]){default}(?![0-9])", str(ports[name]), code)
    return code


class Block:
    """A fresh directory, free ports and the environment one block runs in."""

    def __init__(self, tmp_path):
        self.cwd = tmp_path / "work"
        self.cwd.mkdir()
        os.symlink(os.path.join(ROOT, ".venv"), self.cwd / ".venv")
        self.ports = dict(zip(DEFAULT_PORTS.values(), free_ports(len(DEFAULT_PORTS))))
        env = {k: v for k, v in os.environ.items() if not k.startswith("RIVERBED_") and k != "SSL_CERT_FILE"}
        for name, port in self.ports.items():
            env["RIVERBED_" + name.upper()] = str(port)
        env["RIVERBED_URI"] = f"rabbitmq-stream://localhost:{self.ports['stream_port']}"
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        self.env = env
        self.server = None

    def start_server(self):
        self.server = subprocess.Popen([sys.executable, "-m", "riverbed.shells.cli", "serve"], cwd=self.cwd,
                                       env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, text=True)
        lines = []
        for line in self.server.stderr:
            lines.append(line)
            if line.rstrip().endswith(" ready"):
                return
        raise AssertionError("the server did not start:\n" + "".join(lines))

    def stop(self):
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            assert self.server.wait(20) == 0


@pytest.fixture
def block(tmp_path):
    b = Block(tmp_path)
    yield b
    b.stop()


def run_checked(cmd, b, code, lineno, **kw):
    r = subprocess.run(cmd, cwd=b.cwd, env=b.env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT, **kw)
    assert r.returncode == 0, (f"README block at line {lineno} failed (exit {r.returncode}):\n{code}\n"
                               f"--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}")
    return r


# `riverbed serve ...` in a sh block: started in the background, waited for, stopped when the block ends
SH_PRELUDE = r"""
set -euo pipefail
RB_PIDS=""
rb_stop() { for p in $RB_PIDS; do kill -TERM "$p" 2>/dev/null || true; wait "$p" || true; done; }
trap rb_stop EXIT
rb_serve() {
    local log; log=$(mktemp)
    riverbed serve "$@" 2>"$log" &
    local pid=$!
    RB_PIDS="$RB_PIDS $pid"
    for _ in $(seq 400); do
        if grep -q ' ready$' "$log"; then cat "$log" >&2; return 0; fi
        if ! kill -0 "$pid" 2>/dev/null; then cat "$log" >&2; return 1; fi
        sleep 0.05
    done
    cat "$log" >&2
    return 1
}
"""
SERVE_LINE_RE = re.compile(r"^(\s*)riverbed serve\b", re.M)


@pytest.mark.parametrize("kind,lang,code,lineno", [b for b in BLOCKS if b[0] == "sh"],
                         ids=[f"line{b[3]}" for b in BLOCKS if b[0] == "sh"])
def test_sh_block(block, kind, lang, code, lineno):
    script = substitute(code, block.ports)
    if SERVE_LINE_RE.search(script):
        script = SERVE_LINE_RE.sub(r"\1rb_serve", script)
        if "--users" in script and "--ream-user" not in script:
            # the REAM port left at its default, as the reader's is: with a users file and no REAM user
            # that listener stays off (a port set anywhere would be an error), so no default port is bound
            del block.env["RIVERBED_REAM_PORT"]
    else:
        block.start_server()
    run_checked(["bash", "-c", SH_PRELUDE + script], block, code, lineno, input=PASSWORD_INPUT)


@pytest.mark.parametrize("kind,lang,code,lineno", [b for b in BLOCKS if b[0] == "python"],
                         ids=[f"line{b[3]}" for b in BLOCKS if b[0] == "python"])
def test_python_block(block, kind, lang, code, lineno):
    block.start_server()
    path = block.cwd / "snippet.py"
    path.write_text(substitute(code, block.ports))
    run_checked([sys.executable, str(path)], block, code, lineno)


@pytest.mark.parametrize("kind,lang,code,lineno", [b for b in BLOCKS if b[0] == "node"],
                         ids=[f"line{b[3]}" for b in BLOCKS if b[0] == "node"])
def test_node_block(block, kind, lang, code, lineno):
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    deps = subprocess.run([os.path.join(ROOT, "ci", "npm-test-deps.sh")], capture_output=True, text=True,
                          timeout=600)
    if deps.returncode != 0:
        pytest.skip(f"ci/npm-test-deps.sh could not install streamr-client: {deps.stderr.strip()[-300:]}")
    block.env["NODE_PATH"] = deps.stdout.strip()
    block.start_server()
    path = block.cwd / "snippet.js"
    path.write_text(substitute(code, block.ports))
    run_checked(["node", str(path)], block, code, lineno)


def _ream_lines(sock, n, timeout=10.0):
    sock.settimeout(timeout)
    buf = b""
    deadline = time.monotonic() + timeout
    while buf.count(b"\n") < n and time.monotonic() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf.decode("utf-8").split("\n")[:n]


@pytest.mark.parametrize("kind,lang,code,lineno", [b for b in BLOCKS if b[0] == "ream"],
                         ids=[f"line{b[3]}" for b in BLOCKS if b[0] == "ream"])
def test_ream_transcript(block, kind, lang, code, lineno):
    """The ``C:`` lines go out as written (sizes included), the ``S:`` lines must come back exactly."""
    sent = [ln[3:] for ln in code.splitlines() if ln.startswith("C: ")]
    expected = [ln[3:] for ln in code.splitlines() if ln.startswith("S: ")]
    assert sent and expected
    block.start_server()
    with socket.create_connection(("127.0.0.1", block.ports["ream_port"]), timeout=10) as sock:
        assert _ream_lines(sock, 1) == ["REAM 1.0"]
        sock.sendall("".join(line + "\n" for line in sent).encode("utf-8"))
        got = _ream_lines(sock, len(expected))
    assert got == expected, f"README REAM transcript at line {lineno}"


def test_the_markers_find_the_blocks_they_should():
    """Every kind has blocks, a marker is never left without its block, and unmarked blocks are not run."""
    kinds = {b[0] for b in BLOCKS}
    assert {"sh", "python", "node", "ream"} <= kinds, kinds
    text = open(README, encoding="utf-8").read()
    assert len(MARK_RE.findall(text)) == len(BLOCKS)
    sample = "<!-- test: sh -->\n\n```sh\necho 1\n```\n\n```sh\necho 2\n```\n<!-- test: python -->\ntext\n```python\nx\n```\n"
    assert readme_blocks(sample) == [("sh", "sh", "echo 1\n", 1)]
    assert substitute("localhost:5552 and 155520 and 15692", {n: 1000 + i for i, n in
                                                              enumerate(DEFAULT_PORTS.values())}) == \
        "localhost:1000 and 155520 and 1006"


def test_prose_facts_that_once_drifted():
    """Statements the code decides, checked against it: where super streams live (the engine's LMDB
    environment since the JSON file was retired), the REAM sizes in the protocol section (each declared
    size is its payload's byte count), and the ZeroMQ frame grammar's delimiter frame."""
    text = open(README, encoding="utf-8").read()
    spark = text[text.index("## Spark"):]
    assert "rmq-super-streams.json" not in spark
    ream = [b for b in BLOCKS if b[0] == "ream"][0][2].splitlines()
    for i, line in enumerate(ream):
        words = line[3:].split()
        if line.startswith("C: ") and words[0] in ("EVENT", "AGGREGATE", "PROJECTION") and words[-1].isdigit() \
                and words[1] in ("PUBLISH", "SET", "SELECT", "DELETE", "UPDATE"):
            sizes = [int(w) for w in words[-2:] if w.isdigit()] if words[1] == "UPDATE" else [int(words[-1])]
            payloads = [ream[i + 1 + k][3:] for k in range(len(sizes))]
            assert [len(p.encode()) for p in payloads] == sizes, line
    zmq_section = text[text.index("### ZeroMQ"):text.index("### REAM")]
    assert '["", "PUT"' in zmq_section and '["", "MESSAGE"' in zmq_section and "X-OFFSET" in zmq_section
