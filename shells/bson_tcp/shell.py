"""What the BSON/TCP connections of one listener share: settings, the document store, channel creation
on first use (so that concurrent PUBs to a new channel create it once and append in order), and the
projections."""

import logging
from concurrent.futures import ThreadPoolExecutor

from riverbed.shells.bson_tcp.projections import Projections

log = logging.getLogger("riverbed.bson")

DEFAULT_IDLE_TIMEOUT = 60.0     # seconds without a frame from the client before the connection is closed


class BsonShell:
    """Shared state of a BSON/TCP listener over ``broker``. Loop-thread only."""

    def __init__(self, broker, *, idle_timeout=DEFAULT_IDLE_TIMEOUT):
        self.broker = broker
        self.idle_timeout = idle_timeout
        self.docs = broker.docs
        self.projections = Projections(broker, self.docs)
        self._readers = None

    def read_async(self, fn):
        """Run ``fn()`` (a document-store read) on a reader thread; a concurrent Future of its result
        (hand it to ``broker.then``)."""
        if self._readers is None:
            self._readers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="bson-query")
        return self._readers.submit(fn)

    def start(self):
        """The listener is bound: run the stored projections (on a cluster, where and while the document
        changelog says)."""
        self.projections.follow_cluster()

    def close(self):
        """The listener stopped (after its drain): stop the projections and the reader threads."""
        self.projections.stop_all()
        if self._readers is not None:
            self._readers.shutdown(wait=False, cancel_futures=True)

    def channel_pending(self, name):
        """Whether ``name`` is being created (appends to it must queue behind the creation)."""
        return self.broker.creating(name)

    def ensure_channel(self, name, cb):
        """``cb(exc)`` once channel ``name`` exists (created now if needed; exc None) or cannot be
        created. Callbacks for one channel run in the order they were registered."""
        self.broker.ensure_stream(name, cb)
