"""Disk space for the LMDB environment: nothing is ever written through the map into space the
filesystem has not given.

With MDB_WRITEMAP (fsync=never, see ``log.lmdb_flags``) LMDB writes pages straight into a shared memory
map of ``data.mdb`` and sizes that file to the map with ``ftruncate``, which leaves it sparse. The first
write to a page whose blocks the filesystem cannot find then faults with SIGBUS and kills the process
(a full disk used to end the server with "Bus error", exit 135, and nothing in the log). The same holds
for ``lock.mdb``, the reader table LMDB maps too. So:

* at open, ``lock.mdb`` and the whole map of ``data.mdb`` are reserved with ``posix_fallocate``; when the
  filesystem cannot give the whole map, the map is shrunk to what it can give (never below the data);
* the map grows only after the growth is reserved the same way (:meth:`MapSpace.grow`). When the
  filesystem cannot give it (ENOSPC, EDQUOT), or the map would pass ``max_size``, the growth is refused
  with :class:`~riverbed.engine.errors.StorageFull`: the write that needed it fails alone, with that
  error, and the engine goes on (retention, deletions and writes that fit in the map still commit).

Without WRITEMAP (the sync policies, or ``RIVERBED_WRITEMAP=0``) LMDB writes with ``pwrite``, and a
full disk fails the commit with EIO, which cannot be told from a failing disk; the map is reserved the
same way, so that a ``pwrite`` inside it never finds the disk full.

The map grows by doubling, in steps of at most :data:`GROW_STEP_MAX`, and never by more than half of the
filesystem's free space (but always by what the failed transaction needs).
"""

import errno
import logging
import os

from riverbed.engine.errors import RiverbedError, StorageFull

log = logging.getLogger("riverbed.engine")

MIB = 1 << 20
ALIGN = 64 << 10            # map sizes are multiples of this (a multiple of every OS page size in use)
GROW_STEP_MAX = 1 << 30     # bytes: the map doubles until it is this big, then grows by this much
GROW_SLACK = 4 << 20        # bytes a growth adds beyond twice what the transaction wrote (LMDB's own pages)
SPARE = 2 << 20             # bytes under the cap and of the filesystem appends may not take (see grow)
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_NO_FALLOCATE = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


def fs_free(path):
    """Bytes a non-root writer may still use on the filesystem that holds ``path`` (``statvfs``:
    ``f_bavail * f_frsize``). A few microseconds; any thread."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _align_up(n):
    return -(-n // ALIGN) * ALIGN


def _align_down(n):
    return n // ALIGN * ALIGN


def _mib(n):
    return f"{n / MIB:.1f} MiB"


class MapSpace:
    """The data file's disk reservation and the map's growth, for one read-write Engine.

    ``max_size`` (bytes or None) caps the map, so the data file never grows past it. ``reserve``: every
    byte of the map is reserved on disk before LMDB may use it (False only for tests of the growth).
    Writer thread only (and the Engine's constructor, before the writer starts).
    """

    def __init__(self, engine, max_size=None, reserve=True):
        self.engine = engine
        self.max_size = None if max_size is None else max(_align_down(int(max_size)), ALIGN)
        self.reserve = reserve
        self.refused = None          # StorageFull of the last refused growth; None once the map grew again
        self._fd = None
        if reserve:
            self._fd = os.open(os.path.join(engine.path, "data.mdb"), os.O_RDWR | os.O_CLOEXEC)

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # ------------------------------------------------------------------------------------------ open

    def open_check(self):
        """Reserve ``lock.mdb`` and the map at open (no transaction open, writer not started yet).

        Raises StorageFull when not even the lock file's or the present data's blocks can be had."""
        eng = self.engine
        env = eng.env
        lock = os.path.join(eng.path, "lock.mdb")
        if os.path.exists(lock):
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
            try:
                self._allocate(fd, 0, os.fstat(fd).st_size, what="lock.mdb")
            finally:
                os.close(fd)
        size = env.info()["map_size"]
        used = self.high_water()
        target = size
        cap = self.max_size
        if cap is not None and target > cap - min(SPARE, cap // 8):
            # appends stop short of the cap (see grow): the last bit is grown into by deletions only
            target = max(_align_down(cap - min(SPARE, cap // 8)), _align_up(used))
            log.info("data file capped at %s (--max-disk)", _mib(cap))
        if self.reserve:
            try:
                self._allocate(self._fd, 0, target)
            except StorageFull:
                # not all of it: as much of the map as the filesystem can give, keeping half its free space
                smaller = max(_align_up(used), _align_down(used + fs_free(eng.path) // 2))
                if smaller >= target:
                    raise
                log.warning("the filesystem of %s cannot hold a %s data file: the map starts at %s",
                            eng.path, _mib(target), _mib(smaller))
                target = smaller
                self._allocate(self._fd, 0, target)
        if target != size:
            env.set_mapsize(target)

    # ---------------------------------------------------------------------------------------- growth

    def high_water(self):
        """Bytes of the data file LMDB has ever used: up to its last page (free pages inside count)."""
        env = self.engine.env
        return (env.info()["last_pgno"] + 1) * env.stat()["psize"]

    def grow(self, need, bulk=True):
        """Grow the map for a transaction that found it full after writing ``need`` bytes; returns the new
        size. Reserves the growth on disk first. Raises StorageFull, with the map as it
        was, when the filesystem cannot give even the least growth or the map is at ``max_size``.

        ``bulk``: the transaction holds appends or transact functions, which may not take the last
        :data:`SPARE` bytes under ``max_size`` or of the filesystem: those are kept for the small writes
        that give space back (a deletion, its purge, retention: in LMDB even a delete copies the pages it
        changes), so a full data file can always be emptied. Writer thread, with no transaction open."""
        eng = self.engine
        old = eng.env.info()["map_size"]
        least = old + 2 * need + GROW_SLACK
        want = max(old + min(old, GROW_STEP_MAX), least)
        free = fs_free(eng.path) if self.reserve else None
        if free is not None:
            want = min(want, max(least, old + free // 2))
        want, least = _align_up(want), _align_up(least)
        cap = self.max_size
        if cap is not None:
            limit = cap - min(SPARE, cap // 8) if bulk else cap
            if old >= limit:
                self.refused = StorageFull(f"the data file is at its cap of {_mib(cap)} (--max-disk); nothing more "
                                           f"can be stored until retention or a deletion frees space", limit=cap)
                raise self.refused
            want, least = min(want, limit), min(least, limit)
        err = None
        for target in dict.fromkeys((want, least)):
            try:
                if bulk and free is not None and free - (target - old) < SPARE:
                    raise StorageFull(f"disk full: {_mib(free)} free on the filesystem of {eng.path}; the data "
                                      f"file may not grow by {_mib(target - old)} (the last {_mib(SPARE)} are kept "
                                      f"for deletions and retention)", free=free)
                self._allocate(self._fd, old, target)
            except StorageFull as e:
                err = e
                continue
            log.info("LMDB map full at %s; growing to %s", _mib(old), _mib(target))
            eng._gate.exclusive(lambda: eng.env.set_mapsize(target))
            self.refused = None
            return target
        self.refused = err
        raise err

    def _allocate(self, fd, start, end, what="data.mdb"):
        """Give bytes ``start..end`` of the file ``fd`` blocks on disk (no-op when ``fd`` is None). Raises StorageFull when the filesystem has no room; falls back to comparing with the free
        space on a filesystem without fallocate."""
        if fd is None or end <= start:
            return
        path = self.engine.path
        try:
            os.posix_fallocate(fd, start, end - start)
        except OSError as e:
            if e.errno in _FULL:
                free = fs_free(path)
                raise StorageFull(f"disk full: the filesystem of {path} cannot give {what} the {_mib(end - start)} "
                                  f"it needs to grow to {_mib(end)} ({_mib(free)} free)", free=free) from None
            if e.errno not in _NO_FALLOCATE:
                raise RiverbedError(f"cannot reserve disk space for {what}: {e}") from None
            free = fs_free(path)
            if free < end - start:
                raise StorageFull(f"disk full: {_mib(free)} free on the filesystem of {path}, {what} needs "
                                  f"{_mib(end - start)} more", free=free) from None


def usage(engine):
    """Space figures of a read-write engine's data directory, for the broker's disk alarm and /metrics:
    ``(fs_free, map_size, high_water, live)`` in bytes. ``fs_free`` is the filesystem's free space;
    ``map_size`` the map (the data file, all of it reserved on disk); ``high_water`` the
    part of it LMDB has used so far (up to its last page); ``live`` the bytes of pages that hold data
    (every database's branch, leaf and overflow pages, plus the two meta pages), so ``high_water - live``
    are pages that deletions and retention freed, which LMDB reuses before it grows the file. One short
    read transaction; any thread. Returns None once the engine is closed.
    """
    if engine._closed:
        return None
    free = fs_free(engine.path)
    dbs = [db for db in (engine._db_streams, engine._db_chunks, engine._db_time, engine._db_tracking, engine._db_meta,
                         engine._db_supers, engine._db_docs, engine._db_docidx, engine._db_collections)
           if db is not None]
    gate = engine._gate
    gate.enter()
    try:
        if engine._closed:
            return None
        env = engine.env
        info = env.info()
        size = info["map_size"]
        main = env.stat()
        psize = main["psize"]
        pages = 2 + main["branch_pages"] + main["leaf_pages"] + main["overflow_pages"]
        with env.begin() as txn:
            for db in dbs:
                st = txn.stat(db)
                pages += st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
    finally:
        gate.leave()
    return free, size, (info["last_pgno"] + 1) * psize, pages * psize
