"""Summarise a py-spy ``raw`` (collapsed stacks) profile: where the server's time goes.

    python -m bench._profile PROFILE.txt [--top 25] [--threads]

``python -m bench.compare --profile DIR`` writes one such file per Riverbed run (py-spy record at
200 Hz on the server during the run; the runs are then not retried and their numbers are not
comparable). Prints the share of samples per thread, the top functions by self time, and by inclusive
time (a function counted once per stack).
"""

import argparse
import collections
import re

# leaf-side frames that mean "this thread is waiting, not working" (py-spy --native samples idle threads)
IDLE_MARKS = ("epoll_pwait", "epoll_wait", "_queue_SimpleQueue_get", "PyThread_acquire_lock_timed",
              "pthread_cond_timedwait", "pthread_cond_wait", "select (", "poll (", "lock_PyThread_acquire_lock",
              "Condition.wait", "Event.wait", "time_sleep")
FRAME_RE = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")


def short(frame):
    m = FRAME_RE.match(frame.strip())
    if not m:
        return frame.strip()
    f = m.group("file")
    for cut in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if cut in f:
            f = f.split(cut, 1)[1]
    return f"{m.group('func')} ({f})"


def load(path):
    stacks = []
    with open(path) as fh:
        for line in fh:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, count = line.rpartition(" ")
            try:
                n = int(count)
            except ValueError:
                continue
            stacks.append((stack.split(";"), n))
    return stacks


def summarise(path, top=25, threads=False):
    stacks = load(path)
    total_all = sum(n for _, n in stacks) or 1
    idle = collections.Counter()
    busy = []
    for frames, n in stacks:
        thread = next((f for f in frames if f.startswith("thread ")), "all threads")
        if any(mark in f for f in frames[-6:] for mark in IDLE_MARKS):
            idle[thread] += n
        else:
            busy.append((frames, n))
    stacks = busy
    total = sum(n for _, n in stacks) or 1
    self_t = collections.Counter()
    incl = collections.Counter()
    by_thread = collections.Counter()
    thread_self = collections.defaultdict(collections.Counter)
    for frames, n in stacks:
        # py-spy puts "thread (0x...)" / "process ..." frames first when asked; keep real frames only
        real = [f for f in frames if not f.startswith(("thread ", "process "))]
        thread = next((f for f in frames if f.startswith("thread ")), "all threads")
        by_thread[thread] += n
        if not real:
            continue
        self_t[short(real[-1])] += n
        # the innermost Python-level frame too (native leaves are often anonymous libc addresses)
        thread_self[thread][short(real[-1])] += n
        for name in {short(f) for f in real}:
            incl[name] += n
    out = [f"{path}: {total_all} samples, {total} busy ({100 * total / total_all:.0f}%); "
           "shares below are of the busy samples"]
    if idle:
        out.append("idle (waiting) samples by thread: " + ", ".join(
            f"{t.split(': ')[-1]} {100 * n / total_all:.0f}%" for t, n in idle.most_common()))
    if threads and len(by_thread) > 1:
        out.append("by thread:")
        out += [f"  {100 * n / total:5.1f}%  {t}" for t, n in by_thread.most_common()]
    if threads and len(by_thread) > 1:
        for t, _ in by_thread.most_common():
            out.append(f"self time in {t}:")
            out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in thread_self[t].most_common(8)]
    out.append(f"top {top} by self time:")
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in self_t.most_common(top)]
    out.append(f"top {top} by inclusive time:")
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in incl.most_common(top)]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profile", nargs="+")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--threads", action="store_true")
    a = ap.parse_args()
    for p in a.profile:
        print(summarise(p, a.top, a.threads))
        print()


if __name__ == "__main__":
    main()
