"""ZeroMQ shell: mc0 (MCollective over ZeroMQ), a ROUTER with CURVE, TTL heartbeats and stored topics.

The same shape as every shell::

    server.py    McServer: the pyzmq ROUTER on the asyncio loop, ZAP handler (CURVE allow-list), HWM
      -> session.py   McSession per routing identity (states, COMMANDS, its PeerIO: SENT/BLOCKED/GONE as
                      pause_writing/connection_lost, subscriptions as broker-layer Tails, request order
                      behind PUT commits); McShell: the listener's shared state (PUT batches, TTL timers)
           -> codec.py    frame lists <-> requests and replies, stored records <-> MESSAGE, pure
    keys.py      Z85 key files, the allow-list directory, ``riverbed zmq-keygen``

Every topic is the stream of the same name (created on the first PUT); a PUT is stored as an AMQP 1.0
message (application/octet-stream, headers as application properties, one data section per body frame)
before it is fanned out.
"""

from riverbed.shells.zmq_mc0.codec import (  # noqa: F401
    Request, RequestError, encode_error, encode_message, encode_ok, parse_request, put_record, record_message,
)
from riverbed.shells.zmq_mc0.server import DEFAULT_PORT, McServer, serve  # noqa: F401
from riverbed.shells.zmq_mc0.session import BLOCKED, GONE, SENT, McClient, McSession, McShell, PeerIO  # noqa: F401
