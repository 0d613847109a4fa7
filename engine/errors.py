"""Exceptions raised by the storage engine. Shells map them onto protocol-level error codes."""


class RiverbedError(Exception):
    """Base class of every error the engine raises on purpose."""


class StreamNotFound(RiverbedError, KeyError):
    """The named stream does not exist (or was deleted)."""

    def __str__(self):  # KeyError would quote the repr
        return Exception.__str__(self)


class StreamExists(RiverbedError):
    """A stream with that name already exists with different arguments."""


class InvalidArgument(RiverbedError, ValueError):
    """A stream argument, offset spec or option has a value the engine cannot use."""


class ChunkError(RiverbedError):
    """Stored or received chunk bytes are not a valid Osiris chunk (bad header, bad lengths, CRC mismatch).

    ``stream`` and ``chunk_id`` name the chunk when the engine knows them; a chunk is never returned as data
    once this has been raised for it.
    """

    def __init__(self, reason, stream=None, chunk_id=None):
        self.reason = reason
        self.stream = stream
        self.chunk_id = chunk_id
        where = ""
        if stream is not None:
            where += f" in stream {stream!r}"
        if chunk_id is not None:
            where += f" at chunk {chunk_id}"
        super().__init__(f"corrupt chunk{where}: {reason}")


class UnsupportedCompression(RiverbedError):
    """A sub-batch entry uses a compression type with no registered codec."""

    def __init__(self, code):
        self.code = code
        super().__init__(f"sub-batch compression type {code} is not supported")


class FrameError(RiverbedError):
    """A length-prefixed frame has an impossible length (negative, too short, or over the cap)."""

    def __init__(self, reason, size=None):
        self.reason = reason
        self.size = size
        super().__init__(reason)


class FrameTooLarge(FrameError):
    """A frame's declared length is over the connection's cap; ``size`` is that length in bytes."""


class EngineClosed(RiverbedError):
    """The engine (writer) was closed; the operation was not carried out."""


class UniqueViolation(RiverbedError):
    """A document store write would give two documents of a collection the same value of a unique field.
    The write is refused whole: nothing of it is kept. ``collection``, ``field``, ``value`` and ``holder``
    (the id of the document that already has the value) say which."""

    def __init__(self, collection, field, value, holder):
        self.collection = collection
        self.field = field
        self.value = value
        self.holder = holder
        super().__init__(f"collection {collection!r}: value {value!r} of unique field {field!r} is already "
                         f"held by document {holder!r}")


class PositionMoved(RiverbedError):
    """A projection step was refused whole because the stream position it continues from is no longer the
    stored one: another runner of the same projection moved it (a cluster moved the projection to another
    node). The runner reads the stored position again and goes on from there."""


class StorageFull(RiverbedError):
    """A write was refused because storage cannot take it: the data directory's filesystem has no space
    for the data file to grow, the data file would pass its cap (``riverbed serve --max-disk``), or the
    broker's disk alarm is on (free space below ``--disk-free-limit``). Nothing of the refused write was
    stored, so the same write may be retried once space returns. ``free`` (bytes free on the filesystem)
    and ``limit`` (the limit or cap that was hit, bytes) are set when known."""

    def __init__(self, message, *, free=None, limit=None):
        self.free = free
        self.limit = limit
        super().__init__(message)
