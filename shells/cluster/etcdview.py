"""A node's copy of its cluster's keys in etcd, kept current by ONE etcd watch instead of polling.

Why: a node used to read four directories of the cluster's keys every 0.25 s. That was most of an idle
node's CPU and about half of the cluster-only cost per published message, and a change (a leader's node
key deleted by its expired lease, a new placement) was seen only at the next read. A watch costs nothing
while nothing changes and delivers a change within milliseconds.

How the copy stays right (:class:`EtcdView`):

* One range read of the whole prefix gives every key and the store revision R it was read at; the watch
  starts at R + 1, so nothing written between the read and the watch is missed (etcd replays it).
* Events are applied in revision order; one at or below the copy's revision is skipped (a read already
  holds it).
* A stream that breaks (etcd restarted, stopped or compacted, the endpoint gone, a refusal) is followed by
  a new full read and a new watch from its revision; while etcd does not answer, the read is tried again
  every RETRY seconds. Meanwhile :attr:`EtcdView.current` is False and the node acts on nothing (as when a
  poll failed). :meth:`EtcdView.suspect` drops a stream on evidence from elsewhere (a failed lease
  keepalive), so a stream that hangs without closing (a stopped etcd, a silent connection) is re-made.
* A safety re-read every ``safety`` seconds: the copy is replaced when the read is newer, and a copy
  found behind a key's revision at two re-reads in a row is a watch that hangs: it is re-made.
* The node's own writes: ``Etcd.written`` is the highest revision any write of the node's client was
  answered at. :meth:`EtcdView.catch_up` waits until the copy has reached it (at most CATCH_UP seconds,
  then a full read), so the node never acts on a copy older than its own last write (a placement it just
  made would look absent, and the node would undo its own change).

``on_change(dirs)`` is called (on the loop) with the set of top directories (``"nodes/"``,
``"streams/"``, ...) whose keys changed; after a full read with every directory.

Loop thread only (the node's event loop).
"""

import asyncio
import logging
import time

from riverbed.shells.cluster.etcd import EtcdError

log = logging.getLogger("riverbed.cluster")

RETRY = 0.25          # seconds between two reads while etcd does not answer (the old poll's period)
CATCH_UP = 0.5        # seconds a reconcile waits for the watch to bring the node's own write, then reads


class EtcdView:
    """The keys under ``prefix`` (a ``/riverbed/<cluster>/`` string) of ``etcd`` (an Etcd client), kept
    by a watch: :meth:`items` of a directory, :attr:`revision`, :attr:`current`. ``start()`` after a first
    :meth:`resync`; ``close()`` when done."""

    def __init__(self, etcd, prefix, on_change, safety):
        self.etcd = etcd
        self.prefix = prefix
        self._skip = len(prefix.encode())
        self.on_change = on_change
        self.safety = safety            # seconds between two safety re-reads
        self.dirs = {}                  # top directory ("streams/") -> {key after the prefix: KeyValue}
        self.revision = 0               # the store revision the copy holds every change up to
        self.current = False            # a read or a live watch backs the copy
        self.down = False               # etcd did not answer the last read (logged once per outage)
        self.reads = 0                  # full reads done (for tests and the profile notes)
        self._moved = asyncio.Event()   # set whenever the revision moves
        self._stream = None             # the task reading the current watch stream
        self._tasks = []
        self._closed = False
        self._behind = False            # the last safety read found the watch behind

    # ------------------------------------------------------------------------------ reading

    def items(self, directory):
        """The :class:`~riverbed.shells.cluster.etcd.KeyValue` list under ``directory`` (e.g.
        ``"nodes/"``), in key order as a range read gives them."""
        d = self.dirs.get(directory)
        return [d[k] for k in sorted(d)] if d else []

    async def catch_up(self, revision):
        """Return once the copy is current and holds every change up to ``revision`` (the node's own last
        write): at most CATCH_UP seconds of waiting for the watch, then a full read. EtcdError when etcd
        does not answer (the copy is not current: act on nothing)."""
        deadline = time.monotonic() + CATCH_UP
        while not (self.current and self.revision >= revision):
            left = deadline - time.monotonic()
            if left <= 0:
                await self.resync()
                return
            self._moved.clear()
            try:
                await asyncio.wait_for(self._moved.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def resync(self):
        """Read every key again and replace the copy when the read is newer than it (EtcdError when etcd
        does not answer). Calls ``on_change`` with every directory."""
        try:
            rev, kvs = await self.etcd.read_prefix(self.prefix)
        except EtcdError:
            if not self.down:
                self.down = True
                log.warning("cluster: etcd unreachable; acting on nothing until it answers")
            raise
        self.reads += 1
        if self.down:
            self.down = False
            log.info("cluster: etcd answers again")
        if rev >= self.revision:
            dirs = {}
            for kv in kvs:
                key = kv.key[self._skip:].decode("utf-8", "replace")
                dirs.setdefault(_top(key), {})[key] = kv
            changed = set(dirs) | set(self.dirs)
            self.dirs, self.revision = dirs, rev
            self._moved.set()
        else:
            changed = set(self.dirs)
        self.on_change(changed)
        return rev, kvs

    # ------------------------------------------------------------------------------ watching

    def start(self):
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run()), loop.create_task(self._safety_loop())]

    def suspect(self):
        """Drop the watch stream (something else found etcd unreachable): it is read and watched anew.
        Nothing to do while the copy is being read again already."""
        if self.current and self._stream is not None and not self._stream.done():
            self._stream.cancel()

    def close(self):
        self._closed = True
        for t in self._tasks:
            t.cancel()
        if self._stream is not None:
            self._stream.cancel()

    async def _run(self):
        loop = asyncio.get_running_loop()
        fresh = True            # the copy was just read (start): watch from it without reading again
        while not self._closed:
            began = time.monotonic()
            self._stream = loop.create_task(self._one_stream(fresh))
            try:
                await asyncio.wait([self._stream])
            finally:
                if self._closed:
                    self._stream.cancel()
            self.current = False
            fresh = False
            if self._stream.cancelled():
                log.info("cluster: etcd watch dropped; reading the cluster state again")
            else:
                exc = self._stream.exception()
                if isinstance(exc, EtcdError):
                    log.info("cluster: etcd watch lost: %s", exc)
                elif exc is not None:
                    log.error("cluster: etcd watch failed", exc_info=exc)
            if time.monotonic() - began < RETRY:
                await asyncio.sleep(RETRY)       # etcd refuses or is away: not a tight loop

    async def _one_stream(self, fresh):
        if not fresh:
            while True:
                try:
                    await self.resync()
                    break
                except EtcdError:
                    await asyncio.sleep(RETRY)
        self.current = True
        async for events in self.etcd.watch(self.prefix, self.revision + 1):
            self._apply(events)

    def _apply(self, events):
        changed = set()
        top = self.revision
        for ev in events:
            kv = ev.kv
            if kv.mod_revision <= self.revision:
                continue            # a read holds it already
            key = kv.key[self._skip:].decode("utf-8", "replace")
            d = _top(key)
            if ev.deleted:
                held = self.dirs.get(d)
                if held is not None:
                    held.pop(key, None)
            else:
                self.dirs.setdefault(d, {})[key] = kv
            changed.add(d)
            top = max(top, kv.mod_revision)
        if top > self.revision:
            self.revision = top
            self._moved.set()
        if changed:
            self.on_change(changed)

    async def _safety_loop(self):
        while not self._closed:
            await asyncio.sleep(self.safety)
            if not self.current:
                continue
            seen = self.revision
            try:
                _, kvs = await self.resync()
            except EtcdError:
                self.suspect()
                continue
            # a key changed after what the watch had delivered when the read began: normal for a change
            # a few milliseconds old, a hung watch when it happens at two reads in a row
            behind = any(kv.mod_revision > seen for kv in kvs)
            if behind and self._behind:
                log.warning("cluster: etcd watch fell behind the keys twice; watching anew")
                self.suspect()
                behind = False
            self._behind = behind


def _top(key):
    """The top directory of a key after the cluster prefix (``"streams/"`` of ``"streams/s1"``)."""
    i = key.find("/")
    return key[:i + 1] if i >= 0 else key
