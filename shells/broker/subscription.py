"""The one subscription: what every protocol's subscription keeps and does, over a :class:`Tail`.

A protocol subscription (RabbitMQ Stream's Subscribe, a BSON SUBSCRIBE, a REAM EVENT SUBSCRIBE, a ZeroMQ
SUB) is one connection's reader of one stream. They share their state and bookkeeping, which live here:

* ``session`` (the :class:`~riverbed.shells.broker.session.SessionKernel` it belongs to), ``stream``,
  ``start`` (the offset its next tail starts from: a subscription whose stream does not exist yet, or
  was deleted, waits with no tail), ``tail`` (its :class:`Tail` while it reads, else None) and
  ``closed`` (ended for good: unsubscribed or its connection gone);
* :meth:`open_tail` builds the tail with the session's ``defer`` and the protocol's delivery callback and
  flow control (credit or window, records or chunks: see tail.py);
* :meth:`begin` starts delivery, paused when the session's transport is full at that moment (the
  kernel's ``pause_writing``/``resume_writing`` reach every tail through ``session._tails()``);
* :meth:`stop_tail` drops the tail but keeps the subscription (it waits for its stream);
  :meth:`close` ends it.

What a protocol adds stays in its package, as a subclass: its identifiers (a subscription id, a topic),
its rendering (the callback it gives :meth:`open_tail`), its own flow state (RabbitMQ's single active
consumer, ZeroMQ's held batch). Loop-thread only, like the session.
"""

import sys

from riverbed.shells.broker.tail import Tail


class Subscription:
    """One connection's subscription to ``stream``; see the module docstring. ``start`` is the offset
    the next tail reads from (0 = the stream's first)."""

    __slots__ = ("session", "stream", "start", "tail", "closed")

    def __init__(self, session, stream, start=0):
        self.session = session
        # the engine interns stream names: one string per stream however many subscribe (issue 26)
        self.stream = sys.intern(stream) if type(stream) is str else stream
        self.start = start
        self.tail = None
        self.closed = False

    def open_tail(self, on_chunk, *, offset=None, on_gone=None, defer=None, **tail_options):
        """Make this subscription's :class:`Tail` (replacing none: call :meth:`stop_tail` first) from
        ``offset`` (default :attr:`start`), delivering to ``on_chunk``; ``on_gone(exc)`` when its stream is
        deleted or a chunk is corrupt; ``defer`` defaults to the session's ``io.defer``; the other keyword
        arguments are :class:`Tail`'s (mode, credit, window, records). Nothing is delivered before
        :meth:`begin`. Returns the tail."""
        self.tail = Tail(self.session.broker, self.stream, self.start if offset is None else offset, on_chunk,
                         defer=self.session.io.defer if defer is None else defer, on_gone=on_gone, **tail_options)
        return self.tail

    def begin(self, offset=None, *, deliver=True):
        """Start delivering (from ``offset`` when given). A tail that starts while the session's transport
        is over its high mark starts paused; ``resume_writing`` resumes it with the others. With
        ``deliver=False`` only the pause is applied (the protocol starts the tail itself later, e.g.
        after its reply to the request has gone out)."""
        tail = self.tail
        if self.session._write_paused:
            tail.pause()
        if deliver:
            tail.start(offset)

    def stop_tail(self):
        """Close and forget the tail; the subscription itself stays (waiting for its stream)."""
        tail, self.tail = self.tail, None
        if tail is not None:
            tail.close()

    def close(self):
        """End the subscription for good (idempotent)."""
        self.closed = True
        self.stop_tail()
