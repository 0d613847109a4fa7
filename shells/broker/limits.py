"""The named limits of the broker: one home for every bound on what a client may make the server do,
checked before the work is done (DESIGN.md, "Limits").

Three things live here:

* :class:`Limits`, a frozen dataclass of every limit with its default. ``riverbed serve`` builds one
  from its settings (:meth:`Limits.from_config`; each field is a flag / config key of the same name in
  :mod:`riverbed.shells.config`) and installs it with :func:`configure`; shells read the one in force
  with :func:`current` (or ``broker.limits``) when a connection or listener starts.
* :func:`reject`, the one way to count a refusal: it increments
  ``riverbed_rejected_total{listener,reason}`` (read by ``GET /metrics``) and logs one line, rate
  limited per (listener, reason) so a client that loops on a refused request cannot flood the log.
  The caller still answers in its protocol's own terms (a response code, an error frame, a close).
* :class:`InflightBudget`, the broker-wide memory budget: the bytes every connection has read and
  handed on but not yet seen committed, summed. Sessions :meth:`~InflightBudget.acquire` what they hand
  to the engine and :meth:`~InflightBudget.release` it on completion; past the budget they stop reading
  their transport (back-pressure through TCP) and are resumed, in turn, once usage is back under the
  low mark.

Everything here runs on the event loop's thread (no locks), like the rest of the broker layer.
"""

import dataclasses
import logging
import time
from dataclasses import dataclass

log = logging.getLogger("riverbed.limits")

# reason labels of riverbed_rejected_total (short, stable: dashboards and alerts key on them)
REASON_FRAME_SIZE = "frame_size"                  # a frame/message/body over its size limit
REASON_DECOMPRESSED_SIZE = "decompressed_size"    # a sub-batch that inflates past its limit
REASON_DECOMPRESSION_RATIO = "decompression_ratio"  # a sub-batch declaring more than ratio x its body
REASON_ENTRIES = "entries"                        # more entries in a frame / sub-batch than allowed
REASON_STRING_LENGTH = "string_length"            # a protocol string / line over its limit
REASON_PARTS = "parts"                            # a ZeroMQ message with too many parts
REASON_PENDING_BYTES = "pending_bytes"            # a connection over its pending-bytes bound (dropped)
REASON_DEPTH = "depth"                            # a value nested deeper than max_depth

LOG_INTERVAL = 10.0     # seconds between two log lines of one (listener, reason)

_MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Every named limit, with its default. Sizes in bytes. Immutable: build a new one with
    :func:`dataclasses.replace` to change a value.

    Each field is also a setting of ``riverbed serve`` (flag ``--max-frame-size``, environment
    ``RIVERBED_MAX_FRAME_SIZE``, TOML key ``max_frame_size``, ...); the README's "Limits" table lists
    what each refuses and what the client sees.
    """

    max_frame_size: int = 64 * _MIB
    """RabbitMQ Stream: largest Publish frame after Open (other commands: the negotiated frame_max)."""
    max_decompressed_size: int = 64 * _MIB
    """RabbitMQ Stream: largest declared uncompressed size of one sub-batch entry (RabbitMQ's
    ``max_uncompressed_sub_entry_batch_size``); decompression stops there whatever the header says."""
    max_decompression_ratio: int = 200
    """RabbitMQ Stream: a compressed sub-batch may declare at most this many times its compressed size
    (sub-batches that declare up to 1 MiB are never refused for their ratio)."""
    max_entries_per_frame: int = 65536
    """RabbitMQ Stream: messages of one Publish frame (its count field, checked before any is read)."""
    max_pending_bytes: int = 32 * _MIB
    """Per connection: bytes handed to the engine and not yet committed before its reading pauses."""
    max_inflight_bytes: int = 256 * _MIB
    """Broker-wide: the sum of every connection's uncommitted bytes before publishers are paused."""
    bson_max_frame: int = 16 * _MIB
    """BSON/TCP: largest frame (its declared length is checked before the body is buffered)."""
    zmq_max_message: int = 16 * _MIB
    """ZeroMQ: largest message part (libzmq ``ZMQ_MAXMSGSIZE``: an over-size peer is disconnected)."""
    zmq_max_parts: int = 64
    """ZeroMQ: parts of one multipart message."""
    http_max_body: int = 16 * _MIB
    """HTTP and the WebSocket listener's REST API: largest request body (aiohttp ``client_max_size``)."""
    ream_max_line: int = 64 * 1024
    """REAM text: longest request line (the declared payload size is ``ream_max_payload``)."""
    ream_max_payload: int = 4 * _MIB
    """REAM text: largest payload a request may declare (checked before the payload is buffered)."""
    ws_max_frame: int = 1 * _MIB
    """WebSocket JSON: largest client message (aiohttp ``max_msg_size``; over it: close 1009)."""

    RATIO_FLOOR = 1 * _MIB
    """Declared sizes up to this are never refused for their ratio: the work they cost is trivial."""

    @classmethod
    def from_config(cls, cfg):
        """A Limits from a resolved :class:`~riverbed.shells.config.Config` (or any mapping-like object
        with the field names); fields it lacks keep their defaults."""
        values = {}
        for f in dataclasses.fields(cls):
            try:
                v = cfg[f.name]
            except (KeyError, TypeError, AttributeError):
                continue
            if v is not None:
                values[f.name] = v
        return cls(**values)

    def sub_batch_cap(self, compressed_size):
        """Largest uncompressed size a sub-batch of ``compressed_size`` body bytes may declare: the
        ratio cap (never below :attr:`RATIO_FLOOR`), at most :attr:`max_decompressed_size`."""
        return min(self.max_decompressed_size, max(self.RATIO_FLOOR, compressed_size * self.max_decompression_ratio))


DEFAULT = Limits()
_current = DEFAULT


def current():
    """The :class:`Limits` in force (the defaults until :func:`configure`)."""
    return _current


def configure(limits):
    """Install ``limits`` as the ones in force for the process. Returns it. Call at start-up."""
    global _current
    _current = limits
    return limits


# ---------------------------------------------------------------------------------------- rejections

_rejected = {}          # (listener, reason) -> count
_last_log = {}          # (listener, reason) -> clock of its last log line
_suppressed = {}        # (listener, reason) -> refusals not logged since that line


LOG_DETAIL_MAX = 200       # characters of a refusal's detail that reach the log


def reject(listener, reason, detail="", peer=None, clock=time.monotonic):
    """Count one refusal by a limit: ``riverbed_rejected_total{listener,reason}`` goes up by one, and a
    warning is logged unless one of the same (listener, reason) was logged in the last
    :data:`LOG_INTERVAL` seconds (the next line then says how many were not logged).

    ``listener`` is the protocol's one name (:mod:`riverbed.shells.protocols`: ``stream``, ``bson``,
    ``zmq``, ``ws``, ``ream``, ``kafka``, ``http``); ``reason`` a ``REASON_*`` label; ``detail`` and ``peer`` go into the log line
    only. The caller answers the client itself. Loop thread (or any one thread); never raises."""
    key = (listener, reason)
    _rejected[key] = _rejected.get(key, 0) + 1
    now = clock()
    detail = str(detail)
    if len(detail) > LOG_DETAIL_MAX:
        # the detail may quote hostile input (a 10 MB topic name): the log gets its head only
        detail = f"{detail[:LOG_DETAIL_MAX]}... ({len(detail)} characters)"
    last = _last_log.get(key)
    if last is not None and now - last < LOG_INTERVAL:
        _suppressed[key] = _suppressed.get(key, 0) + 1
        return
    _last_log[key] = now
    more = _suppressed.pop(key, 0)
    log.warning("%s%s: refused (%s)%s%s", listener, f" {peer}" if peer else "", reason,
                f": {detail}" if detail else "", f" [{more} more since the last line]" if more else "")


def rejected():
    """``{(listener, reason): count}``: every refusal counted since the process started (a copy)."""
    return dict(_rejected)


def rejected_count(listener=None, reason=None):
    """Refusals counted, summed over those matching ``listener`` and ``reason`` (None = any)."""
    return sum(n for (li, re), n in _rejected.items()
               if (listener is None or li == listener) and (reason is None or re == reason))


# ------------------------------------------------------------------------------------ in-flight budget

class InflightBudget:
    """The broker-wide bound on bytes read from clients and not yet committed (``max_inflight_bytes``).

    A session calls :meth:`acquire` with the bytes it hands to the engine and :meth:`release` with them
    once the append completed (committed or failed). When :meth:`over` is true it stops reading its
    transport and calls :meth:`wait` with a callback; the callbacks run, oldest first, once usage falls
    to the low mark (half the budget), so paused publishers resume without a thundering herd of reads
    at the brink. A session that closes while waiting simply never gets called back (:meth:`cancel`).

    Nothing is refused here: an append already read is never dropped (a confirm means stored), so usage
    may pass the budget by what the connections had already read — at most one frame each.
    Loop thread only.
    """

    __slots__ = ("limit", "low", "used", "peak", "_waiters", "paused_total")

    def __init__(self, limit):
        self.limit = limit
        self.low = limit // 2
        self.used = 0
        self.peak = 0
        self.paused_total = 0           # times a publisher was paused by the budget (metrics)
        self._waiters = {}              # key -> callback, in insertion order

    def acquire(self, n):
        self.used += n
        if self.used > self.peak:
            self.peak = self.used

    def release(self, n):
        self.used -= n
        if self._waiters and self.used <= self.low:
            self._wake()

    def over(self):
        """True while usage is past the budget: a publisher should stop reading."""
        return self.used > self.limit

    def wait(self, key, callback):
        """Run ``callback()`` once usage is back at the low mark (at once if it already is). ``key``
        identifies the waiter (one entry per key: waiting twice keeps the first callback)."""
        if key in self._waiters:
            return
        self.paused_total += 1
        self._waiters[key] = callback
        if self.used <= self.low:
            self._wake()

    def cancel(self, key):
        self._waiters.pop(key, None)

    def waiting(self):
        return len(self._waiters)

    def _wake(self):
        waiters, self._waiters = self._waiters, {}
        for cb in waiters.values():
            try:
                cb()
            except Exception:  # one broken session must not keep the others paused
                log.exception("in-flight budget: a resume callback failed")
