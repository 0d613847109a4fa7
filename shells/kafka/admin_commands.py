"""Topic administration and producer ids of a Kafka connection (a mixin of KafkaSession): DeleteTopics,
CreatePartitions, DescribeConfigs (retention as configs) and InitProducerId (idempotent producers).

CreatePartitions grows a topic in place: a one-partition topic (the stream ``T``) becomes the super
stream ``T`` whose partition 0 is that stream and whose new partitions are ``T-1``, ``T-2``...; a super
stream gains ``T-<i>`` partitions. Existing records stay where they are.

Idempotent producers: a producer id is handed out per InitProducerId (random 62-bit, so ids stay unique
across restarts); its records are appended with the engine's publisher sequences, the reference
``kafka-<producer id>-<epoch>`` per partition stream and record i of a batch as sequence base + i, so a
retried batch is stored once (the engine drops ids at or below the highest stored one, in the same
transaction as the records). Transactions are out of scope: an InitProducerId with a transactional id
answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
"""

import secrets

from riverbed.engine.errors import RiverbedError, StreamNotFound
from riverbed.shells.broker import CONFIGURE, READ
from riverbed.shells.kafka import codec as C
from riverbed.shells.kafka.shell import MAX_TOPIC_PARTITIONS, partition_name

ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4
SOURCE_TOPIC, SOURCE_DEFAULT = 1, 5
CONFIG_STRING, CONFIG_LONG = 2, 5
_AGE_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "D": 86_400_000, "M": 30 * 86_400_000,
                 "Y": 365 * 86_400_000}


def producer_reference(producer_id, epoch):
    """The engine publisher reference of one idempotent producer's epoch."""
    return f"kafka-{producer_id}-{epoch}"


def _retention_ms(max_age):
    if not max_age:
        return None
    text = str(max_age)
    unit = text[-1]
    try:
        return int(text[:-1]) * _AGE_UNITS_MS[unit]
    except (KeyError, ValueError):
        return None


class AdminCommands:
    """Handlers ``_on_<api>(self, hdr, req)``; ``self`` is a KafkaSession."""

    # ------------------------------------------------------------------------------------- DeleteTopics

    def _on_delete_topics(self, hdr, req):
        slot = self._slot()
        results = []
        todo = []
        for name in req["topic_names"]:
            res = {"name": name, "error_code": 0, "error_message": None}
            results.append(res)
            parts = self.shell.partitions(name)
            if parts is None:
                res["error_code"] = C.ERR_UNKNOWN_TOPIC_OR_PARTITION
            elif not self._allowed(CONFIGURE, name):
                res["error_code"] = C.ERR_TOPIC_AUTHORIZATION_FAILED
            else:
                todo.append((res, name, self.broker.partitions(name) is not None))
        left = [len(todo)]

        def answer():
            self._answer(slot, hdr.api_key, hdr.version, hdr.correlation_id,
                         {"throttle_time_ms": 0, "responses": results})
        if not todo:
            answer()
            return

        def done(res, exc):
            if isinstance(exc, StreamNotFound):
                res["error_code"] = C.ERR_UNKNOWN_TOPIC_OR_PARTITION
            elif exc is not None:
                res.update(error_code=C.ERR_UNKNOWN_SERVER_ERROR, error_message=str(exc))
            left[0] -= 1
            if left[0] == 0:
                answer()
        for res, name, is_super in todo:
            cb = (lambda exc, res=res: done(res, exc))
            if is_super:
                self.broker.delete_super_stream(name, cb)
            else:
                self.broker.delete_stream(name, cb)

    # --------------------------------------------------------------------------------- CreatePartitions

    def _on_create_partitions(self, hdr, req):
        slot = self._slot()
        results = []
        steps = []
        for t in req["topics"]:
            name, count = t["name"], t["count"]
            res = {"name": name, "error_code": 0, "error_message": None}
            results.append(res)
            parts = self.shell.partitions(name)
            if parts is None:
                res["error_code"] = C.ERR_UNKNOWN_TOPIC_OR_PARTITION
            elif not self._allowed(CONFIGURE, name):
                res["error_code"] = C.ERR_TOPIC_AUTHORIZATION_FAILED
            elif count <= len(parts):
                res.update(error_code=C.ERR_INVALID_PARTITIONS,
                           error_message=f"topic {name!r} has {len(parts)} partitions; {count} is not more")
            elif count > MAX_TOPIC_PARTITIONS:
                res.update(error_code=C.ERR_INVALID_PARTITIONS,
                           error_message=f"{count} partitions: a topic has at most {MAX_TOPIC_PARTITIONS}")
            elif t["assignments"]:
                res.update(error_code=C.ERR_INVALID_REQUEST, error_message="this broker is one node: no assignments")
            elif not req["validate_only"]:
                steps.append((res, name, parts, count))
        left = [len(steps)]

        def answer():
            self._answer(slot, hdr.api_key, hdr.version, hdr.correlation_id,
                         {"throttle_time_ms": 0, "results": results})
        if not steps:
            answer()
            return

        def finished(res, exc):
            if exc is not None:
                res.update(error_code=C.ERR_INVALID_PARTITIONS if isinstance(exc, RiverbedError)
                           else C.ERR_UNKNOWN_SERVER_ERROR, error_message=str(exc))
            left[0] -= 1
            if left[0] == 0:
                answer()
        for res, name, parts, count in steps:
            self._grow(name, parts, count, lambda exc, res=res: finished(res, exc))

    def _grow(self, name, parts, count, cb):
        """Make topic ``name`` (partitions ``parts``) ``count`` partitions: one engine step after another,
        ``cb(exc)`` at the end or at the first failure."""
        b = self.broker
        args = {}
        try:
            args = dict(b.stream_info(parts[0]).arguments)
        except RiverbedError:
            pass
        plan = []
        if b.partitions(name) is None:          # the stream T becomes partition 0 of the super stream T
            plan.append(lambda k: b.declare_super_stream(name, lambda res, exc: k(exc)))
            plan.append(lambda k: b.bind_partition(name, name, "0", 0, lambda res, exc: k(exc)))
        for i in range(len(parts), count):
            stream = partition_name(name, i)
            plan.append(lambda k, s=stream: b.create_stream(s, args, k))
            plan.append(lambda k, s=stream, i=i: b.bind_partition(name, s, str(i), i, lambda res, exc: k(exc)))

        def step(i, exc=None):
            if exc is not None or i == len(plan):
                cb(exc)
                return
            plan[i](lambda e: step(i + 1, e))
        step(0)

    # ---------------------------------------------------------------------------------- DescribeConfigs

    def _on_describe_configs(self, hdr, req):
        results = []
        for r in req["resources"]:
            res = {"error_code": 0, "error_message": None, "resource_type": r["resource_type"],
                   "resource_name": r["resource_name"], "configs": []}
            results.append(res)
            if r["resource_type"] == RESOURCE_BROKER:
                continue                        # no broker configs are described
            if r["resource_type"] != RESOURCE_TOPIC:
                res.update(error_code=C.ERR_INVALID_REQUEST, error_message="only topic configs are described")
                continue
            parts = self.shell.partitions(r["resource_name"])
            if parts is None:
                res["error_code"] = C.ERR_UNKNOWN_TOPIC_OR_PARTITION
                continue
            if not self._allowed(READ, r["resource_name"]) and not self._allowed(CONFIGURE, r["resource_name"]):
                res["error_code"] = C.ERR_TOPIC_AUTHORIZATION_FAILED
                continue
            try:
                args = self.broker.stream_info(parts[0]).arguments
            except RiverbedError:
                res["error_code"] = C.ERR_UNKNOWN_TOPIC_OR_PARTITION
                continue
            ms = _retention_ms(args.get("max-age"))
            nbytes = args.get("max-length-bytes")
            configs = [("retention.ms", str(ms) if ms else "-1", ms is None),
                       ("retention.bytes", str(nbytes) if nbytes else "-1", nbytes is None),
                       ("cleanup.policy", "delete", True)]
            keys = r["configuration_keys"]
            res["configs"] = [{"name": n, "value": v, "read_only": n == "cleanup.policy", "is_default": dflt,
                               "config_source": SOURCE_DEFAULT if dflt else SOURCE_TOPIC, "is_sensitive": False,
                               "synonyms": [], "config_type": CONFIG_STRING if n == "cleanup.policy" else CONFIG_LONG,
                               "documentation": None}
                              for n, v, dflt in configs if keys is None or n in keys]
        self._reply(hdr, {"throttle_time_ms": 0, "results": results})

    # ----------------------------------------------------------------------------------- InitProducerId

    def _on_init_producer_id(self, hdr, req):
        if req["transactional_id"] is not None:
            self._reply(hdr, {"throttle_time_ms": 0, "error_code": ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                              "producer_id": -1, "producer_epoch": -1})
            return
        pid, epoch = req["producer_id"], req["producer_epoch"]
        if pid >= 0 and 0 <= epoch < 0x7FFE:
            epoch += 1                          # KIP-360: the same producer bumps its epoch
        else:
            pid, epoch = secrets.randbits(62), 0
        self._reply(hdr, {"throttle_time_ms": 0, "error_code": 0, "producer_id": pid, "producer_epoch": epoch})
