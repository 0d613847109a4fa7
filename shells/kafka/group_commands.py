"""The consumer-group APIs of a Kafka connection (a mixin of KafkaSession): FindCoordinator, JoinGroup,
SyncGroup, Heartbeat, LeaveGroup (coordination: :mod:`riverbed.shells.kafka.groups`), the KIP-848
ConsumerGroupHeartbeat and ConsumerGroupDescribe (:mod:`riverbed.shells.kafka.consumer_groups`),
OffsetCommit and OffsetFetch (the engine's consumer offsets, with the group id as reference), ListGroups,
DescribeGroups. A group id is either classic or consumer (KIP-848) while it has members: the other kind
is refused (INCONSISTENT_GROUP_PROTOCOL to a JoinGroup, GROUP_ID_NOT_FOUND to a heartbeat), as Kafka does.

A Kafka commit C is the next offset to read; a stored stream offset is the last one processed: C is
stored as C - 1 (a commit of 0 removes the stored offset), and a stored X reads back as X + 1, so
RabbitMQ Stream's QueryOffset/StoreOffset and Kafka resume the same group without skipping or repeating.
"""

from riverbed.engine.errors import RiverbedError, StreamNotFound
from riverbed.shells.broker import READ
from riverbed.shells.kafka import codec as C
from riverbed.shells.kafka import groups as G
from riverbed.shells.kafka.shell import NODE_ID


class GroupCommands:
    """Handlers ``_on_<api>(self, hdr, req)`` for the group APIs; ``self`` is a KafkaSession."""

    def _group_reply(self, hdr):
        slot = self._slot()
        return lambda body: self._answer(slot, hdr.api_key, hdr.version, hdr.correlation_id,
                                         dict(body, throttle_time_ms=0))

    def _on_find_coordinator(self, hdr, req):
        b = self._broker_entry()
        node, host, port = NODE_ID, b["host"], b["port"]
        kv = self._cluster_view()
        if kv is not None:
            node, host, port = kv.coordinator_entry(self.broker.cluster, req["key"] or "", b)
        self._reply(hdr, {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "node_id": node,
                          "host": host, "port": port})

    def _not_coordinator(self, group_id):
        """NOT_COORDINATOR when a cluster member that does not coordinate ``group_id`` is asked, else 0."""
        kv = self._cluster_view()
        if kv is None or kv.coordinator(self.broker.cluster, group_id or "") == self.broker.cluster.name:
            return 0
        return C.ERR_NOT_COORDINATOR

    def _on_join_group(self, hdr, req):
        if self._not_coordinator(req["group_id"]):
            self._reply(hdr, {"throttle_time_ms": 0, "error_code": C.ERR_NOT_COORDINATOR,
                              "member_id": req["member_id"]})
            return
        cg = self.shell.consumer_groups.group(req["group_id"])
        if cg is not None and cg.members:
            self._reply(hdr, {"throttle_time_ms": 0, "error_code": G.ERR_INCONSISTENT_GROUP_PROTOCOL,
                              "member_id": req["member_id"]})
            return
        self.shell.groups.join(req, hdr.version, self.client_id, "/" + str(self.remote[0]), self._group_reply(hdr))

    def _on_sync_group(self, hdr, req):
        if self._not_coordinator(req["group_id"]):
            self._reply(hdr, {"throttle_time_ms": 0, "error_code": C.ERR_NOT_COORDINATOR})
            return
        self.shell.groups.sync(req, self._group_reply(hdr))

    def _on_heartbeat(self, hdr, req):
        self._reply(hdr, {"throttle_time_ms": 0, "error_code": self._not_coordinator(req["group_id"])
                          or self.shell.groups.heartbeat(req)})

    def _on_leave_group(self, hdr, req):
        if hdr.version < 3:
            codes = self.shell.groups.leave(req["group_id"], [req["member_id"]])
            self._reply(hdr, {"throttle_time_ms": 0, "error_code": codes[0]})
            return
        members = req["members"]
        codes = self.shell.groups.leave(req["group_id"], [m["member_id"] for m in members])
        self._reply(hdr, {"throttle_time_ms": 0, "error_code": 0, "members": [
            {"member_id": m["member_id"], "group_instance_id": m["group_instance_id"], "error_code": code}
            for m, code in zip(members, codes)]})

    def _on_consumer_group_heartbeat(self, hdr, req):
        def is_classic(gid):
            g = self.shell.groups.group(gid)
            return g is not None and bool(g.members)
        if self._not_coordinator(req["group_id"]):
            body = self.shell.consumer_groups.error(C.ERR_NOT_COORDINATOR, "another node coordinates this group")
        else:
            body = self.shell.consumer_groups.heartbeat(req, self.client_id, "/" + str(self.remote[0]), is_classic)
        body["throttle_time_ms"] = 0
        self._reply(hdr, body)

    def _on_consumer_group_describe(self, hdr, req):
        self._reply(hdr, {"throttle_time_ms": 0, "groups": [self.shell.consumer_groups.described(gid)
                                                            for gid in req["group_ids"]]})

    def _on_list_groups(self, hdr, req):
        states = set(req["states_filter"] or ())
        types = {t.lower() for t in req["types_filter"] or ()}
        classic = self.shell.groups.listed()
        ids = {g["group_id"] for g in classic}
        # one entry per id: an empty consumer group gives way to a classic group of that id, and back
        consumer = [g for g in self.shell.consumer_groups.listed()
                    if g["group_state"] != "Empty" or g["group_id"] not in ids]
        mine = {g["group_id"] for g in consumer}
        groups = [g for g in [g for g in classic if g["group_id"] not in mine] + consumer
                  if (not states or g["group_state"] in states) and (not types or g["group_type"] in types)]
        self._reply(hdr, {"throttle_time_ms": 0, "error_code": 0, "groups": groups})

    def _on_describe_groups(self, hdr, req):
        cgs = self.shell.consumer_groups
        self._reply(hdr, {"throttle_time_ms": 0, "groups": [
            cgs.classic_described(gid) if cgs.group(gid) is not None and cgs.group(gid).members
            else self.shell.groups.described(gid, hdr.version) for gid in req["groups"]]})

    # ------------------------------------------------------------------------------------------ offsets

    def _commit_error(self, req, version):
        """The error every partition of an OffsetCommit gets from the group check, or 0."""
        gen = req["generation_id_or_member_epoch"] if version >= 1 else -1
        if gen < 0:
            return 0            # a consumer without group management (assign + commit)
        cg = self.shell.consumer_groups.group(req["group_id"])
        if cg is not None and cg.members:
            return self.shell.consumer_groups.commit_error(cg, req["member_id"], gen)
        g = self.shell.groups.group(req["group_id"])
        if g is None or req["member_id"] not in g.members:
            return G.ERR_UNKNOWN_MEMBER_ID
        if gen != g.generation:
            return G.ERR_ILLEGAL_GENERATION
        if g.state == G.COMPLETING:
            return G.ERR_REBALANCE_IN_PROGRESS
        return 0

    def _on_offset_commit(self, hdr, req):
        reply = self._group_reply(hdr)
        group = req["group_id"]
        if not group:
            err = G.ERR_INVALID_GROUP_ID
        else:
            err = self._not_coordinator(group) or self._commit_error(req, hdr.version)
        topics = []
        todo = []
        for t in req["topics"]:
            parts = []
            topics.append({"name": t["name"], "partitions": parts})
            for p in t["partitions"]:
                res = {"partition_index": p["partition_index"], "error_code": err}
                parts.append(res)
                if err:
                    continue
                stream = self.shell.stream_of(t["name"], p["partition_index"])
                if stream is None:
                    res["error_code"] = C.ERR_UNKNOWN_TOPIC_OR_PARTITION
                elif not self._allowed(READ, stream):
                    res["error_code"] = C.ERR_TOPIC_AUTHORIZATION_FAILED
                else:
                    todo.append((res, stream, p["committed_offset"]))
        left = [len(todo)]

        def answer():
            reply({"topics": topics})
        if not todo:
            answer()
            return

        def stored(res, exc):
            if isinstance(exc, StreamNotFound):
                res["error_code"] = C.ERR_UNKNOWN_TOPIC_OR_PARTITION
            elif exc is not None:
                res["error_code"] = C.ERR_UNKNOWN_SERVER_ERROR
            left[0] -= 1
            if left[0] == 0:
                answer()
        for res, stream, committed in todo:
            # counted for the drain; dropped once the connection is gone
            cb = self._later(lambda exc, res=res: stored(res, exc))
            if committed > 0:
                self.broker.store_offset(stream, group, committed - 1, cb)
            else:
                self.broker.delete_offset(stream, group, cb)

    def _on_offset_fetch(self, hdr, req):
        reply = self._group_reply(hdr)
        group = req["group_id"]
        if self._not_coordinator(group):
            reply({"error_code": C.ERR_NOT_COORDINATOR, "topics": [
                {"name": t["name"], "partitions": [{"partition_index": i, "committed_offset": -1, "metadata": "",
                                                    "error_code": C.ERR_NOT_COORDINATOR}
                                                   for i in t["partition_indexes"]]} for t in req["topics"] or ()]})
            return
        wanted = req["topics"]
        if wanted is None:
            wanted = [{"name": n, "partition_indexes": list(range(len(self.shell.partitions(n) or ())))}
                      for n in self.shell.topics()]
        topics = []
        todo = []
        for t in wanted:
            parts = []
            topics.append({"name": t["name"], "partitions": parts})
            for i in t["partition_indexes"]:
                res = {"partition_index": i, "committed_offset": -1, "committed_leader_epoch": -1, "metadata": "",
                       "error_code": 0}
                parts.append(res)
                stream = self.shell.stream_of(t["name"], i)
                if stream is None:
                    continue
                if not self._allowed(READ, stream):
                    res["error_code"] = C.ERR_TOPIC_AUTHORIZATION_FAILED
                    continue
                todo.append((res, stream))
        if req["topics"] is None:
            keep = []
            for t in topics:
                t["partitions"] = [p for p in t["partitions"] if p["error_code"] or any(r is p for r, _ in todo)]
                keep.append(t)
            topics = keep
        left = [len(todo)]

        def answer():
            if req["topics"] is None:
                for t in topics:
                    t["partitions"] = [p for p in t["partitions"] if p["committed_offset"] >= 0 or p["error_code"]]
                topics[:] = [t for t in topics if t["partitions"]]
            reply({"topics": topics, "error_code": 0})
        if not todo or not group:
            answer()
            return

        def found(res, offset, exc):
            if exc is None and offset is not None:
                res["committed_offset"] = offset + 1
            elif exc is not None and not isinstance(exc, (StreamNotFound, RiverbedError)):
                res["error_code"] = C.ERR_UNKNOWN_SERVER_ERROR
            left[0] -= 1
            if left[0] == 0:
                answer()
        for res, stream in todo:
            self.broker.query_offset(stream, group, lambda offset, exc, res=res: found(res, offset, exc))
