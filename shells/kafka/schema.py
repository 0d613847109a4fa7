"""Kafka's request and response bodies as field lists, for :mod:`riverbed.shells.kafka.codec`.

Field names, types, versions, nullability, tags and defaults are the facts of Kafka's own message
definitions (the JSON files under ``clients/src/main/resources/common/message/`` of apache/kafka),
written down here in Python, names in snake case. Each ``F`` is one field:

* ``type``: ``int8`` ``int16`` ``int32`` ``int64`` ``uint16`` ``bool`` ``string`` ``bytes`` ``records``
  ``uuid`` ``float64``, ``[]int32``-style arrays of a primitive, ``[]`` an array of structs (``fields``),
  ``{}`` one struct (``fields``);
* ``versions``, ``nullable``: Kafka's version ranges (``"3+"``, ``"0-12"``, ``"0"``);
* ``tag``: a tagged field (flexible versions only), written only when set;
* ``default``: what a field absent at a version reads as (else 0, ``""``, ``[]``, False or None).

Only the versions the shell serves matter (:data:`riverbed.shells.kafka.codec.SERVED`); the lists keep
the later fields so that a cap can move up without relearning the format.
"""


def _range(spec):
    """Kafka's version range text -> (low, high), inclusive; None for ``"none"``."""
    if spec is None or spec == "none":
        return None
    if spec.endswith("+"):
        return int(spec[:-1]), 0x7FFF
    if "-" in spec:
        lo, hi = spec.split("-")
        return int(lo), int(hi)
    return int(spec), int(spec)


class F:
    """One field of a message (see the module docstring)."""

    __slots__ = ("name", "type", "lo", "hi", "null_lo", "null_hi", "tag", "default", "fields", "item")

    def __init__(self, name, type, versions, nullable=None, tag=None, default=None, fields=None):
        self.name = name
        self.type = type
        self.lo, self.hi = _range(versions)
        nr = _range(nullable)
        self.null_lo, self.null_hi = nr if nr else (1, 0)
        self.tag = tag
        self.fields = fields
        self.item = type[2:] if type.startswith("[]") and type != "[]" else None
        if default is None and nullable is None:
            default = _ZERO.get(type, None)
            if type.startswith("[]"):
                default = []
        self.default = default

    def present(self, v):
        return self.lo <= v <= self.hi

    def nullable(self, v):
        return self.null_lo <= v <= self.null_hi


_ZERO = {"int8": 0, "int16": 0, "int32": 0, "int64": 0, "uint16": 0, "bool": False, "string": "",
         "bytes": b"", "uuid": b"\0" * 16, "float64": 0.0}


# ---- the bodies (request _REQ, response _RES), one pair per API

# ApiVersions: key 18, valid 0-4, flexible 3+
API_VERSIONS_REQ = (
    F('client_software_name', 'string', '3+'),
    F('client_software_version', 'string', '3+'),
)
API_VERSIONS_RES = (
    F('error_code', 'int16', '0+'),
    F('api_keys', '[]', '0+', fields=(
        F('api_key', 'int16', '0+'),
        F('min_version', 'int16', '0+'),
        F('max_version', 'int16', '0+'),
    )),
    F('throttle_time_ms', 'int32', '1+'),
    F('supported_features', '[]', '3+', tag=0, fields=(
        F('name', 'string', '3+'),
        F('min_version', 'int16', '3+'),
        F('max_version', 'int16', '3+'),
    )),
    F('finalized_features_epoch', 'int64', '3+', tag=1, default=-1),
    F('finalized_features', '[]', '3+', tag=2, fields=(
        F('name', 'string', '3+'),
        F('max_version_level', 'int16', '3+'),
        F('min_version_level', 'int16', '3+'),
    )),
    F('zk_migration_ready', 'bool', '3+', tag=3, default=False),
)
# Metadata: key 3, valid 0-12, flexible 9+
METADATA_REQ = (
    F('topics', '[]', '0+', nullable='1+', fields=(
        F('topic_id', 'uuid', '10+'),
        F('name', 'string', '0+', nullable='10+'),
    )),
    F('allow_auto_topic_creation', 'bool', '4+', default=True),
    F('include_cluster_authorized_operations', 'bool', '8-10'),
    F('include_topic_authorized_operations', 'bool', '8+'),
)
METADATA_RES = (
    F('throttle_time_ms', 'int32', '3+'),
    F('brokers', '[]', '0+', fields=(
        F('node_id', 'int32', '0+'),
        F('host', 'string', '0+'),
        F('port', 'int32', '0+'),
        F('rack', 'string', '1+', nullable='1+'),
    )),
    F('cluster_id', 'string', '2+', nullable='2+'),
    F('controller_id', 'int32', '1+', default=-1),
    F('topics', '[]', '0+', fields=(
        F('error_code', 'int16', '0+'),
        F('name', 'string', '0+', nullable='12+'),
        F('topic_id', 'uuid', '10+'),
        F('is_internal', 'bool', '1+', default=False),
        F('partitions', '[]', '0+', fields=(
            F('error_code', 'int16', '0+'),
            F('partition_index', 'int32', '0+'),
            F('leader_id', 'int32', '0+'),
            F('leader_epoch', 'int32', '7+', default=-1),
            F('replica_nodes', '[]int32', '0+'),
            F('isr_nodes', '[]int32', '0+'),
            F('offline_replicas', '[]int32', '5+'),
        )),
        F('topic_authorized_operations', 'int32', '8+', default=-2147483648),
    )),
    F('cluster_authorized_operations', 'int32', '8-10', default=-2147483648),
)
# CreateTopics: key 19, valid 0-7, flexible 5+
CREATE_TOPICS_REQ = (
    F('topics', '[]', '0+', fields=(
        F('name', 'string', '0+'),
        F('num_partitions', 'int32', '0+'),
        F('replication_factor', 'int16', '0+'),
        F('assignments', '[]', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('broker_ids', '[]int32', '0+'),
        )),
        F('configs', '[]', '0+', fields=(
            F('name', 'string', '0+'),
            F('value', 'string', '0+', nullable='0+'),
        )),
    )),
    F('timeout_ms', 'int32', '0+', default=60000),
    F('validate_only', 'bool', '1+', default=False),
)
CREATE_TOPICS_RES = (
    F('throttle_time_ms', 'int32', '2+'),
    F('topics', '[]', '0+', fields=(
        F('name', 'string', '0+'),
        F('topic_id', 'uuid', '7+'),
        F('error_code', 'int16', '0+'),
        F('error_message', 'string', '1+', nullable='0+'),
        F('topic_config_error_code', 'int16', '5+', tag=0),
        F('num_partitions', 'int32', '5+', default=-1),
        F('replication_factor', 'int16', '5+', default=-1),
        F('configs', '[]', '5+', nullable='5+', fields=(
            F('name', 'string', '5+'),
            F('value', 'string', '5+', nullable='5+'),
            F('read_only', 'bool', '5+'),
            F('config_source', 'int8', '5+', default=-1),
            F('is_sensitive', 'bool', '5+'),
        )),
    )),
)
# Produce: key 0, valid 0-11, flexible 9+
PRODUCE_REQ = (
    F('transactional_id', 'string', '3+', nullable='3+'),
    F('acks', 'int16', '0+'),
    F('timeout_ms', 'int32', '0+'),
    F('topic_data', '[]', '0+', fields=(
        F('name', 'string', '0+'),
        F('partition_data', '[]', '0+', fields=(
            F('index', 'int32', '0+'),
            F('records', 'records', '0+', nullable='0+'),
        )),
    )),
)
PRODUCE_RES = (
    F('responses', '[]', '0+', fields=(
        F('name', 'string', '0+'),
        F('partition_responses', '[]', '0+', fields=(
            F('index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
            F('base_offset', 'int64', '0+'),
            F('log_append_time_ms', 'int64', '2+', default=-1),
            F('log_start_offset', 'int64', '5+', default=-1),
            F('record_errors', '[]', '8+', fields=(
                F('batch_index', 'int32', '8+'),
                F('batch_index_error_message', 'string', '8+', nullable='8+'),
            )),
            F('error_message', 'string', '8+', nullable='8+'),
            F('current_leader', '{}', '10+', tag=0, fields=(
                F('leader_id', 'int32', '10+', default=-1),
                F('leader_epoch', 'int32', '10+', default=-1),
            )),
        )),
    )),
    F('throttle_time_ms', 'int32', '1+', default=0),
    F('node_endpoints', '[]', '10+', tag=0, fields=(
        F('node_id', 'int32', '10+'),
        F('host', 'string', '10+'),
        F('port', 'int32', '10+'),
        F('rack', 'string', '10+', nullable='10+'),
    )),
)
# Fetch: key 1, valid 0-17, flexible 12+
FETCH_REQ = (
    F('cluster_id', 'string', '12+', nullable='12+', tag=0),
    F('replica_id', 'int32', '0-14', default=-1),
    F('replica_state', '{}', '15+', tag=1, fields=(
        F('replica_id', 'int32', '15+', default=-1),
        F('replica_epoch', 'int64', '15+', default=-1),
    )),
    F('max_wait_ms', 'int32', '0+'),
    F('min_bytes', 'int32', '0+'),
    F('max_bytes', 'int32', '3+', default=2147483647),
    F('isolation_level', 'int8', '4+', default=0),
    F('session_id', 'int32', '7+', default=0),
    F('session_epoch', 'int32', '7+', default=-1),
    F('topics', '[]', '0+', fields=(
        F('topic', 'string', '0-12'),
        F('topic_id', 'uuid', '13+'),
        F('partitions', '[]', '0+', fields=(
            F('partition', 'int32', '0+'),
            F('current_leader_epoch', 'int32', '9+', default=-1),
            F('fetch_offset', 'int64', '0+'),
            F('last_fetched_epoch', 'int32', '12+', default=-1),
            F('log_start_offset', 'int64', '5+', default=-1),
            F('partition_max_bytes', 'int32', '0+'),
            F('replica_directory_id', 'uuid', '17+', tag=0),
        )),
    )),
    F('forgotten_topics_data', '[]', '7+', fields=(
        F('topic', 'string', '7-12'),
        F('topic_id', 'uuid', '13+'),
        F('partitions', '[]int32', '7+'),
    )),
    F('rack_id', 'string', '11+', default=''),
)
FETCH_RES = (
    F('throttle_time_ms', 'int32', '1+'),
    F('error_code', 'int16', '7+'),
    F('session_id', 'int32', '7+', default=0),
    F('responses', '[]', '0+', fields=(
        F('topic', 'string', '0-12'),
        F('topic_id', 'uuid', '13+'),
        F('partitions', '[]', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
            F('high_watermark', 'int64', '0+'),
            F('last_stable_offset', 'int64', '4+', default=-1),
            F('log_start_offset', 'int64', '5+', default=-1),
            F('diverging_epoch', '{}', '12+', tag=0, fields=(
                F('epoch', 'int32', '12+', default=-1),
                F('end_offset', 'int64', '12+', default=-1),
            )),
            F('current_leader', '{}', '12+', tag=1, fields=(
                F('leader_id', 'int32', '12+', default=-1),
                F('leader_epoch', 'int32', '12+', default=-1),
            )),
            F('snapshot_id', '{}', '12+', tag=2, fields=(
                F('end_offset', 'int64', '0+', default=-1),
                F('epoch', 'int32', '0+', default=-1),
            )),
            F('aborted_transactions', '[]', '4+', nullable='4+', fields=(
                F('producer_id', 'int64', '4+'),
                F('first_offset', 'int64', '4+'),
            )),
            F('preferred_read_replica', 'int32', '11+', default=-1),
            F('records', 'records', '0+', nullable='0+'),
        )),
    )),
    F('node_endpoints', '[]', '16+', tag=0, fields=(
        F('node_id', 'int32', '16+'),
        F('host', 'string', '16+'),
        F('port', 'int32', '16+'),
        F('rack', 'string', '16+', nullable='16+'),
    )),
)
# ListOffsets: key 2, valid 0-10, flexible 6+
LIST_OFFSETS_REQ = (
    F('replica_id', 'int32', '0+'),
    F('isolation_level', 'int8', '2+'),
    F('topics', '[]', '0+', fields=(
        F('name', 'string', '0+'),
        F('partitions', '[]', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('current_leader_epoch', 'int32', '4+', default=-1),
            F('timestamp', 'int64', '0+'),
            F('max_num_offsets', 'int32', '0', default=1),
        )),
    )),
    F('timeout_ms', 'int32', '10+'),
)
LIST_OFFSETS_RES = (
    F('throttle_time_ms', 'int32', '2+'),
    F('topics', '[]', '0+', fields=(
        F('name', 'string', '0+'),
        F('partitions', '[]', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
            F('old_style_offsets', '[]int64', '0'),
            F('timestamp', 'int64', '1+', default=-1),
            F('offset', 'int64', '1+', default=-1),
            F('leader_epoch', 'int32', '4+', default=-1),
        )),
    )),
)
# FindCoordinator: key 10, valid 0-6, flexible 3+
FIND_COORDINATOR_REQ = (
    F('key', 'string', '0-3'),
    F('key_type', 'int8', '1+', default=0),
    F('coordinator_keys', '[]string', '4+'),
)
FIND_COORDINATOR_RES = (
    F('throttle_time_ms', 'int32', '1+'),
    F('error_code', 'int16', '0-3'),
    F('error_message', 'string', '1-3', nullable='1-3'),
    F('node_id', 'int32', '0-3'),
    F('host', 'string', '0-3'),
    F('port', 'int32', '0-3'),
    F('coordinators', '[]', '4+', fields=(
        F('key', 'string', '4+'),
        F('node_id', 'int32', '4+'),
        F('host', 'string', '4+'),
        F('port', 'int32', '4+'),
        F('error_code', 'int16', '4+'),
        F('error_message', 'string', '4+', nullable='4+'),
    )),
)
# JoinGroup: key 11, valid 0-9, flexible 6+
JOIN_GROUP_REQ = (
    F('group_id', 'string', '0+'),
    F('session_timeout_ms', 'int32', '0+'),
    F('rebalance_timeout_ms', 'int32', '1+', default=-1),
    F('member_id', 'string', '0+'),
    F('group_instance_id', 'string', '5+', nullable='5+'),
    F('protocol_type', 'string', '0+'),
    F('protocols', '[]', '0+', fields=(
        F('name', 'string', '0+'),
        F('metadata', 'bytes', '0+'),
    )),
    F('reason', 'string', '8+', nullable='8+'),
)
JOIN_GROUP_RES = (
    F('throttle_time_ms', 'int32', '2+'),
    F('error_code', 'int16', '0+'),
    F('generation_id', 'int32', '0+', default=-1),
    F('protocol_type', 'string', '7+', nullable='7+'),
    F('protocol_name', 'string', '0+', nullable='7+'),
    F('leader', 'string', '0+'),
    F('skip_assignment', 'bool', '9+', default=False),
    F('member_id', 'string', '0+'),
    F('members', '[]', '0+', fields=(
        F('member_id', 'string', '0+'),
        F('group_instance_id', 'string', '5+', nullable='5+'),
        F('metadata', 'bytes', '0+'),
    )),
)
# SyncGroup: key 14, valid 0-5, flexible 4+
SYNC_GROUP_REQ = (
    F('group_id', 'string', '0+'),
    F('generation_id', 'int32', '0+'),
    F('member_id', 'string', '0+'),
    F('group_instance_id', 'string', '3+', nullable='3+'),
    F('protocol_type', 'string', '5+', nullable='5+'),
    F('protocol_name', 'string', '5+', nullable='5+'),
    F('assignments', '[]', '0+', fields=(
        F('member_id', 'string', '0+'),
        F('assignment', 'bytes', '0+'),
    )),
)
SYNC_GROUP_RES = (
    F('throttle_time_ms', 'int32', '1+'),
    F('error_code', 'int16', '0+'),
    F('protocol_type', 'string', '5+', nullable='5+'),
    F('protocol_name', 'string', '5+', nullable='5+'),
    F('assignment', 'bytes', '0+'),
)
# Heartbeat: key 12, valid 0-4, flexible 4+
HEARTBEAT_REQ = (
    F('group_id', 'string', '0+'),
    F('generation_id', 'int32', '0+'),
    F('member_id', 'string', '0+'),
    F('group_instance_id', 'string', '3+', nullable='3+'),
)
HEARTBEAT_RES = (
    F('throttle_time_ms', 'int32', '1+'),
    F('error_code', 'int16', '0+'),
)
# LeaveGroup: key 13, valid 0-5, flexible 4+
LEAVE_GROUP_REQ = (
    F('group_id', 'string', '0+'),
    F('member_id', 'string', '0-2'),
    F('members', '[]', '3+', fields=(
        F('member_id', 'string', '3+'),
        F('group_instance_id', 'string', '3+', nullable='3+'),
        F('reason', 'string', '5+', nullable='5+'),
    )),
)
LEAVE_GROUP_RES = (
    F('throttle_time_ms', 'int32', '1+'),
    F('error_code', 'int16', '0+'),
    F('members', '[]', '3+', fields=(
        F('member_id', 'string', '3+'),
        F('group_instance_id', 'string', '3+', nullable='3+'),
        F('error_code', 'int16', '3+'),
    )),
)
# OffsetCommit: key 8, valid 0-9, flexible 8+
OFFSET_COMMIT_REQ = (
    F('group_id', 'string', '0+'),
    F('generation_id_or_member_epoch', 'int32', '1+', default=-1),
    F('member_id', 'string', '1+'),
    F('group_instance_id', 'string', '7+', nullable='7+'),
    F('retention_time_ms', 'int64', '2-4', default=-1),
    F('topics', '[]', '0+', fields=(
        F('name', 'string', '0+'),
        F('partitions', '[]', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('committed_offset', 'int64', '0+'),
            F('committed_leader_epoch', 'int32', '6+', default=-1),
            F('commit_timestamp', 'int64', '1', default=-1),
            F('committed_metadata', 'string', '0+', nullable='0+'),
        )),
    )),
)
OFFSET_COMMIT_RES = (
    F('throttle_time_ms', 'int32', '3+'),
    F('topics', '[]', '0+', fields=(
        F('name', 'string', '0+'),
        F('partitions', '[]', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
        )),
    )),
)
# OffsetFetch: key 9, valid 0-9, flexible 6+
OFFSET_FETCH_REQ = (
    F('group_id', 'string', '0-7'),
    F('topics', '[]', '0-7', nullable='2-7', fields=(
        F('name', 'string', '0-7'),
        F('partition_indexes', '[]int32', '0-7'),
    )),
    F('groups', '[]', '8+', fields=(
        F('group_id', 'string', '8+'),
        F('member_id', 'string', '9+', nullable='9+'),
        F('member_epoch', 'int32', '9+', default=-1),
        F('topics', '[]', '8+', nullable='8+', fields=(
            F('name', 'string', '8+'),
            F('partition_indexes', '[]int32', '8+'),
        )),
    )),
    F('require_stable', 'bool', '7+', default=False),
)
OFFSET_FETCH_RES = (
    F('throttle_time_ms', 'int32', '3+'),
    F('topics', '[]', '0-7', fields=(
        F('name', 'string', '0-7'),
        F('partitions', '[]', '0-7', fields=(
            F('partition_index', 'int32', '0-7'),
            F('committed_offset', 'int64', '0-7'),
            F('committed_leader_epoch', 'int32', '5-7', default=-1),
            F('metadata', 'string', '0-7', nullable='0-7'),
            F('error_code', 'int16', '0-7'),
        )),
    )),
    F('error_code', 'int16', '2-7', default=0),
    F('groups', '[]', '8+', fields=(
        F('group_id', 'string', '8+'),
        F('topics', '[]', '8+', fields=(
            F('name', 'string', '8+'),
            F('partitions', '[]', '8+', fields=(
                F('partition_index', 'int32', '8+'),
                F('committed_offset', 'int64', '8+'),
                F('committed_leader_epoch', 'int32', '8+', default=-1),
                F('metadata', 'string', '8+', nullable='8+'),
                F('error_code', 'int16', '8+'),
            )),
        )),
        F('error_code', 'int16', '8+', default=0),
    )),
)
# ListGroups: key 16, valid 0-5, flexible 3+
LIST_GROUPS_REQ = (
    F('states_filter', '[]string', '4+'),
    F('types_filter', '[]string', '5+'),
)
LIST_GROUPS_RES = (
    F('throttle_time_ms', 'int32', '1+'),
    F('error_code', 'int16', '0+'),
    F('groups', '[]', '0+', fields=(
        F('group_id', 'string', '0+'),
        F('protocol_type', 'string', '0+'),
        F('group_state', 'string', '4+'),
        F('group_type', 'string', '5+'),
    )),
)
# DescribeGroups: key 15, valid 0-5, flexible 5+
DESCRIBE_GROUPS_REQ = (
    F('groups', '[]string', '0+'),
    F('include_authorized_operations', 'bool', '3+'),
)
DESCRIBE_GROUPS_RES = (
    F('throttle_time_ms', 'int32', '1+'),
    F('groups', '[]', '0+', fields=(
        F('error_code', 'int16', '0+'),
        F('group_id', 'string', '0+'),
        F('group_state', 'string', '0+'),
        F('protocol_type', 'string', '0+'),
        F('protocol_data', 'string', '0+'),
        F('members', '[]', '0+', fields=(
            F('member_id', 'string', '0+'),
            F('group_instance_id', 'string', '4+', nullable='4+'),
            F('client_id', 'string', '0+'),
            F('client_host', 'string', '0+'),
            F('member_metadata', 'bytes', '0+'),
            F('member_assignment', 'bytes', '0+'),
        )),
        F('authorized_operations', 'int32', '3+', default=-2147483648),
    )),
)
# InitProducerId: key 22, valid 0-5, flexible 2+
INIT_PRODUCER_ID_REQ = (
    F('transactional_id', 'string', '0+', nullable='0+'),
    F('transaction_timeout_ms', 'int32', '0+'),
    F('producer_id', 'int64', '3+', default=-1),
    F('producer_epoch', 'int16', '3+', default=-1),
)
INIT_PRODUCER_ID_RES = (
    F('throttle_time_ms', 'int32', '0+'),
    F('error_code', 'int16', '0+'),
    F('producer_id', 'int64', '0+', default=-1),
    F('producer_epoch', 'int16', '0+'),
)
# DeleteTopics: key 20, valid 0-6, flexible 4+
DELETE_TOPICS_REQ = (
    F('topics', '[]', '6+', fields=(
        F('name', 'string', '6+', nullable='6+'),
        F('topic_id', 'uuid', '6+'),
    )),
    F('topic_names', '[]string', '0-5'),
    F('timeout_ms', 'int32', '0+'),
)
DELETE_TOPICS_RES = (
    F('throttle_time_ms', 'int32', '1+'),
    F('responses', '[]', '0+', fields=(
        F('name', 'string', '0+', nullable='6+'),
        F('topic_id', 'uuid', '6+'),
        F('error_code', 'int16', '0+'),
        F('error_message', 'string', '5+', nullable='5+'),
    )),
)
# CreatePartitions: key 37, valid 0-3, flexible 2+
CREATE_PARTITIONS_REQ = (
    F('topics', '[]', '0+', fields=(
        F('name', 'string', '0+'),
        F('count', 'int32', '0+'),
        F('assignments', '[]', '0+', nullable='0+', fields=(
            F('broker_ids', '[]int32', '0+'),
        )),
    )),
    F('timeout_ms', 'int32', '0+'),
    F('validate_only', 'bool', '0+'),
)
CREATE_PARTITIONS_RES = (
    F('throttle_time_ms', 'int32', '0+'),
    F('results', '[]', '0+', fields=(
        F('name', 'string', '0+'),
        F('error_code', 'int16', '0+'),
        F('error_message', 'string', '0+', nullable='0+'),
    )),
)
# DescribeConfigs: key 32, valid 0-4, flexible 4+
DESCRIBE_CONFIGS_REQ = (
    F('resources', '[]', '0+', fields=(
        F('resource_type', 'int8', '0+'),
        F('resource_name', 'string', '0+'),
        F('configuration_keys', '[]string', '0+', nullable='0+'),
    )),
    F('include_synonyms', 'bool', '1+', default=False),
    F('include_documentation', 'bool', '3+', default=False),
)
DESCRIBE_CONFIGS_RES = (
    F('throttle_time_ms', 'int32', '0+'),
    F('results', '[]', '0+', fields=(
        F('error_code', 'int16', '0+'),
        F('error_message', 'string', '0+', nullable='0+'),
        F('resource_type', 'int8', '0+'),
        F('resource_name', 'string', '0+'),
        F('configs', '[]', '0+', fields=(
            F('name', 'string', '0+'),
            F('value', 'string', '0+', nullable='0+'),
            F('read_only', 'bool', '0+'),
            F('is_default', 'bool', '0'),
            F('config_source', 'int8', '1+', default=-1),
            F('is_sensitive', 'bool', '0+'),
            F('synonyms', '[]', '1+', fields=(
                F('name', 'string', '1+'),
                F('value', 'string', '1+', nullable='0+'),
                F('source', 'int8', '1+'),
            )),
            F('config_type', 'int8', '3+', default=0),
            F('documentation', 'string', '3+', nullable='0+'),
        )),
    )),
)
# SaslHandshake: key 17, valid 0-1, flexible none
SASL_HANDSHAKE_REQ = (
    F('mechanism', 'string', '0+'),
)
SASL_HANDSHAKE_RES = (
    F('error_code', 'int16', '0+'),
    F('mechanisms', '[]string', '0+'),
)
# SaslAuthenticate: key 36, valid 0-2, flexible 2+
SASL_AUTHENTICATE_REQ = (
    F('auth_bytes', 'bytes', '0+'),
)
SASL_AUTHENTICATE_RES = (
    F('error_code', 'int16', '0+'),
    F('error_message', 'string', '0+', nullable='0+'),
    F('auth_bytes', 'bytes', '0+'),
    F('session_lifetime_ms', 'int64', '1+', default=0),
)

# ConsumerGroupHeartbeat (KIP-848): key 68, valid 0-1, flexible 0+
_TOPIC_PARTITIONS = (
    F('topic_id', 'uuid', '0+'),
    F('partitions', '[]int32', '0+'),
)
CONSUMER_GROUP_HEARTBEAT_REQ = (
    F('group_id', 'string', '0+'),
    F('member_id', 'string', '0+'),
    F('member_epoch', 'int32', '0+'),
    F('instance_id', 'string', '0+', nullable='0+'),
    F('rack_id', 'string', '0+', nullable='0+'),
    F('rebalance_timeout_ms', 'int32', '0+', default=-1),
    F('subscribed_topic_names', '[]string', '0+', nullable='0+'),
    F('subscribed_topic_regex', 'string', '1+', nullable='1+'),
    F('server_assignor', 'string', '0+', nullable='0+'),
    F('topic_partitions', '[]', '0+', nullable='0+', fields=_TOPIC_PARTITIONS),
)
CONSUMER_GROUP_HEARTBEAT_RES = (
    F('throttle_time_ms', 'int32', '0+'),
    F('error_code', 'int16', '0+'),
    F('error_message', 'string', '0+', nullable='0+'),
    F('member_id', 'string', '0+', nullable='0+'),
    F('member_epoch', 'int32', '0+'),
    F('heartbeat_interval_ms', 'int32', '0+'),
    F('assignment', '{}', '0+', nullable='0+', fields=(
        F('topic_partitions', '[]', '0+', fields=_TOPIC_PARTITIONS),
    )),
)
# ConsumerGroupDescribe (KIP-848): key 69, valid 0, flexible 0+
CONSUMER_GROUP_DESCRIBE_REQ = (
    F('group_ids', '[]string', '0+'),
    F('include_authorized_operations', 'bool', '0+'),
)
_DESCRIBED_ASSIGNMENT = (
    F('topic_partitions', '[]', '0+', fields=(
        F('topic_id', 'uuid', '0+'),
        F('topic_name', 'string', '0+'),
        F('partitions', '[]int32', '0+'),
    )),
)
CONSUMER_GROUP_DESCRIBE_RES = (
    F('throttle_time_ms', 'int32', '0+'),
    F('groups', '[]', '0+', fields=(
        F('error_code', 'int16', '0+'),
        F('error_message', 'string', '0+', nullable='0+'),
        F('group_id', 'string', '0+'),
        F('group_state', 'string', '0+'),
        F('group_epoch', 'int32', '0+'),
        F('assignment_epoch', 'int32', '0+'),
        F('assignor_name', 'string', '0+'),
        F('members', '[]', '0+', fields=(
            F('member_id', 'string', '0+'),
            F('instance_id', 'string', '0+', nullable='0+'),
            F('rack_id', 'string', '0+', nullable='0+'),
            F('member_epoch', 'int32', '0+'),
            F('client_id', 'string', '0+'),
            F('client_host', 'string', '0+'),
            F('subscribed_topic_names', '[]string', '0+'),
            F('subscribed_topic_regex', 'string', '0+', nullable='0+'),
            F('assignment', '{}', '0+', fields=_DESCRIBED_ASSIGNMENT),
            F('target_assignment', '{}', '0+', fields=_DESCRIBED_ASSIGNMENT),
        )),
        F('authorized_operations', 'int32', '0+', default=-2147483648),
    )),
)

# api key -> (name, request fields, response fields, first flexible version or None)
MESSAGES = {
    0: ("Produce", PRODUCE_REQ, PRODUCE_RES, 9),
    1: ("Fetch", FETCH_REQ, FETCH_RES, 12),
    2: ("ListOffsets", LIST_OFFSETS_REQ, LIST_OFFSETS_RES, 6),
    3: ("Metadata", METADATA_REQ, METADATA_RES, 9),
    8: ("OffsetCommit", OFFSET_COMMIT_REQ, OFFSET_COMMIT_RES, 8),
    9: ("OffsetFetch", OFFSET_FETCH_REQ, OFFSET_FETCH_RES, 6),
    10: ("FindCoordinator", FIND_COORDINATOR_REQ, FIND_COORDINATOR_RES, 3),
    11: ("JoinGroup", JOIN_GROUP_REQ, JOIN_GROUP_RES, 6),
    12: ("Heartbeat", HEARTBEAT_REQ, HEARTBEAT_RES, 4),
    13: ("LeaveGroup", LEAVE_GROUP_REQ, LEAVE_GROUP_RES, 4),
    14: ("SyncGroup", SYNC_GROUP_REQ, SYNC_GROUP_RES, 4),
    15: ("DescribeGroups", DESCRIBE_GROUPS_REQ, DESCRIBE_GROUPS_RES, 5),
    16: ("ListGroups", LIST_GROUPS_REQ, LIST_GROUPS_RES, 3),
    17: ("SaslHandshake", SASL_HANDSHAKE_REQ, SASL_HANDSHAKE_RES, None),
    18: ("ApiVersions", API_VERSIONS_REQ, API_VERSIONS_RES, 3),
    19: ("CreateTopics", CREATE_TOPICS_REQ, CREATE_TOPICS_RES, 5),
    20: ("DeleteTopics", DELETE_TOPICS_REQ, DELETE_TOPICS_RES, 4),
    22: ("InitProducerId", INIT_PRODUCER_ID_REQ, INIT_PRODUCER_ID_RES, 2),
    32: ("DescribeConfigs", DESCRIBE_CONFIGS_REQ, DESCRIBE_CONFIGS_RES, 4),
    36: ("SaslAuthenticate", SASL_AUTHENTICATE_REQ, SASL_AUTHENTICATE_RES, 2),
    37: ("CreatePartitions", CREATE_PARTITIONS_REQ, CREATE_PARTITIONS_RES, 2),
    68: ("ConsumerGroupHeartbeat", CONSUMER_GROUP_HEARTBEAT_REQ, CONSUMER_GROUP_HEARTBEAT_RES, 0),
    69: ("ConsumerGroupDescribe", CONSUMER_GROUP_DESCRIBE_REQ, CONSUMER_GROUP_DESCRIBE_RES, 0),
}
