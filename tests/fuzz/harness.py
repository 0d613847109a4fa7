"""What every fuzz target shares: a real engine and broker driven without I/O, the input layout (a flag
byte, then the protocol's bytes), and the invariants checked on every input.

A target (see :mod:`.targets`) has ``run(data)``: it feeds ``data`` to the protocol's codec and to a fresh
sans-I/O session over a real Engine, settles the engine's completions, and, when the session kept the
connection and ended on a frame boundary, sends one well-formed request and checks it is answered. It
raises :class:`InvariantBroken` when the session misbehaves (no answer to a well-formed request,
a broken close, a leaked registration); any other exception out of ``run`` is a bug the fuzz found.

Not thread-safe: one target per thread (each owns its engine).
"""

import logging
import os
import resource
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

from ..shells.harness import FakeIO, Loop  # noqa: F401 - FakeIO: the targets' byte-stream io

FLAG_PRELUDE = 0x01          # the harness opens the session (handshake, auth) before the fuzz bytes
SPLIT_SHIFT = 1              # bits 1-2: the fuzz bytes arrive in 1..4 reads (buffering paths)
SPLIT_MASK = 0x03

HANG_SECONDS = 3.0           # an input that takes longer than this is a hang (same bound as the soak)
INPUT_MEMORY_MAX = 32 << 20  # bytes one input may allocate at its peak (checked under tracemalloc)
RSS_MAX = 300 << 20          # a fuzz process's peak RSS bound, bytes
RESET_EVERY = int(os.environ.get("FUZZ_RESET_EVERY", "500"))  # inputs between engine resets: bounds disk, map
# pages, and the streams that inputs publish to and then read from their start (zmq, ream, rmq, ws seeds all
# do): at 5,000 a late input replayed thousands of earlier inputs' records, a 4x slowdown; a reset costs ~50 ms


class InvariantBroken(AssertionError):
    """The session broke a rule every input must keep (not an exception it raised by itself)."""


def flags_and_body(data):
    """``(flags, body)`` of one fuzz input: the first byte is flags, the rest the protocol's bytes."""
    if not data:
        return 0, b""
    return data[0], data[1:]


def pieces(flags, body):
    """``body`` cut into the 1..4 reads the flags ask for, at fixed fractions (deterministic)."""
    n = ((flags >> SPLIT_SHIFT) & SPLIT_MASK) + 1
    if n == 1 or len(body) < n:
        return [body]
    cuts = [len(body) * i // n for i in range(n + 1)]
    return [body[cuts[i]:cuts[i + 1]] for i in range(n)]


class EngineRig(Loop):
    """tests/shells/harness.py's Loop (a real Engine, fsync never, no retention pass, and a Broker over
    it, with a settable clock; completions run by :meth:`settle`) in a temp directory, restartable so
    that a long campaign keeps bounded state."""

    SETTLE_TIMEOUT = HANG_SECONDS * 3

    def __init__(self, root=None, auth=None):
        self.root = Path(root or tempfile.mkdtemp(prefix="riverbed-fuzz-"))
        self.generation = 0
        self.eng = self.broker = None
        super().__init__(self.root, auth=auth)

    def _open(self, data=None):
        self.generation += 1
        super()._open(self.root / f"data{self.generation}", map_size=64 << 20)

    def _never_settled(self):
        return InvariantBroken("the session never settled (completions kept scheduling more)")

    def reset(self):
        """A fresh engine and broker (the old data directory is removed)."""
        old = self.root / f"data{self.generation}"
        self.close_engine()
        shutil.rmtree(old, ignore_errors=True)
        self._open()

    def settle(self, rounds=200):
        super().settle(rounds)

    def close_engine(self):
        if self.broker is not None:
            self.broker.close()
        if self.eng is not None:
            self.eng.close()
        self.eng = self.broker = None

    def close(self):
        self.close_engine()
        shutil.rmtree(self.root, ignore_errors=True)


def rss_bytes():
    """The process's resident set now, bytes (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def peak_rss_bytes():
    """The process's peak resident set so far, bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def signature(exc):
    """A short stable name for a failure: the exception type and the innermost frame in Riverbed code
    (or the innermost frame at all), so one bug found a thousand times counts once."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/shells/" in f.filename or "/engine/" in f.filename] or frames
    where = f"{Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else "?"
    return f"{type(exc).__name__}@{where}"


def check_input(target, data, measure_memory=False):
    """Run one input through ``target`` under the invariants. Returns ``(seconds, peak_alloc)``; raises
    what the target raised, or InvariantBroken for a hang or an input that allocated too much."""
    if measure_memory:
        tracemalloc.start()
    t0 = time.perf_counter()
    try:
        target.run(data)
    finally:
        dt = time.perf_counter() - t0
        peak = 0
        if measure_memory:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    if dt > HANG_SECONDS:
        raise InvariantBroken(f"input took {dt:.2f} s (hang bound {HANG_SECONDS} s)")
    if peak > INPUT_MEMORY_MAX:
        raise InvariantBroken(f"input allocated {peak >> 20} MiB at its peak (bound {INPUT_MEMORY_MAX >> 20} MiB)")
    return dt, peak


class _LoggedErrors(logging.Handler):
    """Collects ERROR records that carry an exception: a session that catches a bug itself and logs
    "internal error" / "request failed" has still hit an unhandled exception, and the fuzz counts it."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records = []
        self.active = False         # only while a target runs an input: other tests' logs are theirs

    def emit(self, record):
        if self.active and record.exc_info and record.exc_info[1] is not None:
            self.records.append(record)


class LoggedException(AssertionError):
    """A session logged an exception it caught itself (its own "internal error" path)."""

    def __init__(self, record):
        super().__init__(f"logged: {record.getMessage()[:200]}")
        self.__cause__ = record.exc_info[1]
        self.logged = record.exc_info[1]


FLAG_TICK = 0x08             # after the input, the clock jumps 100 s and the session ticks (timeouts)

_LOGGED = _LoggedErrors()
logging.getLogger("riverbed").addHandler(_LOGGED)


def quiet_logging():
    """For fuzz processes: the sessions log every protocol close at WARNING, and millions of lines would
    cost more than the parsing; ERROR and above still reach the collector. (Not at import: a test run
    that imports this module must keep its own logging.)"""
    logging.disable(logging.WARNING)


class SessionTarget:
    """One protocol: its codec and its sans-I/O session over a real engine. Subclasses give
    ``make_shell()``, ``codec(body)``, ``open_session()``, ``prelude(session)``, ``feed(session, piece)``,
    ``probe(session)`` (True when the session answered a well-formed request, None when the
    protocol cannot take one now) and ``seeds()``. ``codec_errors``: what the codec raises on bad input
    on purpose; anything else out of the codec is a finding."""

    name = "?"
    codec_errors = ()

    def __init__(self, root=None, auth=None):
        self.rig = EngineRig(root, auth=auth)
        self.shell = self.make_shell()
        self.count = 0

    # subclass hooks -------------------------------------------------------------------------------
    def make_shell(self):
        return None

    def codec(self, body):
        pass

    def close_shell(self):
        pass

    # the run --------------------------------------------------------------------------------------
    def reset(self):
        self.close_shell()
        self.rig.reset()
        self.shell = self.make_shell()

    def run(self, data):
        self.count += 1
        if self.count % RESET_EVERY == 0:
            self.reset()
        flags, body = flags_and_body(data)
        try:
            self.codec(body)
        except self.codec_errors:
            pass
        _LOGGED.records.clear()
        _LOGGED.active = True
        try:
            self.session_run(flags, body)
        except BaseException:
            self._clean_up()
            raise
        finally:
            _LOGGED.active = False
        if _LOGGED.records:
            rec = _LOGGED.records[0]
            _LOGGED.records.clear()
            raise LoggedException(rec)

    def session_run(self, flags, body):
        rig = self.rig
        s = self.open_session()
        if flags & FLAG_PRELUDE:
            self.prelude(s)
        for piece in pieces(flags, body):
            self.feed(s, piece)
        rig.settle()
        if flags & FLAG_TICK:
            rig.now += 100.0
            self.tick(s, rig.now)
            rig.settle()
        answered = self.probe(s)
        if answered is False:
            raise InvariantBroken("a well-formed request after the input got no answer and no close")
        self.end_session(s)
        rig.settle()
        if rig.broker.sessions:
            raise InvariantBroken(f"{len(rig.broker.sessions)} session(s) still registered after connection_lost")

    def _clean_up(self):
        """After a finding: end every session the failed input left behind, so the next input starts
        clean (a leak is reported once, by the input that caused it)."""
        for s in list(self.rig.broker.sessions):
            try:
                s.connection_lost()
            except Exception:  # noqa: BLE001 - already reported through the original failure
                self.rig.broker.unregister(s)
        try:
            self.rig.settle()
        except Exception:  # noqa: BLE001
            pass
        _LOGGED.records.clear()

    def tick(self, s, now):
        s.tick(now)

    def end_session(self, s):
        s.connection_lost()

    def close(self):
        self.close_shell()
        self.rig.close()
