"""Riverbed's storage engine: Osiris-format chunks in one LMDB environment per data directory.

The engine never imports a protocol shell. Entry point: :class:`Engine`.
"""

from riverbed.engine.errors import (  # noqa: F401
    ChunkError, EngineClosed, FrameError, FrameTooLarge, InvalidArgument, RiverbedError, StreamExists,
    StorageFull, StreamNotFound, UnsupportedCompression,
)
from riverbed.engine.log import (  # noqa: F401
    DEFAULT_FSYNC, FSYNC_POLICIES, AppendResult, Engine, OffsetSpec, PublishingIds, StreamInfo, WriteContext,
    parse_max_age,
)
from riverbed.engine.docstore import CollectionInfo, DocStore, UniqueViolation  # noqa: F401,E402
