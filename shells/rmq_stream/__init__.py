"""RabbitMQ Stream protocol shell: the wire protocol of RabbitMQ streams (keys 1-31) over Riverbed's log.

The same shape as every shell::

    server.py   RmqStreamServer (broker-layer TcpListener: asyncio transport glue, lifecycle)
      -> session.py + publish.py + consume.py   RmqStreamSession, a sans-I/O state machine per connection
           -> codec.py, constants.py            frames in and out, pure functions
      -> shell.py   RmqShell: settings and single-active-consumer groups shared by a listener's sessions
           -> riverbed.shells.broker   the protocol-neutral broker layer -> riverbed.engine

Deliver writes the stored chunk bytes straight from the engine (48-byte header + data; the bloom filter
is skipped), one ``writelines([prefix, chunk])`` per chunk. See ``session.py`` for the behaviour where the
protocol leaves a choice.
"""

from riverbed.shells.rmq_stream.codec import (  # noqa: F401
    DecodeError, PublishBatch, Reader, check_sub_batch, decode_offset_spec, decode_publish, deliver_parts,
    enc_properties, enc_string, enc_strings, encode_close, encode_command_versions, encode_consumer_update,
    encode_credit_response, encode_deliver_prefix, encode_heartbeat, encode_metadata_response,
    encode_metadata_update, encode_publish_confirm, encode_publish_error, encode_stream_stats, encode_tune, frame,
    response, response_code_for,
)
from riverbed.shells.rmq_stream.constants import *  # noqa: F401,F403
from riverbed.shells.rmq_stream.consume import filter_values  # noqa: F401
from riverbed.shells.rmq_stream.server import RmqStreamServer, serve  # noqa: F401
from riverbed.shells.rmq_stream.session import COMMANDS, RmqStreamSession  # noqa: F401
from riverbed.shells.rmq_stream.shell import RmqShell, SacGroups  # noqa: F401
