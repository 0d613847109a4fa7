"""Fast failover: members that find their leader's process gone elect at once, without waiting for its lease.

Why: a leader killed with ``kill -9`` keeps its etcd node key until the lease TTL runs out (default 3 s,
and etcd rounds up), so the lease path (lease.py, roles.py) fails over in about TTL + a poll. But the kernel closes a
dead process's sockets at once: each member's replication connection ends and its next dial is refused
(nothing listens on the leader's replication port any more). That is evidence the process is gone that
arrives in milliseconds.

The rule (:class:`LeaderWatch`):

1. A member whose dial of its leader L (stream S, epoch e) is *refused* (ECONNREFUSED: no listener; a
   timeout, an unreachable network or a REFUSE frame do not count) marks (S, e) *lost*.
2. From then on it never follows L at epoch e again: it stops accepting chunks of epoch e from L, and
   only then reports its final position in etcd (``progress/S/<node>`` with ``detached: e``), exactly as
   it does when L's lease has expired.
3. Once a majority of S's members (live in etcd) have reported ``detached: e``, the one with the highest
   (epoch of its last chunk, next offset) writes the placement at epoch e + 1 with itself as leader by
   compare-and-swap on the placement's revision: at most one such write per epoch succeeds.

Safety (nothing confirmed is lost, nothing is confirmed at an epoch a later leader replaced):

* L confirms an offset only once a majority of S's members have acknowledged holding it (itself
  included); an acknowledgement is sent only over a live replication connection.
* A member that marked (S, e) lost has no connection to L any more and, by (2), accepts no chunk of
  epoch e afterwards, so every acknowledgement it ever gave L is covered by the position it reports.
  After a majority has marked (S, e) lost, L can gather acknowledgements from a minority only (at most
  the members that have not), so it can confirm nothing more at epoch e -- even if it were alive after
  all (a leader that cannot reach a majority stops confirming: its confirms wait for one, and it resigns
  after one lease TTL without one).
* Every offset L confirmed is therefore held by a majority whose positions were reported before the
  election; the electing majority intersects it, and the elected member holds the longest log of the
  highest epoch among the reports, which contains every confirmed chunk (within an epoch, members hold
  prefixes of the leader's log). Tails it lacks were never confirmed; their holders truncate them when
  they follow it.
* Once a member has seen epoch e + 1 it refuses chunks of any older epoch (replication.py,
  ``_Following._frame``), so L can never again reach a majority, and the CAS on the placement makes the
  new leader unique at e + 1.
* A refused dial while L is in fact alive (say, restarted on the same port and not yet leading) costs
  liveness at worst, never safety: that member stays out of epoch e until the placement changes (a
  restarted leader empties its seat at a new epoch itself, see roles.py ``_take_role``).

What the fast path does not cover: SIGSTOP and network partitions leave the sockets open (or dials
hanging rather than refused), so those still fail over on the lease: the leader's node key expires,
or the leader resigns after one lease TTL without a majority.

Loop thread only (the node's event loop).
"""

import time


class LeaderWatch:
    """Streams whose leader, at a given epoch, was found gone by a refused dial (see the module doc)."""

    def __init__(self):
        self._lost = {}          # stream -> (leader, epoch, monotonic time it was found gone)

    def refused(self, stream, leader, epoch):
        """Record that dialling ``leader`` of ``stream`` at ``epoch`` was refused. From now on
        :meth:`is_lost` is true for that epoch, so this member never follows it again."""
        cur = self._lost.get(stream)
        if cur is None or cur[:2] != (leader, epoch):
            self._lost[stream] = (leader, epoch, time.monotonic())

    def is_lost(self, stream, leader, epoch):
        """Whether this member found ``leader`` of ``stream`` at ``epoch`` gone (it must not follow it)."""
        cur = self._lost.get(stream)
        return cur is not None and cur[0] == leader and cur[1] == epoch

    def forget(self, stream, epoch=None):
        """Drop what is known of ``stream`` (deleted), or only marks older than ``epoch`` (a new leader)."""
        cur = self._lost.get(stream)
        if cur is not None and (epoch is None or cur[1] < epoch):
            del self._lost[stream]
