"""The disk alarm: publishes are refused while the data directory is short of space, as RabbitMQ's
``disk_free_limit`` blocks publishers.

:class:`DiskMonitor` looks once a second (``statvfs`` and the engine's page counts: microseconds) and
whenever the engine refuses a write for want of space. The alarm is on while

* the free space is under ``free_limit`` (``riverbed serve --disk-free-limit``): the filesystem's free
  space (what ``df`` says) plus the pages inside the data file that deletions and retention freed (LMDB
  reuses them before the file grows; the data file's reserved tail, at most half of what was free when
  it grew, is not counted: see engine/space.py), or
* ``max_disk`` is set (``--max-disk``) and the data is within :func:`cap_margin` of it (the engine
  refuses appends that would take the data file past it anyway).

While it is on, :meth:`Broker._appended` refuses every append, of every protocol, with
:class:`~riverbed.engine.errors.StorageFull` before it reaches the engine; each shell answers with its
protocol's error (nothing is stored, so nothing is confirmed). Reads, subscriptions, consumer offsets
and deletions go on: a deletion is how space comes back. The alarm clears by itself at the first look
that finds space again. Setting and clearing are logged once each; ``/healthz`` is 503 and names the
disk while it is on, ``/metrics`` has ``riverbed_disk_*``.

Loop thread only.
"""

import logging

from riverbed.engine.errors import StorageFull
from riverbed.engine.space import SPARE, usage

log = logging.getLogger("riverbed.broker")

DEFAULT_FREE_LIMIT = 50 << 20           # bytes: RabbitMQ's default disk_free_limit (50MB), as --disk-free-limit 50MB
CHECK_INTERVAL = 1.0                     # seconds between two looks


def cap_margin(max_disk):
    """Bytes under ``max_disk`` at which publishing stops: 1/16 of it (at most 16 MiB) below the engine's
    own limit for appends, which keeps the last 2 MiB (at most 1/8) for the small writes that free space
    (deletions, retention; engine/space.py), so the alarm, not a failed write, is what publishers meet."""
    return min(SPARE, max_disk // 8) + min(max_disk // 16, 16 << 20)


def _mib(n):
    return f"{n / (1 << 20):.1f} MiB"


class DiskMonitor:
    """The disk alarm of one broker. ``free_limit`` and ``max_disk`` in bytes (``max_disk`` None: no cap).

    ``alarm`` (bool), ``free`` (bytes free as the alarm counts it), ``data_bytes`` (bytes of data in the
    data file) and ``reason`` (one line, None while no alarm) are the last look's; ``refused`` counts the
    appends the broker refused because of it; ``check()`` looks
    again. ``start(loop)`` looks every ``interval`` seconds until ``stop()``.
    """

    def __init__(self, engine, *, free_limit=DEFAULT_FREE_LIMIT, max_disk=None, interval=CHECK_INTERVAL):
        self.engine = engine
        self.free_limit = int(free_limit)
        self.max_disk = None if max_disk is None else int(max_disk)
        self.interval = interval
        self.alarm = False
        self.reason = None
        self.free = None
        self.data_bytes = None
        self.file_bytes = None
        self.refused = 0              # appends (a publish frame or batch each) refused by the alarm so far
        self._cap_done = None         # the engine refusal that room has come back since
        self._timer = None
        self._loop = None

    def check(self):
        """Look at the disk now and set or clear the alarm (logging the change). Returns ``alarm``."""
        try:
            u = usage(self.engine)
        except OSError as e:           # the data directory vanished or is unreadable: say so, keep the state
            log.error("cannot look at the disk of %s: %s", self.engine.path, e)
            return self.alarm
        if u is None:                  # the engine is closed (shutting down)
            return self.alarm
        fs_free, map_size, high_water, live = u
        # pages freed inside the file count: deleting a stream gives room back without shrinking the file
        self.free = fs_free + max(0, high_water - live)
        self.data_bytes = live
        self.file_bytes = map_size
        reason = None
        if self.free < self.free_limit:
            reason = (f"disk space low: {_mib(self.free)} free for {self.engine.path}, under the limit of "
                      f"{_mib(self.free_limit)} (--disk-free-limit)")
        elif self.max_disk is not None and (self._cap_refused(live) or live > self.max_disk - cap_margin(self.max_disk)):
            reason = (f"data at its cap: {_mib(live)} of {_mib(self.max_disk)} (--max-disk) used in "
                      f"{self.engine.path}")
        if reason is not None and not self.alarm:
            log.warning("disk alarm set: %s; publishes are refused until space returns", reason)
        elif reason is None and self.alarm:
            log.warning("disk alarm cleared: %s free for %s; publishes are accepted again", _mib(self.free),
                        self.engine.path)
        self.alarm = reason is not None
        self.reason = reason
        return self.alarm

    def _cap_refused(self, live):
        """Whether the engine refused an append at --max-disk and room has not come back since: the data
        has not shrunk below twice :func:`cap_margin` under the cap. (Near the cap ``live`` alone is an
        optimistic measure: LMDB holds freed pages it cannot reuse yet.)"""
        space = self.engine._space
        refused = getattr(space, "refused", None)
        if refused is None or refused.limit is None or refused.limit != space.max_size or refused is self._cap_done:
            return False
        if live < self.max_disk - 2 * cap_margin(self.max_disk):
            self._cap_done = refused           # a deletion or retention gave room back
            return False
        return True

    def error(self):
        """The StorageFull a refused publish gets while the alarm is on."""
        limit = self.free_limit
        if self.reason is not None and self.reason.startswith("data at its cap"):
            limit = self.max_disk
        return StorageFull(f"disk alarm: {self.reason}; publishes are refused until space returns",
                           free=self.free, limit=limit)

    def start(self, loop):
        """Look now, then every ``interval`` seconds on ``loop``."""
        self._loop = loop
        self.check()
        self._timer = loop.call_later(self.interval, self._tick)

    def _tick(self):
        try:
            self.check()
        except Exception:  # one failed look must not stop the next ones
            log.exception("disk check failed")
        if self._loop is not None:
            self._timer = self._loop.call_later(self.interval, self._tick)

    def stop(self):
        self._loop = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
