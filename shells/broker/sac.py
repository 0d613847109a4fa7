"""Single-active-consumer groups: the one place that decides which member of a group is active.

A group is ``(stream, name)``. On a plain stream the first member (in registration order) is active until
it leaves. On a partition of a super stream (the group's ``partition_index`` >= 0), the active member is
``members[partition_index mod N]``, as RabbitMQ spreads partitions over the instances of an application:
when a join or leave moves that choice, the current active member is first told to step down and the new
one is activated only after the old one has answered (:meth:`SacGroups.stepped_down`), so two members are
never active at once. A group lives exactly as long as its members (and its stream: the owner calls
:meth:`SacGroups.forget_stream` when the stream is deleted).

A member is any object with ``sac_activate()`` and ``sac_step_down()`` (a RabbitMQ Stream subscription on
this node, which sends ConsumerUpdate to its client; in a cluster, a handle that tells the member's own
node: shells/cluster/sac.py). Members are compared by identity.

The same code decides for a lone node (one :class:`SacGroups` per listener, members all local) and for a
cluster (one per node, holding the groups of the streams that node leads, members on every node). For
the cluster, a member may join with an ``order`` an earlier coordinator gave it (its place is kept when
the coordinator changes) and with the ``state`` its node reports (:data:`ACTIVE`: it is delivering and
stays so; :data:`STEPPING_DOWN`: its step-down is awaited), and ``hold(stream)`` may keep a stream's groups
from activating anyone for a while (a new coordinator gathering the members' re-registrations).

Loop-thread only.
"""

import bisect

WAITING, ACTIVE, STEPPING_DOWN = 0, 1, 2     # a member's state as its node reports it


class _Group:
    __slots__ = ("members", "orders", "active", "stepping_down", "partition_index", "next_order")

    def __init__(self, partition_index):
        self.members = []            # members in registration order
        self.orders = []             # their orders, ascending (parallel to members)
        self.active = None           # the member delivering (or being activated)
        self.stepping_down = None    # the member told to step down, until it answers
        self.partition_index = partition_index   # -1: not a super stream partition
        self.next_order = 1


class SacGroups:
    """Single-active-consumer groups (see the module docstring). ``hold(stream)``, when given, returns True
    while no member of ``stream``'s groups may be activated or told to step down (registrations are still
    taken); call :meth:`rebalance_stream` once it returns False."""

    def __init__(self, hold=None):
        self._groups = {}            # (stream, name) -> _Group
        self._hold = hold

    def __len__(self):
        return len(self._groups)

    def streams(self):
        """The streams that have groups."""
        return {k[0] for k in self._groups}

    def forget_stream(self, stream):
        """Drop every group of ``stream`` without telling any member (the stream is gone, or another
        coordinator takes its groups over)."""
        for key in [k for k in self._groups if k[0] == stream]:
            del self._groups[key]

    def register(self, stream, name, member, partition_index=-1, order=0, state=WAITING):
        """Join the group ``(stream, name)``; returns the member's order (its place in the group: ``order``
        when given, else after every member so far). The member chosen to be active gets
        ``sac_activate()``. A member reporting ``ACTIVE`` stays active when the group has no active member
        (else it is told to step down); ``STEPPING_DOWN``: its answer is awaited as if this group had told
        it."""
        group = self._groups.get((stream, name))
        if group is None:
            group = self._groups[(stream, name)] = _Group(partition_index)
        if not order:
            order = group.next_order
        group.next_order = max(group.next_order, order + 1)
        at = bisect.bisect_right(group.orders, order)
        group.orders.insert(at, order)
        group.members.insert(at, member)
        if state == ACTIVE:
            if group.active is None and group.stepping_down is None:
                group.active = member
            else:
                member.sac_step_down()          # two claim to be active: the later one yields
        elif state == STEPPING_DOWN and group.stepping_down is None and group.active is None:
            group.stepping_down = member
        self._rebalance(stream, group)
        return order

    def unregister(self, stream, name, member):
        """Leave the group; a new active member is chosen when needed."""
        key = (stream, name)
        group = self._groups.get(key)
        if group is None:
            return
        for i, m in enumerate(group.members):
            if m is member:
                del group.members[i]
                del group.orders[i]
                break
        if group.active is member:
            group.active = None
        if group.stepping_down is member:
            group.stepping_down = None
        if not group.members:
            del self._groups[key]
            return
        self._rebalance(stream, group)

    def stepped_down(self, stream, name, member):
        """The member told to step down has answered: activate the member that should now be active."""
        group = self._groups.get((stream, name))
        if group is not None and group.stepping_down is member:
            group.stepping_down = None
            self._rebalance(stream, group)

    def rebalance_stream(self, stream):
        """Decide again for every group of ``stream`` (after a hold ended)."""
        for (s, _), group in list(self._groups.items()):
            if s == stream:
                self._rebalance(stream, group)

    def active_of(self, stream, name):
        """The active member of the group (None when none is, or the group does not exist)."""
        group = self._groups.get((stream, name))
        return group.active if group is not None else None

    def _rebalance(self, stream, group):
        if not group.members or group.stepping_down is not None:
            return
        if self._hold is not None and self._hold(stream):
            return
        if group.partition_index >= 0:
            want = group.members[group.partition_index % len(group.members)]
        else:
            want = group.active if group.active is not None else group.members[0]
        if group.active is None:
            group.active = want
            want.sac_activate()
        elif group.active is not want:
            group.stepping_down, group.active = group.active, None
            group.stepping_down.sac_step_down()
