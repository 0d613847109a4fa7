"""What the REAM connections of one listener share beyond the broker layer: settings, the document
store operations, stream creation on first publish, and waking subscriptions that wait for a stream.

Loop-thread only.
"""

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from riverbed.shells.ream_text.aggregates import Aggregates
from riverbed.shells.ream_text.codec import DEFAULT_MAX_PAYLOAD
from riverbed.shells.ream_text.projections import Projections

log = logging.getLogger("riverbed.ream")

READ_WORKERS = 2    # threads for offloaded reads on a listener (each its own LMDB read transaction)


def _run_now(fn, cb):
    try:
        res = fn()
    except Exception as e:  # noqa: BLE001 - handed to the caller, who answers the client
        cb(None, e)
        return
    cb(res, None)


class ReamShell:
    """Per-listener REAM state over ``broker``.

    ``keepalive``: seconds of client silence before the server sends PING (None/0 = never).
    ``max_payload``: the largest declared payload size accepted, bytes. ``text_user``: the user every
    connection acts as when the broker has a users file. ``offload(fn, cb)`` runs ``fn()`` off the loop
    thread and ``cb(result, exc)`` on it: with ``read_threads`` on a pool of that many threads (a
    listener's, shut down by :meth:`close`), else ``offload`` if given, else at once (sans-I/O tests).
    """

    def __init__(self, broker, *, keepalive=None, max_payload=DEFAULT_MAX_PAYLOAD, text_user=None, offload=None,
                 read_threads=0):
        self.broker = broker
        self.keepalive = keepalive or None
        self.max_payload = max_payload
        self.text_user = text_user
        self._pool = None
        if read_threads:
            self._pool = ThreadPoolExecutor(read_threads, thread_name_prefix="ream-read")
            offload = self._offload_to_pool
        self.offload = offload or _run_now
        self.docs = broker.docs
        self.aggregates = Aggregates(self.docs, broker.transact)
        self.projections = Projections(self.docs, broker.transact, self.offload)

    def _offload_to_pool(self, fn, cb):
        fut = asyncio.get_running_loop().run_in_executor(self._pool, fn)

        def done(f):
            if f.cancelled():
                cb(None, asyncio.CancelledError())
                return
            exc = f.exception()
            cb(None if exc else f.result(), exc)
        fut.add_done_callback(done)

    def close(self):
        """The listener stopped (after its drain): the read threads go."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    def user_for(self, peer_loopback):
        """The user a new connection acts as, or (None, reason) when it is refused."""
        auth = self.broker.auth
        if auth.open_to_loopback:
            user = auth.implicit_user(peer_loopback)
            return (user, None) if user else (None, "Only loopback clients are served without a users file")
        user = auth.user(self.text_user) if self.text_user else None
        if user is None:
            return None, f"No user {self.text_user!r} in the users file"
        if user.loopback_only and not peer_loopback:
            return None, f"User {self.text_user!r} may only connect from loopback"
        return user, None

    # ------------------------------------------------------------------------------- publishing

    def publish(self, stream, records, cb):
        """Append ``records`` to ``stream`` (created when missing), ``cb(AppendResult, exc)``. Appends of
        one stream are submitted in call order, also across a creation in flight."""
        # subscriptions waiting for a new stream hear of it from the broker (Broker.stream_created)
        self.broker.append_or_create(stream, records, cb)
