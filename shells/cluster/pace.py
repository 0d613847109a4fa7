"""When a cluster node's control loop must run next (issue 23: what a cluster node burns at rest).

The control loop (node.py ``_control_loop``) times what changes with time alone: confirms past
--replication-timeout, learners to promote, a leader cut off from its members, a member fallen behind
(its lag reported at once), forwarded requests and single-active-consumer upkeep. It used to run every
``min(TTL/6, 0.25 s)`` whether or not any of that was under way: four wake-ups a second on every node at
rest. Now it runs at that pace only while something it times is under way (:func:`busy`), and otherwise
sleeps until the earliest moment a stream it leads could be cut off from its members
(:func:`cut_off_at`), at most ``RECONCILE_EVERY`` lease TTLs; anything that starts work it times wakes it
at once (``ClusterNode.tick_soon``: a confirm that waits for a majority, a reconcile, a forwarded request).

Why this weakens nothing: every check runs at the same moments it could first come true. A confirm's
timeout, a learner's promotion, a lagging member and a forwarded request keep the old pace from the moment
they exist; the cut-off test (a majority's members silent for one lease TTL) can first come true exactly
at :func:`cut_off_at`, computed from the same times ``ClusterNode._cut_off`` reads, and every ACK only moves
it later.

Loop thread only.
"""

import math


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
    cut-off moment of the streams ``node`` leads, at most ``reconcile_at`` (its periodic reconcile)."""
    if busy(node):
        return now + tick
    due = reconcile_at
    for st in node.leading.values():
        due = min(due, cut_off_at(node, st))
    if due <= now:
        return now + tick           # due already (a check that could not act, e.g. without a lease): old pace
    return due + 0.001              # just after: the cut-off test counts a member heard exactly TTL ago
