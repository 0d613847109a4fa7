"""BSON/TCP shell: mewbase's event-sourcing protocol (BSON frames over TCP) over Riverbed's log and
document store.

    server.py   BsonServer (broker-layer TcpListener) and serve()
      -> session.py    BsonSession, a sans-I/O state machine per connection (framing, CONNECT, PUB,
                       transactions, subscriptions); admin.py: binder, channel and query frames
           -> queries.py     subscriptions (RECEV under a byte window) and queries (QUERYRESULT)
           -> codec.py       frames in and out, pure functions and constants
      -> shell.py      BsonShell: settings, channel creation, the document store, projections
           -> projections.py  server-side projections, exactly once
    client.py   an asyncio client for this protocol (BsonClient)
"""

from riverbed.shells.bson_tcp.codec import *  # noqa: F401,F403
from riverbed.shells.bson_tcp.projections import PROJECTIONS_COLLECTION, Projections  # noqa: F401
from riverbed.shells.bson_tcp.server import BsonServer, serve  # noqa: F401
from riverbed.shells.bson_tcp.session import BsonSession  # noqa: F401
from riverbed.shells.bson_tcp.shell import BsonShell  # noqa: F401
