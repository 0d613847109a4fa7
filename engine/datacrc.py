"""The chunk data CRC (a chunk header's DataCrc: zlib's CRC-32, format.py) through the fastest code at hand.

ISA-L's ``crc32_gzip_refl`` (python-isal, a dependency in pyproject.toml) folds with carry-less multiplies
(PCLMULQDQ) and takes a 1 MiB buffer about 7.5 times faster than the system zlib's table-driven loop here
(2,977 against 397 MiB/s at load 11; 68 instructions against 608 for a Kafka record's 158 stored bytes);
both give the same value for every input and start value (tests/engine/test_crc.py). Without python-isal
the CRC falls back to zlib's and :data:`IMPL` says so: the test suite then fails (``test_fast_crc_in_use``)
rather than let a build lose the fast path silently, as it does for a missing compiled core.

The compiled core and the shells' wire module take the function from here (``crc.pxi``) for buffers of at
least :data:`FAST_MIN` bytes; below that a Python call costs more than the bytes, and they call zlib in C.

Thread-safe; ``crc32`` holds the GIL while it runs (python-isal does not release it).
"""

import zlib

try:
    from isal.isal_zlib import crc32 as _isal_crc32
except ImportError:  # pragma: no cover - exercised only on an install without python-isal
    _isal_crc32 = None

#: "isa-l" when python-isal computes the CRC, else "zlib"
IMPL = "isa-l" if _isal_crc32 is not None else "zlib"

#: crc32(data, value=0): zlib's CRC-32 of ``data`` (any contiguous buffer) continuing from ``value``
crc32 = _isal_crc32 if _isal_crc32 is not None else zlib.crc32

#: bytes from which the compiled modules call :data:`crc32` rather than zlib in C (measured: a call
#: costs about what zlib takes for this many bytes)
FAST_MIN = 512
