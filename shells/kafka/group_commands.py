"""The consumer-group APIs of a Kafka connection (a mixin of KafkaSession): FindCoordinator, JoinGroup,
SyncGroup, Heartbeat, LeaveGroup (coordination: :mod:`riverbed.shells.kafka.groups`), OffsetCommit and
OffsetFetch (the engine's consumer offsets, with the group id as reference), ListGroups, DescribeGroups.

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
    """Handlers ``(self, hdr, req)`` for the group APIs; ``self`` is a KafkaSession."""

    def _group_reply(self, hdr):
        slot = self._slot()
        return lambda body: self._answer(slot, hdr.api_key, hdr.version, hdr.correlation_id,
                                         dict(body, throttle_time_ms=0))

    def find_coordinator(self, hdr, req):
        b = self._broker_entry()
        self._reply(hdr, {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "node_id": NODE_ID,
                          "host": b["host"], "port": b["port"]})

    def join_group(self, hdr, req):
        self.shell.groups.join(req, hdr.version, self.client_id, "/" + str(self.remote[0]), self._group_reply(hdr))

    def sync_group(self, hdr, req):
        self.shell.groups.sync(req, self._group_reply(hdr))

    def heartbeat(self, hdr, req):
        self._reply(hdr, {"throttle_time_ms": 0, "error_code": self.shell.groups.heartbeat(req)})

    def leave_group(self, hdr, req):
        if hdr.version < 3:
            codes = self.shell.groups.leave(req["group_id"], [req["member_id"]])
            self._reply(hdr, {"throttle_time_ms": 0, "error_code": codes[0]})
            return
        members = req["members"]
        codes = self.shell.groups.leave(req["group_id"], [m["member_id"] for m in members])
        self._reply(hdr, {"throttle_time_ms": 0, "error_code": 0, "members": [
            {"member_id": m["member_id"], "group_instance_id": m["group_instance_id"], "error_code": code}
            for m, code in zip(members, codes)]})

    def list_groups(self, hdr, req):
        states = set(req["states_filter"] or ())
        types = {t.lower() for t in req["types_filter"] or ()}
        groups = [g for g in self.shell.groups.listed()
                  if (not states or g["group_state"] in states) and (not types or g["group_type"] in types)]
        self._reply(hdr, {"throttle_time_ms": 0, "error_code": 0, "groups": groups})

    def describe_groups(self, hdr, req):
        self._reply(hdr, {"throttle_time_ms": 0, "groups": [self.shell.groups.described(gid, hdr.version)
                                                            for gid in req["groups"]]})

    # ------------------------------------------------------------------------------------------ offsets

    def _commit_error(self, req, version):
        """The error every partition of an OffsetCommit gets from the group check, or 0."""
        gen = req["generation_id_or_member_epoch"] if version >= 1 else -1
        if gen < 0:
            return 0            # a consumer without group management (assign + commit)
        g = self.shell.groups.group(req["group_id"])
        if g is None or req["member_id"] not in g.members:
            return G.ERR_UNKNOWN_MEMBER_ID
        if gen != g.generation:
            return G.ERR_ILLEGAL_GENERATION
        if g.state == G.COMPLETING:
            return G.ERR_REBALANCE_IN_PROGRESS
        return 0

    def offset_commit(self, hdr, req):
        reply = self._group_reply(hdr)
        group = req["group_id"]
        err = self._commit_error(req, hdr.version) if group else G.ERR_INVALID_GROUP_ID
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
            self.pending_ops -= 1
            if isinstance(exc, StreamNotFound):
                res["error_code"] = C.ERR_UNKNOWN_TOPIC_OR_PARTITION
            elif exc is not None:
                res["error_code"] = C.ERR_UNKNOWN_SERVER_ERROR
            left[0] -= 1
            if left[0] == 0:
                answer()
        self.pending_ops += len(todo)
        for res, stream, committed in todo:
            cb = (lambda exc, res=res: stored(res, exc))
            if committed > 0:
                self.broker.store_offset(stream, group, committed - 1, cb)
            else:
                self.broker.delete_offset(stream, group, cb)

    def offset_fetch(self, hdr, req):
        reply = self._group_reply(hdr)
        group = req["group_id"]
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
