"""What every sans-I/O session test needs: a fake transport ``io`` that records what a session writes, and a
real Engine with a Broker whose ``post`` queue the test drains instead of an event loop."""

import queue

from riverbed.engine import Engine
from riverbed.shells.broker import Broker


class FakeIO:
    """A session's ``io``: bytes written go to ``out``; ``defer`` calls wait in ``deferred`` for
    :meth:`Loop.settle` (or the test) to run them."""

    def __init__(self):
        self.out = bytearray()
        self.closed = False
        self.reading = True
        self.deferred = []
        self.writes = 0

    def write(self, data):
        self.out += data
        self.writes += 1

    def writelines(self, parts):
        for p in parts:
            self.out += p
        self.writes += 1

    def close(self):
        self.closed = True

    def pause_reading(self):
        self.reading = False

    def resume_reading(self):
        self.reading = True

    def defer(self, fn, *args):
        self.deferred.append((fn, args))


class Loop:
    """An Engine in ``tmp_path/data`` (fsync never, no retention pass) and the Broker over it, with a
    settable clock ``now`` (seconds). Engine completions are queued by ``post`` and run by :meth:`settle`,
    on the test's thread, as the event loop would. The fuzz harness's EngineRig is one, restartable."""

    SETTLE_TIMEOUT = 10.0       # seconds an engine sync may take in settle()

    def __init__(self, tmp_path, auth=None, now=1000.0):
        self.now = now
        self.auth = auth
        self.ios = []               # FakeIOs whose deferred calls settle() runs too
        self._open(tmp_path / "data")

    def _open(self, data, **engine_options):
        self.q = queue.Queue()
        self.eng = Engine(data, fsync="never", retention_interval=0, **engine_options)
        self.broker = Broker(self.eng, post=lambda fn, *a: self.q.put((fn, a)), clock=lambda: self.now,
                             data_dir=str(data), auth=self.auth)

    def new_io(self):
        io = FakeIO()
        self.ios.append(io)
        return io

    def _never_settled(self):
        return AssertionError("never settled")

    def settle(self, rounds=1000):
        """Run every engine completion, and what it triggers, until nothing is left."""
        q = self.q
        writer = self.eng._writer
        for _ in range(rounds):
            # the writer decrements _outstanding after an operation's completion is posted: at 0 there is
            # nothing to wait for, and skipping the sync round trip (two thread hand-offs) doubles the rate
            if writer._outstanding:
                self.eng.sync().result(timeout=self.SETTLE_TIMEOUT)
            ran = False
            while True:
                try:
                    fn, args = q.get_nowait()
                except queue.Empty:
                    break
                fn(*args)
                ran = True
            for io in self.ios:
                while io.deferred:
                    fn, args = io.deferred.pop(0)
                    fn(*args)
                    ran = True
            if not ran:
                return
        raise self._never_settled()

    def close(self):
        self.broker.close()
        self.eng.close()
