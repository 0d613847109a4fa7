"""KIP-848 consumer groups ("the consumer protocol", librdkafka's ``group.protocol=consumer``), coordinated
in the broker beside the classic ones (:mod:`riverbed.shells.kafka.groups`): one ConsumerGroupHeartbeat
API, assignment on the server, member epochs, incremental revocation.

The model, as Kafka's group coordinator runs it (simplified where noted):

* A group has a **group epoch**, bumped whenever what the assignment depends on changes: a member joins,
  leaves or is removed, a subscription changes, a subscribed topic gains partitions or appears. The
  **target assignment** is computed for the group epoch (its **assignment epoch**) by the server's
  assignor: every partition of the subscribed topics to one subscribed member, balanced by count and
  sticky (a partition stays with its member while that keeps the balance).
* Each member has a **member epoch** and what it owns (``assigned``). It moves to the target in steps:
  first it gives up what the target takes away (``revoking``: answered with the smaller assignment at
  its unchanged epoch; it acknowledges by heart-beating without those partitions), then it gets the
  target's epoch and the target's partitions that no other member still owns; the ones still owned
  elsewhere (``unreleased``) follow once released. So a partition is never owned by two members.
* A member that sends no heartbeat for the session timeout, or does not revoke within its rebalance
  timeout, is removed (fenced: its next heartbeat gets FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID and it
  joins again). Session timeout and heartbeat interval are the broker's (Kafka's
  ``group.consumer.session.timeout.ms`` / ``group.consumer.heartbeat.interval.ms``).

Differences from Kafka: one assignor (``uniform``; ``range`` is accepted and runs the same), static
membership (``instance_id``) is kept for display only (a member that leaves with epoch -2 leaves), and
a regular expression subscription uses Python's ``re`` (Kafka uses RE2/J) matched in full.

Answers are dicts of the ConsumerGroupHeartbeat response. Loop-thread only; time is the broker's clock
(seconds).
"""

import re
import uuid

from riverbed.shells.kafka import codec as C

ERR_UNKNOWN_MEMBER_ID = 25
ERR_INCONSISTENT_GROUP_PROTOCOL = 23
ASSIGNORS = ("uniform", "range")
STABLE_STATE, ASSIGNING, RECONCILING, EMPTY_STATE, DEAD_STATE = "Stable", "Assigning", "Reconciling", "Empty", "Dead"
EPOCH_JOIN, EPOCH_LEAVE, EPOCH_LEAVE_STATIC = 0, -1, -2
DEFAULT_SESSION_TIMEOUT_MS = 45000     # Kafka's group.consumer.session.timeout.ms
DEFAULT_HEARTBEAT_INTERVAL_MS = 5000   # Kafka's group.consumer.heartbeat.interval.ms
DEFAULT_REBALANCE_TIMEOUT_MS = 300000  # a member that gives none: Kafka's max.poll.interval.ms default
EMPTY_GROUP_KEPT = 600.0               # seconds an empty group stays listed


class ConsumerMember:
    """One member of a consumer group. ``assigned`` and ``revoking`` map topic name -> set of partitions."""

    __slots__ = ("member_id", "epoch", "previous_epoch", "instance_id", "rack_id", "client_id", "client_host",
                 "subscribed", "regex", "assignor", "rebalance_timeout", "assigned", "revoking", "last_seen",
                 "revoke_deadline", "sent")

    def __init__(self, member_id, client_id, client_host):
        self.member_id = member_id
        self.epoch = 0
        self.previous_epoch = -1
        self.instance_id = None
        self.rack_id = None
        self.client_id = client_id
        self.client_host = client_host
        self.subscribed = []
        self.regex = None
        self.assignor = None
        self.rebalance_timeout = DEFAULT_REBALANCE_TIMEOUT_MS / 1000.0
        self.assigned = {}
        self.revoking = {}
        self.last_seen = 0.0
        self.revoke_deadline = None
        self.sent = None             # the assignment last answered (to answer it again only when it changed)


class ConsumerGroup:
    """One KIP-848 group: its epochs, members (in join order) and target assignment."""

    __slots__ = ("group_id", "epoch", "assignment_epoch", "members", "target", "topics_seen", "emptied_at")

    def __init__(self, group_id):
        self.group_id = group_id
        self.epoch = 0
        self.assignment_epoch = 0
        self.members = {}
        self.target = {}             # member id -> {topic: set(partitions)} at assignment_epoch
        self.topics_seen = {}        # subscribed topic -> partition count the target was computed with
        self.emptied_at = None

    def state(self):
        if not self.members:
            return EMPTY_STATE
        if self.epoch != self.assignment_epoch:
            return ASSIGNING
        for m in self.members.values():
            if m.epoch != self.assignment_epoch or m.revoking or m.assigned != self.target.get(m.member_id, {}):
                return RECONCILING
        return STABLE_STATE


def _count(tp):
    return sum(len(p) for p in tp.values())


def _copy(tp):
    return {t: set(p) for t, p in tp.items() if p}


class ConsumerCoordinator:
    """Every KIP-848 group of one broker.

    ``topics()`` lists the topic names, ``partitions(topic)`` gives a topic's partition count (0 when
    there is none), ``topic_id(topic)`` its id; ``clock()`` is in seconds. Session timeout and heartbeat
    interval in ms."""

    def __init__(self, clock, topics, partitions, *, topic_id=C.topic_uuid,
                 session_timeout_ms=DEFAULT_SESSION_TIMEOUT_MS, heartbeat_interval_ms=DEFAULT_HEARTBEAT_INTERVAL_MS):
        self.clock = clock
        self._topic_id = topic_id
        self._topics = topics
        self._partitions = partitions
        self.session_timeout = session_timeout_ms / 1000.0
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.groups = {}
        self._next_sweep = 0.0

    def group(self, group_id):
        return self.groups.get(group_id)

    # --------------------------------------------------------------------------------------- heartbeat

    def heartbeat(self, req, client_id, client_host, is_classic):
        """Answer one ConsumerGroupHeartbeat ``req`` (a dict); the response body. ``is_classic(group id)``
        says whether a classic group of that id has members (then the id is refused)."""
        gid = req["group_id"]
        epoch = req["member_epoch"]
        mid = req["member_id"] or ""
        if not gid:
            return self.error(C.ERR_INVALID_REQUEST, "GroupId can't be empty.")
        if epoch < EPOCH_LEAVE_STATIC:
            return self.error(C.ERR_INVALID_REQUEST, f"MemberEpoch {epoch} is invalid.")
        assignor = req["server_assignor"]
        if assignor is not None and assignor not in ASSIGNORS:
            return self.error(C.ERR_UNSUPPORTED_ASSIGNOR, f"assignor {assignor!r} is not served: {ASSIGNORS}")
        regex = req.get("subscribed_topic_regex")
        if regex is not None:
            try:
                re.compile(regex)
            except re.error as e:
                return self.error(C.ERR_INVALID_REGULAR_EXPRESSION, f"{regex!r}: {e}")
        g = self.groups.get(gid)
        if epoch in (EPOCH_LEAVE, EPOCH_LEAVE_STATIC):
            m = g.members.get(mid) if g is not None else None
            if m is None:
                return self.error(ERR_UNKNOWN_MEMBER_ID, f"member {mid!r} is not in group {gid!r}")
            self._remove(g, m)
            return {"error_code": 0, "member_id": mid, "member_epoch": epoch,
                    "heartbeat_interval_ms": self.heartbeat_interval_ms, "assignment": None}
        now = self.clock()
        if epoch == EPOCH_JOIN:
            if g is None and is_classic(gid):
                return self.error(C.ERR_GROUP_ID_NOT_FOUND, f"group {gid!r} is a classic group")
            if req["subscribed_topic_names"] is None and regex is None:
                return self.error(C.ERR_INVALID_REQUEST, "SubscribedTopicNames or SubscribedTopicRegex must be "
                                                          "set when joining.")
            if g is None:
                g = self.groups[gid] = ConsumerGroup(gid)
            if not mid:
                mid = str(uuid.uuid4())            # version 0: the coordinator names the member
            m = g.members.get(mid)
            if m is None:
                m = g.members[mid] = ConsumerMember(mid, client_id, client_host)
                g.epoch += 1
            else:
                # the member joins again (it lost its state): it owns nothing until told again
                m.assigned, m.revoking, m.epoch, m.revoke_deadline = {}, {}, 0, None
                g.epoch += 1
            m.sent = None
            g.emptied_at = None
        else:
            m = g.members.get(mid) if g is not None else None
            if m is None:
                return self.error(ERR_UNKNOWN_MEMBER_ID, f"member {mid!r} is not in group {gid!r}")
            if epoch != m.epoch:
                owned = req["topic_partitions"]
                # a member whose answer was lost may repeat the previous epoch, owning no more than it had
                if not (epoch == m.previous_epoch and owned is not None and self._within(owned, m.assigned)):
                    return self.error(C.ERR_FENCED_MEMBER_EPOCH,
                                       f"member epoch {epoch} is not {m.epoch}: join again")
        m.last_seen = now
        if client_id:
            m.client_id = client_id
        if req["instance_id"] is not None:
            m.instance_id = req["instance_id"]
        if req["rack_id"] is not None:
            m.rack_id = req["rack_id"]
        if req["rebalance_timeout_ms"] > 0:
            m.rebalance_timeout = req["rebalance_timeout_ms"] / 1000.0
        if assignor is not None:
            m.assignor = assignor
        names = req["subscribed_topic_names"]
        if names is not None and sorted(set(names)) != m.subscribed:
            m.subscribed = sorted(set(names))
            g.epoch += 1
        if regex is not None and (regex or None) != m.regex:
            m.regex = regex or None
            g.epoch += 1
        self._check_topics(g)
        if g.epoch != g.assignment_epoch:
            self._assign(g)
        owned = req["topic_partitions"]
        reported = None if owned is None else self._names(owned)
        self._reconcile(g, m, reported)
        answer = {"error_code": 0, "member_id": m.member_id, "member_epoch": m.epoch,
                  "heartbeat_interval_ms": self.heartbeat_interval_ms, "assignment": None}
        # the assignment is answered when it changed, and also when the member may have missed it: a
        # join, a full request (what a client sends after a timed-out heartbeat, whose answer it never
        # read), or a member that says it owns something else than it was told (one that still owns
        # what it must revoke is told again)
        full = (req["rebalance_timeout_ms"] != -1 and req["subscribed_topic_names"] is not None
                and owned is not None)
        if (m.sent != m.assigned or epoch == EPOCH_JOIN or full
                or (reported is not None and reported != m.assigned)):
            m.sent = _copy(m.assigned)
            answer["assignment"] = {"topic_partitions": [
                {"topic_id": self._topic_id(t), "partitions": sorted(p)} for t, p in sorted(m.assigned.items())]}
        return answer

    @staticmethod
    def error(code, message):
        """A ConsumerGroupHeartbeat answer with error ``code``."""
        return {"error_code": code, "error_message": message, "member_id": None, "member_epoch": -1,
                "heartbeat_interval_ms": 0, "assignment": None}

    def _names(self, owned):
        """TopicPartitions by id -> {topic name: set}; ids of topics that are gone are left out."""
        by_id = {self._topic_id(t): t for t in self._topics()}
        out = {}
        for tp in owned:
            name = by_id.get(bytes(tp["topic_id"]))
            if name is not None and tp["partitions"]:
                out.setdefault(name, set()).update(tp["partitions"])
        return out

    def _within(self, owned, assigned):
        return all(set(ps) <= assigned.get(t, set()) for t, ps in self._names(owned).items())

    # ----------------------------------------------------------------------------------- assignment

    def _subscribed(self, m, topics):
        out = set(t for t in m.subscribed if t in topics)
        if m.regex is not None:
            rx = re.compile(m.regex)
            out.update(t for t in topics if rx.fullmatch(t))
        return out

    def _check_topics(self, g):
        """Bump the group epoch when a subscribed topic appeared, went or changed its partition count."""
        topics = set(self._topics())
        wanted = set()
        for m in g.members.values():
            wanted |= self._subscribed(m, topics)
        seen = {t: self._partitions(t) for t in sorted(wanted)}
        if seen != g.topics_seen:
            g.topics_seen = seen
            g.epoch += 1

    def _assign(self, g):
        """The target assignment at the group epoch: each partition of a subscribed topic to one of its
        subscribers, counts balanced (within one) among members of the same subscription, sticky."""
        topics = set(self._topics())
        subs = {mid: self._subscribed(m, topics) for mid, m in g.members.items()}
        counts = dict(g.topics_seen)
        target = {mid: {} for mid in g.members}
        every = [(t, p) for t in sorted(counts) for p in range(counts[t]) if any(t in s for s in subs.values())]
        quota = self._quotas(len(every), subs, g)
        load = {mid: 0 for mid in g.members}
        free = []
        for t, p in every:
            keep = None
            for mid, old in g.target.items():
                if mid in target and p in old.get(t, ()) and t in subs[mid] and load[mid] < quota[mid]:
                    keep = mid
                    break
            if keep is None:
                free.append((t, p))
            else:
                target[keep].setdefault(t, set()).add(p)
                load[keep] += 1
        for t, p in free:
            able = [mid for mid in g.members if t in subs[mid]]
            best = min(able, key=lambda mid: (load[mid] >= quota[mid], load[mid]))
            target[best].setdefault(t, set()).add(p)
            load[best] += 1
        g.target = target
        g.assignment_epoch = g.epoch

    @staticmethod
    def _quotas(n, subs, g):
        # balanced by count: n // members each, the remainder one more for the first members (join order)
        mids = [mid for mid in g.members if subs[mid]]
        out = {mid: 0 for mid in g.members}
        if not mids:
            return out
        base, extra = divmod(n, len(mids))
        for i, mid in enumerate(mids):
            out[mid] = base + (1 if i < extra else 0)
        return out

    def _reconcile(self, g, m, owned):
        """Move member ``m`` towards its target (see the module docstring). ``owned``: what the member
        said it owns (topic -> set), or None when it did not say."""
        if m.revoking:
            if owned is None or any(owned.get(t, set()) & ps for t, ps in m.revoking.items()):
                return                      # not acknowledged yet
            m.revoking = {}
            m.revoke_deadline = None
        target = g.target.get(m.member_id, {})
        if m.epoch < g.assignment_epoch or m.assigned != target:
            gone = {t: ps - target.get(t, set()) for t, ps in m.assigned.items()}
            gone = {t: ps for t, ps in gone.items() if ps}
            if gone:
                m.assigned = {t: ps & target.get(t, set()) for t, ps in m.assigned.items()}
                m.assigned = {t: ps for t, ps in m.assigned.items() if ps}
                m.revoking = gone
                m.revoke_deadline = self.clock() + m.rebalance_timeout
                return
            held = {}
            for other in g.members.values():
                if other is not m:
                    for t, ps in list(other.assigned.items()) + list(other.revoking.items()):
                        held.setdefault(t, set()).update(ps)
            for t, ps in target.items():
                new = ps - held.get(t, set())
                if new:
                    m.assigned.setdefault(t, set()).update(new)
            if m.epoch != g.assignment_epoch:
                m.previous_epoch, m.epoch = m.epoch, g.assignment_epoch

    # --------------------------------------------------------------------------------------- removal

    def _remove(self, g, m):
        del g.members[m.member_id]
        g.target.pop(m.member_id, None)
        g.epoch += 1
        if not g.members:
            g.emptied_at = self.clock()
            g.topics_seen = {}
            g.target = {}
            g.assignment_epoch = g.epoch
        else:
            self._check_topics(g)
            self._assign(g)

    def tick(self, now):
        """Remove members past their session timeout or their revocation deadline; forget groups empty
        for long. Sweeps at most every 100 ms."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + 0.1
        for g in list(self.groups.values()):
            if not g.members:
                if now - (g.emptied_at or now) > EMPTY_GROUP_KEPT:
                    del self.groups[g.group_id]
                continue
            for m in list(g.members.values()):
                if now - m.last_seen > self.session_timeout or (
                        m.revoke_deadline is not None and now > m.revoke_deadline):
                    self._remove(g, m)

    # ------------------------------------------------------------------------------ commits, listings

    def commit_error(self, g, member_id, epoch):
        """The error of an OffsetCommit by ``member_id`` at ``epoch`` to group ``g``, or 0. A member
        may commit at its epoch or the one before (a commit may cross its epoch bump in flight)."""
        m = g.members.get(member_id)
        if m is None:
            return ERR_UNKNOWN_MEMBER_ID
        if epoch != m.epoch and epoch != m.previous_epoch:
            return C.ERR_STALE_MEMBER_EPOCH
        return 0

    def listed(self):
        return [{"group_id": g.group_id, "protocol_type": "consumer", "group_state": g.state(),
                 "group_type": "consumer"} for g in self.groups.values()]

    def described(self, group_id):
        """A ConsumerGroupDescribe group entry (GROUP_ID_NOT_FOUND when there is no such group)."""
        g = self.groups.get(group_id)
        if g is None:
            return {"error_code": C.ERR_GROUP_ID_NOT_FOUND, "error_message": f"group {group_id!r} is not a "
                    "consumer group", "group_id": group_id, "group_state": DEAD_STATE, "group_epoch": -1,
                    "assignment_epoch": -1, "assignor_name": "", "members": []}

        def shown(tp):
            return {"topic_partitions": [{"topic_id": self._topic_id(t), "topic_name": t, "partitions": sorted(p)}
                                         for t, p in sorted(tp.items()) if p]}
        return {"error_code": 0, "error_message": None, "group_id": group_id, "group_state": g.state(),
                "group_epoch": g.epoch, "assignment_epoch": g.assignment_epoch, "assignor_name": ASSIGNORS[0],
                "members": [{"member_id": m.member_id, "instance_id": m.instance_id, "rack_id": m.rack_id,
                             "member_epoch": m.epoch, "client_id": m.client_id or "", "client_host": m.client_host,
                             "subscribed_topic_names": list(m.subscribed), "subscribed_topic_regex": m.regex,
                             "assignment": shown(m.assigned), "target_assignment": shown(g.target.get(m.member_id, {}))}
                            for m in g.members.values()]}

    def classic_described(self, group_id):
        """A DescribeGroups entry for a consumer group (as Kafka shows one to the classic API): its
        state and members, without classic metadata."""
        g = self.groups[group_id]
        return {"error_code": 0, "group_id": group_id, "group_state": g.state(), "protocol_type": "consumer",
                "protocol_data": ASSIGNORS[0], "members": [
                    {"member_id": m.member_id, "group_instance_id": m.instance_id, "client_id": m.client_id or "",
                     "client_host": m.client_host, "member_metadata": b"", "member_assignment": b""}
                    for m in g.members.values()]}
