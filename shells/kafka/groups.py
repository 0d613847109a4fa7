"""Classic Kafka consumer groups, coordinated in the broker: membership, generations, the rebalance
protocol (JoinGroup -> SyncGroup with the clients' own assignors: the leader member assigns), session
and rebalance timeouts. Committed offsets are not here: they are the engine's consumer offsets (the
session stores them through the broker).

A group goes Empty -> PreparingRebalance (a member joined, left or timed out: every member must join
again) -> CompletingRebalance (joins answered; the leader's SyncGroup is awaited) -> Stable. A rebalance
completes when every known member has joined again, or after the longest rebalance timeout, when the
members that did not are removed. A member that sends no heartbeat (nor join) for its session timeout
is removed and the group rebalances.

Answers go through callbacks ``respond(body dict)``; a callback of a connection that has gone is
harmless (the session drops answers once closed). Loop-thread only; time is the broker's clock (s).
"""

import uuid

ERR_ILLEGAL_GENERATION = 22
ERR_INCONSISTENT_GROUP_PROTOCOL = 23
ERR_INVALID_GROUP_ID = 24
ERR_UNKNOWN_MEMBER_ID = 25
ERR_INVALID_SESSION_TIMEOUT = 26
ERR_REBALANCE_IN_PROGRESS = 27
ERR_MEMBER_ID_REQUIRED = 79

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"
MIN_SESSION_TIMEOUT_MS = 1000        # Kafka's group.min.session.timeout.ms is 6 s; clients' tests use less
MAX_SESSION_TIMEOUT_MS = 30 * 60 * 1000
EMPTY_GROUP_KEPT = 600.0             # seconds an Empty group stays listed (its committed offsets stay in the log)


class Member:
    __slots__ = ("member_id", "instance_id", "client_id", "client_host", "session_timeout", "rebalance_timeout",
                 "protocol_type", "protocols", "assignment", "last_seen", "join", "sync")

    def __init__(self, member_id, client_id, client_host):
        self.member_id = member_id
        self.instance_id = None
        self.client_id = client_id
        self.client_host = client_host
        self.session_timeout = 10.0       # seconds
        self.rebalance_timeout = 10.0
        self.protocol_type = ""
        self.protocols = []               # [(name, metadata bytes)] in the member's preference order
        self.assignment = b""
        self.last_seen = 0.0
        self.join = None                  # (respond, version) of a JoinGroup waiting for the rebalance
        self.sync = None                  # respond of a SyncGroup waiting for the leader's

    def metadata_for(self, protocol):
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""


class Group:
    __slots__ = ("group_id", "state", "generation", "protocol_type", "protocol", "leader", "members", "pending",
                 "rebalance_deadline", "emptied_at")

    def __init__(self, group_id):
        self.group_id = group_id
        self.state = EMPTY
        self.generation = 0
        self.protocol_type = None
        self.protocol = None
        self.leader = None
        self.members = {}                 # member id -> Member, in join order
        self.pending = set()              # member ids handed out with MEMBER_ID_REQUIRED, not joined yet
        self.rebalance_deadline = None
        self.emptied_at = None


class Coordinator:
    """Every classic group of one broker. ``clock()`` is in seconds."""

    def __init__(self, clock):
        self.clock = clock
        self.groups = {}
        self._next_sweep = 0.0

    def group(self, group_id):
        return self.groups.get(group_id)

    # --------------------------------------------------------------------------------------- JoinGroup

    def join(self, req, version, client_id, client_host, respond):
        """A JoinGroup; ``respond(body)`` now or when the rebalance completes."""
        gid = req["group_id"]
        if not gid:
            respond({"error_code": ERR_INVALID_GROUP_ID, "member_id": req["member_id"]})
            return
        st = req["session_timeout_ms"]
        if not MIN_SESSION_TIMEOUT_MS <= st <= MAX_SESSION_TIMEOUT_MS:
            respond({"error_code": ERR_INVALID_SESSION_TIMEOUT, "member_id": req["member_id"]})
            return
        g = self.groups.get(gid)
        if g is None:
            g = self.groups[gid] = Group(gid)
            g.emptied_at = self.clock()
        names = [p["name"] for p in req["protocols"]]
        if not names or (g.members and (req["protocol_type"] != g.protocol_type
                                        or not self._common(g, names, req["member_id"]))):
            respond({"error_code": ERR_INCONSISTENT_GROUP_PROTOCOL, "member_id": req["member_id"]})
            return
        mid = req["member_id"]
        if not mid:
            mid = f"{client_id or 'member'}-{uuid.uuid4()}"
            if version >= 4:
                # KIP-394: the member learns its id first and joins again with it
                g.pending.add(mid)
                respond({"error_code": ERR_MEMBER_ID_REQUIRED, "member_id": mid})
                return
        elif mid not in g.members and mid not in g.pending:
            respond({"error_code": ERR_UNKNOWN_MEMBER_ID, "member_id": mid})
            return
        g.pending.discard(mid)
        m = g.members.get(mid)
        now = self.clock()
        if m is None:
            m = g.members[mid] = Member(mid, client_id, client_host)
        m.instance_id = req["group_instance_id"]
        m.session_timeout = st / 1000.0
        rt = req["rebalance_timeout_ms"]
        m.rebalance_timeout = (rt if rt > 0 else st) / 1000.0
        m.protocol_type = req["protocol_type"]
        m.protocols = [(p["name"], p["metadata"]) for p in req["protocols"]]
        m.last_seen = now
        if m.join is not None:
            m.join[0]({"error_code": ERR_UNKNOWN_MEMBER_ID, "member_id": mid})   # superseded by this join
        m.join = (respond, version)
        if g.protocol_type is None:
            g.protocol_type = req["protocol_type"]
        if g.state != PREPARING:
            self._prepare(g)
        self._maybe_complete_join(g)

    @staticmethod
    def _common(g, names, joining):
        ok = set(names)
        for mid, m in g.members.items():
            if mid != joining:
                ok &= {n for n, _ in m.protocols}
        return ok

    def _prepare(self, g):
        """Start a rebalance: every member must join again (their heartbeats say REBALANCE_IN_PROGRESS)."""
        for m in g.members.values():
            if m.sync is not None:
                m.sync({"error_code": ERR_REBALANCE_IN_PROGRESS})
                m.sync = None
        g.state = PREPARING
        timeout = max((m.rebalance_timeout for m in g.members.values()), default=0.0)
        g.rebalance_deadline = self.clock() + timeout

    def _maybe_complete_join(self, g, force=False):
        if g.state != PREPARING:
            return
        if not force and any(m.join is None for m in g.members.values()):
            return
        for mid in [mid for mid, m in g.members.items() if m.join is None]:
            del g.members[mid]            # did not join again within the rebalance timeout
        if not g.members:
            self._empty(g)
            return
        g.generation += 1
        g.protocol = self._choose(g)
        if g.leader not in g.members:
            g.leader = next(iter(g.members))
        g.state = COMPLETING
        g.rebalance_deadline = None
        now = self.clock()
        everyone = [{"member_id": m.member_id, "group_instance_id": m.instance_id,
                     "metadata": m.metadata_for(g.protocol)} for m in g.members.values()]
        for m in list(g.members.values()):
            respond, _version = m.join
            m.join = None
            m.last_seen = now
            respond({"error_code": 0, "generation_id": g.generation, "protocol_type": g.protocol_type,
                     "protocol_name": g.protocol, "leader": g.leader, "member_id": m.member_id,
                     "members": everyone if m.member_id == g.leader else []})

    @staticmethod
    def _choose(g):
        # Kafka's vote: the protocols every member supports; each member votes for its most preferred
        # one among them; the most votes wins (ties: the first member's preference order)
        common = None
        for m in g.members.values():
            names = {n for n, _ in m.protocols}
            common = names if common is None else common & names
        votes = {}
        for m in g.members.values():
            for n, _ in m.protocols:
                if n in common:
                    votes[n] = votes.get(n, 0) + 1
                    break
        first = next(iter(g.members.values()))
        order = [n for n, _ in first.protocols if n in common]
        return max(order, key=lambda n: (votes.get(n, 0), -order.index(n)))

    def _empty(self, g):
        g.emptied_at = self.clock()
        g.state = EMPTY
        g.leader = None
        g.protocol = None
        g.protocol_type = None
        g.rebalance_deadline = None
        g.generation += 1

    # --------------------------------------------------------------------------------------- SyncGroup

    def sync(self, req, respond):
        g = self.groups.get(req["group_id"])
        m = g.members.get(req["member_id"]) if g is not None else None
        if m is None:
            respond({"error_code": ERR_UNKNOWN_MEMBER_ID})
            return
        if req["generation_id"] != g.generation:
            respond({"error_code": ERR_ILLEGAL_GENERATION})
            return
        m.last_seen = self.clock()
        if g.state == PREPARING:
            respond({"error_code": ERR_REBALANCE_IN_PROGRESS})
            return
        if g.state == STABLE:
            respond(self._sync_answer(g, m))
            return
        # CompletingRebalance: the leader's assignment completes it for everyone
        m.sync = respond
        if m.member_id == g.leader:
            given = {a["member_id"]: a["assignment"] for a in req["assignments"]}
            for mm in g.members.values():
                mm.assignment = given.get(mm.member_id, b"")
            g.state = STABLE
            for mm in g.members.values():
                if mm.sync is not None:
                    cb, mm.sync = mm.sync, None
                    cb(self._sync_answer(g, mm))

    @staticmethod
    def _sync_answer(g, m):
        return {"error_code": 0, "protocol_type": g.protocol_type, "protocol_name": g.protocol,
                "assignment": m.assignment}

    # ---------------------------------------------------------------------------- Heartbeat, LeaveGroup

    def heartbeat(self, req):
        """The error code of a Heartbeat."""
        g = self.groups.get(req["group_id"])
        m = g.members.get(req["member_id"]) if g is not None else None
        if m is None:
            return ERR_UNKNOWN_MEMBER_ID
        if req["generation_id"] != g.generation:
            return ERR_ILLEGAL_GENERATION
        m.last_seen = self.clock()
        if g.state == PREPARING:
            return ERR_REBALANCE_IN_PROGRESS
        return 0

    def leave(self, group_id, member_ids):
        """Remove ``member_ids`` from ``group_id``; [error code per member]."""
        g = self.groups.get(group_id)
        out = []
        gone = False
        for mid in member_ids:
            m = g.members.get(mid) if g is not None else None
            if m is None:
                out.append(ERR_UNKNOWN_MEMBER_ID)
                continue
            self._remove(g, m)
            gone = True
            out.append(0)
        if gone:
            self._after_removal(g)
        return out

    def _remove(self, g, m):
        del g.members[m.member_id]
        if m.join is not None:
            m.join[0]({"error_code": ERR_UNKNOWN_MEMBER_ID, "member_id": m.member_id})
        if m.sync is not None:
            m.sync({"error_code": ERR_UNKNOWN_MEMBER_ID})
        if g.leader == m.member_id:
            g.leader = None

    def _after_removal(self, g):
        if not g.members:
            self._empty(g)
        elif g.state == PREPARING:
            self._maybe_complete_join(g)
        else:
            self._prepare(g)

    # ----------------------------------------------------------------------------------------- timers

    def tick(self, now):
        """Remove members past their session timeout, end rebalances past their timeout. Cheap to call
        often: it sweeps at most every 100 ms."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + 0.1
        for g in list(self.groups.values()):
            if g.state == EMPTY and not g.members and now - (g.emptied_at or now) > EMPTY_GROUP_KEPT:
                del self.groups[g.group_id]       # memory stays bounded by the live groups
                continue
            if g.state == PREPARING and g.rebalance_deadline is not None and now >= g.rebalance_deadline:
                self._maybe_complete_join(g, force=True)
                continue
            dead = [m for m in g.members.values() if m.join is None and now - m.last_seen > m.session_timeout]
            if dead:
                for m in dead:
                    self._remove(g, m)
                self._after_removal(g)

    # ------------------------------------------------------------------------------ ListGroups, Describe

    def listed(self):
        return [{"group_id": g.group_id, "protocol_type": g.protocol_type or "consumer", "group_state": g.state,
                 "group_type": "classic"} for g in self.groups.values()]

    def described(self, group_id, version):
        g = self.groups.get(group_id)
        if g is None:
            return {"error_code": 0, "group_id": group_id, "group_state": DEAD, "protocol_type": "",
                    "protocol_data": "", "members": []}
        show = g.state == STABLE or g.state == COMPLETING
        return {"error_code": 0, "group_id": group_id, "group_state": g.state, "protocol_type": g.protocol_type or "",
                "protocol_data": g.protocol or "", "members": [
                    {"member_id": m.member_id, "group_instance_id": m.instance_id, "client_id": m.client_id or "",
                     "client_host": m.client_host, "member_metadata": m.metadata_for(g.protocol) if show else b"",
                     "member_assignment": m.assignment if g.state == STABLE else b""}
                    for m in g.members.values()]}

