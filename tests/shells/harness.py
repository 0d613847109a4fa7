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
    on the test's thread, as the event loop would."""

    def __init__(self, tmp_path, auth=None, now=1000.0):
        self.q = queue.Queue()
        self.now = now
        self.ios = []               # FakeIOs whose deferred calls settle() runs too
        self.eng = Engine(tmp_path / "data", fsync="never", retention_interval=0)
        self.broker = Broker(self.eng, post=lambda fn, *a: self.q.put((fn, a)), clock=lambda: self.now,
                             data_dir=str(tmp_path / "data"), auth=auth)

    def new_io(self):
        io = FakeIO()
        self.ios.append(io)
        return io

    def settle(self, rounds=1000):
        """Run every engine completion, and what it triggers, until nothing is left."""
        for _ in range(rounds):
            self.eng.sync().result(timeout=10)
            ran = False
            while True:
                try:
                    fn, args = self.q.get_nowait()
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
        raise AssertionError("never settled")

    def close(self):
        self.broker.close()
        self.eng.close()
