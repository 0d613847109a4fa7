"""Fuzz runner: ``python -m tests.fuzz.runner <command>`` from the repository root.

* ``seed [TARGET...]`` - write every target's seed inputs into its corpus directory.
* ``replay TARGET... [--memory]`` - run the corpus through targets once under the invariants.
* ``fuzz TARGET --seconds N [--stats FILE]`` - coverage-guided fuzzing with atheris (libFuzzer) for N
  seconds; new interesting inputs go into tests/fuzz/corpus/TARGET; findings into .fuzz/findings/TARGET.
* ``minimize [TARGET...]`` - libFuzzer ``-merge=1`` of each corpus (inputs that add coverage), trimmed
  to CORPUS_BUDGET bytes; ``campaign`` does it after each target.
* ``campaign [--seconds N] [--runs N] [--targets a,b]`` - ``fuzz`` each target in its own process, one after the
  other, then minimise each corpus (libFuzzer ``-merge=1``) and print a table: inputs, exec/s, findings
  (uncaught exceptions by signature), hangs, peak RSS. Exits 1 on any finding, hang, or a peak RSS over
  300 MB. ``make fuzz`` runs this. With ``--accumulate``, ``--runs`` is a total over invocations: each
  finished (or interrupted) run of a target is appended to ``.fuzz/totals/TARGET.json`` and the next
  campaign runs only what is missing, so a million inputs can be collected over several sittings.
* ``totals [--targets a,b] [--json FILE]`` - the accumulated runs of each target summed: inputs, uncaught
  exceptions, hangs, the highest peak RSS (``--json`` also writes them, with every run, to FILE).

An uncaught exception does not stop a campaign: it is counted under its signature (exception type and
innermost Riverbed frame), its first input is saved, and the fuzzing goes on, so one run reports every
bug it meets. ``--stop-on-crash`` gives libFuzzer's usual behaviour instead.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import harness
from .targets import TARGETS, corpus_dir, corpus_inputs, make_target, save_input

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / ".fuzz"
MAX_LEN = 4096               # bytes per fuzz input: enough for every frame shape, small enough to be fast
MEMORY_SAMPLE = 997          # one input in this many runs under tracemalloc (its peak must stay bounded)
TIMEOUT = 30                 # seconds: libFuzzer kills a process stuck this long on one input (a hang)
CORPUS_BUDGET = 48 << 10     # bytes of committed corpus per target after minimisation


class Stats:
    def __init__(self, target, path=None):
        self.target = target
        self.path = path
        self.inputs = 0
        self.findings = {}          # signature -> {"count", "first", "message"}
        self.hangs = 0
        self.slowest = 0.0
        self.max_input_alloc = 0
        self.started = time.monotonic()
        self._last_write = 0.0

    def finding(self, sig, data, message):
        f = self.findings.get(sig)
        if f is None:
            p = save_input(WORK / "findings" / self.target, data)
            self.findings[sig] = f = {"count": 0, "first": str(p), "message": message[:300]}
        f["count"] += 1
        self.write(force=f["count"] == 1)

    def as_dict(self):
        secs = time.monotonic() - self.started
        return {"target": self.target, "inputs": self.inputs, "seconds": round(secs, 1),
                "exec_per_s": round(self.inputs / secs, 1) if secs else 0,
                "uncaught": sum(f["count"] for f in self.findings.values()), "hangs": self.hangs,
                "findings": self.findings, "slowest_s": round(self.slowest, 3),
                "max_input_alloc_mb": round(self.max_input_alloc / 2**20, 1),
                "peak_rss_mb": round(harness.peak_rss_bytes() / 2**20, 1)}

    def write(self, force=False):
        now = time.monotonic()
        if self.path and (force or now - self._last_write > 2.0):
            self._last_write = now
            tmp = f"{self.path}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.as_dict(), f, indent=1)
            os.replace(tmp, self.path)


def run_one(target, stats, data, stop_on_crash=False):
    """One input under the invariants, counted in ``stats``."""
    stats.inputs += 1
    measure = stats.inputs % MEMORY_SAMPLE == 0
    try:
        dt, peak = harness.check_input(target, data, measure_memory=measure)
        if dt > stats.slowest:
            stats.slowest = dt
        if peak > stats.max_input_alloc:
            stats.max_input_alloc = peak
    except Exception as e:  # noqa: BLE001 - every escape is a finding, counted by signature
        if stop_on_crash:
            raise
        cause = getattr(e, "logged", None) or e
        sig = harness.signature(cause)
        if isinstance(e, harness.InvariantBroken) and "hang bound" in str(e):
            stats.hangs += 1
            sig = "hang@" + sig
        elif isinstance(e, harness.LoggedException):
            sig = "logged:" + sig
        stats.finding(sig, data, f"{type(cause).__name__}: {cause}")
    stats.write()


def hypothesis_examples(name, n):
    """``n`` inputs drawn from the target's hypothesis strategy (strategies.py)."""
    from hypothesis import HealthCheck, given, settings

    from .strategies import STRATEGIES

    out = []

    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(STRATEGIES[name])
    def collect(data):
        out.append(data)

    collect()
    return out


def cmd_seed(names, n_hypothesis=0):
    for name in names:
        t = make_target(name)
        try:
            for s in t.seeds():
                save_input(corpus_dir(name), s)
        finally:
            t.close()
        for s in hypothesis_examples(name, n_hypothesis) if n_hypothesis else ():
            if len(s) <= MAX_LEN:
                save_input(corpus_dir(name), s)
        print(f"{name}: {len(corpus_inputs(name))} inputs in {corpus_dir(name)}")


def cmd_replay(names, memory):
    harness.quiet_logging()
    bad = 0
    for name in names:
        t = make_target(name)
        stats = Stats(name)
        try:
            for _, data in corpus_inputs(name):
                stats.inputs += 1
                try:
                    dt, peak = harness.check_input(t, data, measure_memory=memory)
                    stats.slowest = max(stats.slowest, dt)
                    stats.max_input_alloc = max(stats.max_input_alloc, peak)
                except Exception as e:  # noqa: BLE001
                    cause = getattr(e, "logged", None) or e
                    stats.finding(harness.signature(cause), data, f"{type(cause).__name__}: {cause}")
        finally:
            t.close()
        d = stats.as_dict()
        bad += d["uncaught"] + d["hangs"]
        print(json.dumps(d))
    return 1 if bad else 0


def sweep_tmp():
    """Remove the engine directories of fuzz processes that are gone: libFuzzer ends a process with exit(),
    so a target never gets to close its engine and remove its directory itself."""
    tmp = WORK / "tmp"
    if not tmp.is_dir():
        return
    for d in tmp.iterdir():
        pid = d.name.rpartition("-")[2]
        try:
            os.kill(int(pid), 0)
            continue                        # still running
        except (ValueError, ProcessLookupError):
            pass
        except PermissionError:
            continue
        shutil.rmtree(d, ignore_errors=True)


def riverbed_modules():
    """Every Python module name of the riverbed package, from the source tree (nothing imported)."""
    names = []
    for folder, package in (("engine", "riverbed.engine"), ("shells", "riverbed.shells"), ("spark", "riverbed.spark")):
        for p in (ROOT / folder).rglob("*.py"):
            parts = list(p.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join([package, *parts]))
    return names


def _reexec_script(name):
    """libFuzzer runs ``argv[0] <its flags...>`` for the inner processes of ``-merge=1``: a script that
    turns those flags back into this runner's ``fuzz NAME --raw --lf=...`` command line."""
    path = WORK / f"reexec-{name}.sh"
    path.write_text(f"""#!/bin/sh
cd {shlex.quote(str(ROOT))}
args=""
for a in "$@"; do args="$args --lf=$a"; done
exec {shlex.quote(sys.executable)} -m tests.fuzz.runner fuzz {name} --raw $args
""")
    path.chmod(0o755)
    return str(path)


def cmd_fuzz(name, seconds, stats_path, stop_on_crash, extra, raw=False):
    import atheris

    harness.quiet_logging()
    # coverage feedback from the code the target is about only: instrumenting the engine's writer and
    # the broker too would triple the cost of every input and guide nothing
    wanted = TARGETS[name][1]
    exclude = [m for m in riverbed_modules() if not any(m == w or m.startswith(w + ".") for w in wanted)]
    with atheris.instrument_imports(include=["riverbed"], exclude=exclude):
        sweep_tmp()
        target = make_target(name, WORK / "tmp" / f"{name}-{os.getpid()}")
    stats = Stats(name, stats_path)
    seeds = WORK / "seeds" / name
    shutil.rmtree(seeds, ignore_errors=True)
    for s in target.seeds():
        save_input(seeds, s)
    corpus_dir(name).mkdir(parents=True, exist_ok=True)

    def one(data):
        run_one(target, stats, data, stop_on_crash)
        if stats.inputs % 5000 == 0 and harness.rss_bytes() > harness.RSS_MAX:
            stats.write(force=True)

    (WORK / "findings" / name).mkdir(parents=True, exist_ok=True)
    if raw:
        argv = [_reexec_script(name), *extra]
    else:
        argv = [_reexec_script(name), str(corpus_dir(name)), str(seeds), f"-max_total_time={seconds}",
                f"-max_len={MAX_LEN}", f"-timeout={TIMEOUT}", f"-rss_limit_mb={harness.RSS_MAX >> 20}",
                "-print_final_stats=1", f"-artifact_prefix={WORK / 'findings' / name}/", *extra]
    import atexit

    atexit.register(lambda: stats.write(force=True))
    atheris.Setup(argv, one)
    try:
        atheris.Fuzz()
    finally:
        stats.write(force=True)


def _merge(name):
    """Minimise a target's corpus with libFuzzer's merge (keeps inputs that add coverage), then trim it to
    the byte budget, smallest inputs first."""
    d = corpus_dir(name)
    tmp = Path(tempfile.mkdtemp(prefix=f"fuzz-merge-{name}-"))
    try:
        r = subprocess.run([sys.executable, "-m", "tests.fuzz.runner", "fuzz", name, "--raw",
                            "--lf=-merge=1", f"--lf=-max_len={MAX_LEN}", f"--lf={tmp}", f"--lf={d}"], cwd=ROOT,
                           capture_output=True, text=True, timeout=900)
        files = sorted(tmp.iterdir(), key=lambda p: p.stat().st_size)
        if r.returncode == 0 and files:
            total = 0
            shutil.rmtree(d)
            d.mkdir()
            for p in files:
                total += p.stat().st_size
                if total > CORPUS_BUDGET:
                    break
                shutil.copy(p, d / p.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return len(list(d.iterdir())), sum(p.stat().st_size for p in d.iterdir())


TOTALS = WORK / "totals"


def load_totals(name):
    """The accumulated runs of ``name``: ``[row, ...]`` as the campaign recorded them."""
    path = TOTALS / f"{name}.json"
    return json.loads(path.read_text())["runs"] if path.exists() else []


def add_total(name, row):
    TOTALS.mkdir(parents=True, exist_ok=True)
    runs = load_totals(name) + [row]
    tmp = TOTALS / f"{name}.json.tmp"
    tmp.write_text(json.dumps({"target": name, "runs": runs}, indent=1))
    os.replace(tmp, TOTALS / f"{name}.json")


def sum_runs(name, runs):
    """One target's accumulated figures: sums of inputs, seconds, uncaught exceptions and hangs; the
    highest peak RSS of any run (each run is its own process)."""
    findings = {}
    for r in runs:
        for sig, n in r.get("findings", {}).items():
            findings[sig] = findings.get(sig, 0) + n
    secs = sum(r["seconds"] for r in runs)
    inputs = sum(r["inputs"] for r in runs)
    return {"target": name, "runs": len(runs), "inputs": inputs, "seconds": round(secs, 1),
            "exec_per_s": round(inputs / secs) if secs else 0,
            "uncaught": sum(r["uncaught"] for r in runs), "hangs": sum(r["hangs"] for r in runs),
            "peak_rss_mb": max((r["peak_rss_mb"] for r in runs), default=0),
            "oom": any(r.get("oom") for r in runs), "findings": findings}


def _git_commit():
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "engine", "shells"],
                               cwd=ROOT, capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except OSError:
        return "?"


class _Interrupted(Exception):
    pass


def _on_sigterm(signum, frame):
    raise _Interrupted()


def cmd_campaign(names, seconds, merge, runs=0, accumulate=False):
    import signal

    WORK.mkdir(exist_ok=True)
    rows = []
    failed = False
    interrupted = False
    # SIGTERM (or ^C) ends the running target with SIGINT, on which libFuzzer prints its final stats:
    # the inputs it ran still count (--accumulate records them) and the campaign stops there
    signal.signal(signal.SIGTERM, _on_sigterm)
    for name in names:
        if interrupted:
            break
        want = runs
        if accumulate and runs:
            done = sum(r["inputs"] for r in load_totals(name))
            want = runs - done
            if want <= 0:
                print(json.dumps({"target": name, "skipped": f"{done} inputs accumulated"}), flush=True)
                continue
        stats_path = WORK / f"stats-{name}.json"
        log_path = WORK / f"fuzz-{name}.log"
        stats_path.unlink(missing_ok=True)
        t0 = time.monotonic()
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with open(log_path, "w") as log:
            cmd = [sys.executable, "-m", "tests.fuzz.runner", "fuzz", name, "--seconds", str(seconds),
                   "--stats", str(stats_path)]
            if want:
                cmd += [f"--lf=-runs={want}"]
            p = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            while True:
                try:
                    _, status, usage = os.wait4(p.pid, 0)
                    break
                except (KeyboardInterrupt, _Interrupted):
                    interrupted = True
                    p.send_signal(signal.SIGINT)
        sweep_tmp()
        rc = os.waitstatus_to_exitcode(status)
        text = log_path.read_text(errors="replace")
        st = json.loads(stats_path.read_text()) if stats_path.exists() else {"inputs": 0, "findings": {}, "hangs": 0}
        executed = re.findall(r"stat::number_of_executed_units: (\d+)", text)
        libfuzzer_hang = "ALARM: working on the last Unit" in text or "-timeout" in text and "Timeout" in text
        oom = "out-of-memory" in text
        # libFuzzer ends the process with exit(): its own count of executed inputs is the final one
        inputs = int(executed[-1]) if executed else st["inputs"]
        secs = time.monotonic() - t0
        row = {"target": name, "inputs": inputs, "seconds": round(secs, 1), "exec_per_s": round(inputs / secs),
               "uncaught": st.get("uncaught", 0), "hangs": st.get("hangs", 0) + (1 if libfuzzer_hang else 0),
               "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "oom": oom, "exit": rc,
               "findings": {k: v["count"] for k, v in st.get("findings", {}).items()},
               "started": started, "commit": _git_commit(), "interrupted": interrupted}
        if interrupted and not executed:
            row["inputs"] = st["inputs"]
        if accumulate:
            add_total(name, row)
        if merge and not interrupted:
            row["corpus_files"], row["corpus_bytes"] = _merge(name)
            sweep_tmp()
        rows.append(row)
        failed |= bool(row["uncaught"] or row["hangs"] or oom or (rc != 0 and not interrupted)
                       or row["peak_rss_mb"] > 300)
        print(json.dumps(row), flush=True)
    print()
    print(f"{'target':8} {'inputs':>10} {'exec/s':>8} {'uncaught':>8} {'hangs':>5} {'peak RSS MB':>11} {'corpus':>12}")
    for r in rows:
        corpus = f"{r.get('corpus_files', '-')}/{r.get('corpus_bytes', '-')}B"
        print(f"{r['target']:8} {r['inputs']:>10} {r['exec_per_s'] or 0:>8} {r['uncaught']:>8} {r['hangs']:>5} "
              f"{r['peak_rss_mb']:>11} {corpus:>12}")
        for sig, n in r["findings"].items():
            print(f"    {n:>8} x {sig}")
    with open(WORK / f"campaign-{'-'.join(names)}.json", "w") as f:
        json.dump(rows, f, indent=1)
    if accumulate:
        print()
        cmd_totals(names)
    return 1 if failed or interrupted else 0


def cmd_totals(names, json_path=None):
    """Print (and with ``json_path`` write) each target's accumulated figures."""
    sums = []
    print(f"{'target':8} {'runs':>4} {'inputs':>10} {'exec/s':>8} {'uncaught':>8} {'hangs':>5} {'peak RSS MB':>11}")
    for name in names:
        runs = load_totals(name)
        if not runs:
            continue
        t = sum_runs(name, runs)
        sums.append(dict(t, each_run=runs))
        print(f"{name:8} {t['runs']:>4} {t['inputs']:>10} {t['exec_per_s']:>8} {t['uncaught']:>8} {t['hangs']:>5} "
              f"{t['peak_rss_mb']:>11}")
        for sig, n in t["findings"].items():
            print(f"    {n:>8} x {sig}")
    if json_path:
        Path(json_path).write_text(json.dumps(sums, indent=1) + "\n")
    return 1 if any(t["uncaught"] or t["hangs"] or t["oom"] or t["peak_rss_mb"] > 300 for t in sums) else 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz.runner")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("seed")
    s.add_argument("targets", nargs="*")
    s.add_argument("--hypothesis", type=int, default=0, help="also add this many hypothesis examples per target")
    r = sub.add_parser("replay")
    r.add_argument("targets", nargs="*")
    r.add_argument("--memory", action="store_true", help="measure every input's peak allocation (tracemalloc)")
    f = sub.add_parser("fuzz")
    f.add_argument("target", choices=sorted(TARGETS))
    f.add_argument("--seconds", type=int, default=60)
    f.add_argument("--stats")
    f.add_argument("--stop-on-crash", action="store_true")
    f.add_argument("--raw", action="store_true", help="only the --lf flags reach libFuzzer (merge's inner runs)")
    f.add_argument("--lf", action="append", default=[], metavar="-FLAG=VALUE",
                   help="a libFuzzer flag, e.g. --lf=-runs=1000 (repeatable)")
    m = sub.add_parser("minimize")
    m.add_argument("targets", nargs="*")
    c = sub.add_parser("campaign")
    c.add_argument("--seconds", type=int, default=int(os.environ.get("FUZZ_SECONDS", "60")))
    c.add_argument("--targets", default=os.environ.get("FUZZ_TARGETS", ",".join(TARGETS)))
    c.add_argument("--no-merge", action="store_true")
    c.add_argument("--runs", type=int, default=int(os.environ.get("FUZZ_RUNS", "0")),
                   help="stop a target after this many inputs (0: only the time limit)")
    c.add_argument("--accumulate", action="store_true",
                   help="--runs is a total: add this campaign's runs to .fuzz/totals/ and run only what is missing")
    tt = sub.add_parser("totals")
    tt.add_argument("--targets", default=",".join(TARGETS))
    tt.add_argument("--json", help="also write the sums and every run to this file")
    a = ap.parse_args(argv)
    if a.cmd == "seed":
        cmd_seed(a.targets or list(TARGETS), a.hypothesis)
        return 0
    if a.cmd == "replay":
        return cmd_replay(a.targets or list(TARGETS), a.memory)
    if a.cmd == "minimize":
        for name in a.targets or list(TARGETS):
            files, size = _merge(name)
            print(f"{name}: {files} inputs, {size} bytes")
        return 0
    if a.cmd == "fuzz":
        cmd_fuzz(a.target, a.seconds, a.stats, a.stop_on_crash, a.lf, a.raw)
        return 0
    if a.cmd == "totals":
        return cmd_totals([n for n in a.targets.split(",") if n], a.json)
    return cmd_campaign([n for n in a.targets.split(",") if n], a.seconds, not a.no_merge, a.runs, a.accumulate)


if __name__ == "__main__":
    sys.exit(main())
