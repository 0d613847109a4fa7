"""WebSocket JSON shell: the Streamr broker protocol v28 (``/api/v1/ws``) and its REST data API over
Riverbed's log. The same shape as every shell::

    server.py      WsJsonServer: aiohttp (WebSocket + REST on one port); WsIO, the kernel's io over aiohttp
      -> rest.py     RestApi: the REST data API on the session's auth, publish and read paths, bounded reads
      -> session.py  WsSession (a SessionKernel, one per connection), Fanout (one shared tail per
                     subscribed stream-partition, each broadcast frame encoded once), ResendJob, WsShell
           -> codec.py       v28 frames, MSG arrays, request validation, WebSocket text frames
           -> partitions.py  stream id -> log streams, pkey -> partition (murmur3-32, seed 104729)
      -> riverbed.shells.broker -> riverbed.engine
"""

from riverbed.shells.ws_json.codec import RequestError  # noqa: F401
from riverbed.shells.ws_json.partitions import log_streams, partition_for_key, pkey_hash  # noqa: F401
from riverbed.shells.ws_json.server import WsJsonServer, serve  # noqa: F401
from riverbed.shells.ws_json.session import Fanout, ResendJob, WsSession, WsShell  # noqa: F401
