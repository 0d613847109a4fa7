"""When a cluster node's control loop must run next (issue 23: what a cluster node burns at rest).

The control loop (control.py ``_control_loop``) times what changes with time alone: confirms past
--replication-timeout, learners to promote, a leader cut off from its members, a member fallen behind
(its lag reported at once), forwarded requests and single-active-consumer upkeep. It used to run every
``min(TTL/6, 0.25 s)`` whether or not any of that was under way: four wake-ups a second on every node at
rest. Now it runs at that pace only while something it times is under way (:func:`busy`), and otherwise
sleeps until the earliest moment a stream it leads could be cut off from its members
(:func:`cut_off_at`), or until the next lease renewal wakes the process anyway (``ClusterNode._beat``);
anything that starts work it times wakes it at once (``ClusterNode.tick_soon``: a confirm that waits for
a majority, a reconcile, a forwarded request). An idle process here pays for every wake-up (a lone node:
~0.1% of a core for ~10 a second, its work included), so work that can wait rides on one that must happen.

The periodic reconcile (every ``RECONCILE_EVERY`` lease TTLs) is for what changes with time alone:
progress reports that waited (roles.py ``_progress_can_wait``), abstentions that end, idle observer copies,
elections, placements and hand-offs under way. :func:`reconcile_wanted` says whether any of that is
there; at rest none is, and the node reconciles when etcd changes (the watch) and at the watch's
safety read (every ``SAFETY_READ_EVERY`` TTLs), as before.

Why this weakens nothing: every check runs at the same moments it could first come true. A confirm's
timeout, a learner's promotion, a lagging member and a forwarded request keep the old pace from the moment
they exist; the cut-off test (a majority's members silent for one lease TTL) can first come true exactly
at :func:`cut_off_at`, computed from the same times ``ClusterNode._cut_off`` reads, and every ACK only moves
it later.

Loop thread only.
"""

import asyncio
import math
import time

from riverbed.engine.errors import StreamNotFound
from riverbed.shells.cluster import membership


def busy(node):
    """Whether anything the control loop times is under way on ``node`` (a ClusterNode): then it keeps its
    old pace (``min(TTL/6, TICK_MAX)``)."""
    if node.forwarding.busy() or node.sac.busy() or node.handing_off:
        return True
    me = node.name
    for st in node.leading.values():
        if st.waiting or st.learners:
            return True
        head = st.local_next()
        acked = st.acked
        for m in st.members:
            if m != me and acked.get(m, 0) < head:
                return True         # a member behind: the leader reports its lag (view.member_behind)
    return False


def cut_off_at(node, st):
    """The monotonic time from which ``ClusterNode._cut_off(st, now)`` is true if no member is heard from
    before it (``math.inf`` when it never is: a stream of one member)."""
    if len(st.members) < 2:
        return math.inf
    need = len(st.members) // 2          # members besides the leader that a majority needs
    heard = sorted((st.heard.get(m, st.since) for m in st.members if m != node.name), reverse=True)
    if need > len(heard):
        return st.since + node.ttl
    return max(st.since, heard[need - 1]) + node.ttl


def next_run(node, now, tick, reconcile_at):
    """The monotonic time the control loop runs next: ``now + tick`` while :func:`busy`, else the earliest
    cut-off moment of the streams ``node`` leads. Its periodic checks (``reconcile_at``) ride on the lease
    renewals' wake-ups (``ClusterNode._beat``, TTL/3 apart): a timer of its own comes only a TTL after
    them, should renewals stall."""
    if busy(node):
        return now + tick
    due = reconcile_at + node.ttl
    for st in node.leading.values():
        due = min(due, cut_off_at(node, st))
    if due <= now:
        return now + tick           # due already (a check that could not act, e.g. without a lease): old pace
    # just after: the loop's timers round to the millisecond (one that fires early would find nothing
    # due and sleep again)
    return due + 0.005


def reconcile_wanted(node, now):
    """Whether ``node``'s periodic reconcile has anything to do that no etcd change would ask for: a
    progress report that differs from the last one written (a moved ``next`` or committed offset), an
    abstention that ended less than a TTL ago, an observer copy, an election, a placement, a deletion or
    a hand-off under way."""
    if (node.detached or node.pending_leaders or node.placing or node.handing_off or node.observers.streams
            or node._placing_here or node._cluster_deleting or node._member_deleting or node._member_creating
            or any(until > now - node.ttl for until in node.abstain.values())):
        return True
    engine = node.engine
    for name, (p, _) in node.placements.items():
        if not membership.take_part(node, name, p):
            continue
        sent = node.progress_sent.get(name)
        if sent is None:
            return True
        try:
            nxt = engine._current(name).next_offset
        except StreamNotFound:
            return True
        st = node.leading.get(name)
        committed = st.committed if st is not None else (engine.read_limit(name) or 0)
        if sent.get("next") != nxt or sent.get("committed") != committed:
            return True
    return False


async def rest(node, tick, reconcile_at):
    """Sleep until :func:`next_run`, or until ``node.tick_soon()`` wakes the loop (work it times began)."""
    now = time.monotonic()
    wake = node._tick_now
    wake.clear()
    at = next_run(node, now, tick, reconcile_at)
    timer = asyncio.get_running_loop().call_later(max(at - now, 0.0), wake.set)
    # only a loop that sleeps past its usual pace is woken early: while busy, a publish's held confirm
    # would otherwise wake it once per batch
    node._resting = at > now + tick
    try:
        await wake.wait()
    finally:
        node._resting = False
        timer.cancel()
