"""Constants of the RabbitMQ Stream protocol (FACTS.md 003 and Appendix A) and of this shell's limits."""

from riverbed.shells.broker.session import State

# ======================================================================================== constants

CMD_DECLARE_PUBLISHER = 0x01
CMD_PUBLISH = 0x02
CMD_PUBLISH_CONFIRM = 0x03
CMD_PUBLISH_ERROR = 0x04
CMD_QUERY_PUBLISHER_SEQUENCE = 0x05
CMD_DELETE_PUBLISHER = 0x06
CMD_SUBSCRIBE = 0x07
CMD_DELIVER = 0x08
CMD_CREDIT = 0x09
CMD_STORE_OFFSET = 0x0A
CMD_QUERY_OFFSET = 0x0B
CMD_UNSUBSCRIBE = 0x0C
CMD_CREATE = 0x0D
CMD_DELETE = 0x0E
CMD_METADATA = 0x0F
CMD_METADATA_UPDATE = 0x10
CMD_PEER_PROPERTIES = 0x11
CMD_SASL_HANDSHAKE = 0x12
CMD_SASL_AUTHENTICATE = 0x13
CMD_TUNE = 0x14
CMD_OPEN = 0x15
CMD_CLOSE = 0x16
CMD_HEARTBEAT = 0x17
CMD_ROUTE = 0x18
CMD_PARTITIONS = 0x19
CMD_CONSUMER_UPDATE = 0x1A
CMD_EXCHANGE_COMMAND_VERSIONS = 0x1B
CMD_STREAM_STATS = 0x1C
CMD_CREATE_SUPER_STREAM = 0x1D
CMD_DELETE_SUPER_STREAM = 0x1E
CMD_RESOLVE_OFFSET_SPEC = 0x1F
RESPONSE = 0x8000  # bit 15 of the key marks a response

RC_OK = 0x01
RC_STREAM_DOES_NOT_EXIST = 0x02
RC_SUBSCRIPTION_ID_ALREADY_EXISTS = 0x03
RC_SUBSCRIPTION_ID_DOES_NOT_EXIST = 0x04
RC_STREAM_ALREADY_EXISTS = 0x05
RC_STREAM_NOT_AVAILABLE = 0x06
RC_SASL_MECHANISM_NOT_SUPPORTED = 0x07
RC_AUTHENTICATION_FAILURE = 0x08
RC_SASL_ERROR = 0x09
RC_SASL_CHALLENGE = 0x0A
RC_SASL_AUTHENTICATION_FAILURE_LOOPBACK = 0x0B
RC_VIRTUAL_HOST_ACCESS_FAILURE = 0x0C
RC_UNKNOWN_FRAME = 0x0D
RC_FRAME_TOO_LARGE = 0x0E
RC_INTERNAL_ERROR = 0x0F
RC_ACCESS_REFUSED = 0x10
RC_PRECONDITION_FAILED = 0x11
RC_PUBLISHER_DOES_NOT_EXIST = 0x12
RC_NO_OFFSET = 0x13
RC_SASL_CANNOT_CHANGE_MECHANISM = 0x14
RC_SASL_CANNOT_CHANGE_USERNAME = 0x15

OFFSET_TYPE_NONE = 0       # only in a ConsumerUpdate answer: "keep the Subscribe offset spec"
OFFSET_TYPE_FIRST = 1
OFFSET_TYPE_LAST = 2
OFFSET_TYPE_NEXT = 3
OFFSET_TYPE_OFFSET = 4
OFFSET_TYPE_TIMESTAMP = 5

LEN_SIZE = 4                       # the uint32 frame size prefix
LEN_KEY_VERSION = 4                # uint16 key + uint16 version
LEN_DELIVER_PREFIX_V1 = 9          # size, key, version, subscription id
LEN_DELIVER_PREFIX_V2 = 17         # ... + committed chunk id u64
LEN_PUBLISH_HEAD = 9               # key, version, publisher id u8, count i32 (offsets into a frame payload)

INITIAL_FRAME_MAX = 8192           # bytes accepted per frame until Open succeeds (RabbitMQ 2026-07)
DEFAULT_FRAME_MAX = 1048576        # advertised in Tune, bytes
DEFAULT_HEARTBEAT = 60             # advertised in Tune, seconds
# The Publish frame cap after Open (rstream's send_batch does not split batches by frame_max, RabbitMQ
# stores them anyway), the sub-batch limits and the per-connection pending bytes are named limits:
# riverbed.shells.broker.limits.Limits (max_frame_size, max_decompressed_size, max_pending_bytes, ...).
MAX_REFERENCE = 255                # bytes of UTF-8 in a publisher/consumer reference (the engine's limit;
                                   # the protocol says 256 characters)
DEFAULT_HANDSHAKE_TIMEOUT = 10.0   # seconds from accept to a successful Open
AUTH_FAILURE_DELAY = 3.0           # seconds a refused SaslAuthenticate (0x08) or Open (0x0c) is held before
                                   # it is sent and the socket closed (RabbitMQ >= 4.1: SILENT_CLOSE_DELAY)
SAC_STEP_DOWN_TIMEOUT = 5.0        # seconds a consumer told to step down may take to answer; then the group
                                   # moves on without it (rstream 0.20 leaves some step-downs unanswered)

# Publish flow control: a connection is not read while max_pending_bytes (limits.py) of its appends are
# not yet committed, nor while this many of its engine operations are in flight (a flood of StoreOffset
# has no replies to throttle it).
PENDING_OPS_HIGH = 10000
PENDING_OPS_LOW = 2500

# Chunks one pump of one subscription may send before yielding to other connections.
DELIVER_BUDGET = 32

# rabbit_stream_utils:command_versions/0, in RabbitMQ's order: rstream indexes the reply by key - 1.
SERVER_COMMAND_VERSIONS = (
    (CMD_DECLARE_PUBLISHER, 1, 1), (CMD_PUBLISH, 1, 2), (CMD_QUERY_PUBLISHER_SEQUENCE, 1, 1),
    (CMD_DELETE_PUBLISHER, 1, 1), (CMD_SUBSCRIBE, 1, 1), (CMD_CREDIT, 1, 1), (CMD_STORE_OFFSET, 1, 1),
    (CMD_QUERY_OFFSET, 1, 1), (CMD_UNSUBSCRIBE, 1, 1), (CMD_CREATE, 1, 1), (CMD_DELETE, 1, 1),
    (CMD_METADATA, 1, 1), (CMD_CLOSE, 1, 1), (CMD_HEARTBEAT, 1, 1), (CMD_ROUTE, 1, 1),
    (CMD_PARTITIONS, 1, 1), (CMD_STREAM_STATS, 1, 1), (CMD_CREATE_SUPER_STREAM, 1, 1),
    (CMD_DELETE_SUPER_STREAM, 1, 1), (CMD_RESOLVE_OFFSET_SPEC, 1, 1),
)

PRODUCT = "Riverbed"
# The RabbitMQ release whose stream protocol this shell implements, reported as the server property
# ``version``: clients gate features on it (rabbitmq-stream-js-client turns off filtering and refuses
# super stream commands below 3.13.0). 4.3 is the first release with every command of the table above
# (ResolveOffsetSpec, key 0x1f); its command list and response codes are exactly these.
RABBITMQ_VERSION = "4.3.0"

# session states: the kernel's (riverbed.shells.broker.session.State), by their RabbitMQ roles
ST_HANDSHAKE = State.HANDSHAKE  # connected: PeerProperties, SASL
ST_TUNING = State.AUTH          # authenticated, Tune sent: waiting for the Tune echo and Open
ST_OPEN = State.OPEN
ST_CLOSING = State.CLOSING      # a refusal is held (tarpit), or the server sent Close
ST_CLOSED = State.CLOSED

SAC_NONE = 0        # not a single-active consumer
SAC_WAITING = 1     # in a group, not active
SAC_ACTIVATING = 2  # ConsumerUpdate(active) sent, waiting for the client's answer
SAC_ACTIVE = 3
SAC_STEPPING_DOWN = 4   # ConsumerUpdate(inactive) sent (super stream rebalance), waiting for the answer
