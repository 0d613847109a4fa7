# zlib's CRC-32 as the chunk header's DataCrc uses it. C-level only: the engine's ``crc32`` is in chunk.pxi,
# and the shells' wire module includes this part too (its Publish path seals chunks).
#
# A buffer of FAST_MIN bytes or more goes through riverbed.engine.datacrc's crc32 (ISA-L's PCLMUL folding,
# from python-isal: one Python call per chunk, far cheaper than zlib's table loop over the chunk); a smaller
# one, or any when python-isal is missing (CRC32_IMPL then says "zlib"), through the system zlib in C. Both
# give the same value. The fast path holds the GIL; zlib's releases it for big buffers.

from riverbed.engine import datacrc as _datacrc

cdef extern from "zlib.h":
    unsigned long z_crc32 "crc32"(unsigned long crc, const unsigned char* buf, unsigned int length) nogil

cdef extern from "Python.h":
    object _crc_view "PyMemoryView_FromMemory"(char* mem, Py_ssize_t size, int flags)
    int _CRC_BUF_READ "PyBUF_READ"

# None without python-isal: then every CRC is zlib's
cdef object _FAST_CRC32 = _datacrc.crc32 if _datacrc.IMPL == "isa-l" else None
cdef size_t _FAST_MIN = _datacrc.FAST_MIN
#: which code computes the big CRCs of this compiled module: "isa-l" or "zlib" (tests/engine/test_crc.py)
CRC32_IMPL = "isa-l" if _FAST_CRC32 is not None else "zlib"


cdef inline uint32_t c_crc32_nogil(uint32_t crc, const unsigned char* p, size_t n) noexcept nogil:
    # zlib takes a uInt length: feed buffers over 4 GiB in 1 GiB steps.
    while n > 0x40000000:
        crc = <uint32_t>z_crc32(crc, p, 0x40000000)
        p += 0x40000000
        n -= 0x40000000
    return <uint32_t>z_crc32(crc, p, <unsigned int>n)


cdef uint32_t c_crc32(uint32_t crc, const unsigned char* p, size_t n) noexcept:
    """The caller holds the GIL and keeps ``p`` alive and unresizable (a held Py_buffer, or an object of
    its own) for the call."""
    if n >= _FAST_MIN and _FAST_CRC32 is not None:
        try:
            return <uint32_t>_FAST_CRC32(_crc_view(<char*>p, <Py_ssize_t>n, _CRC_BUF_READ), crc)
        except BaseException:
            pass        # no memory for the view: zlib needs none, and gives the same value
    if n >= NOGIL_MIN:
        with nogil:
            crc = c_crc32_nogil(crc, p, n)
        return crc
    return c_crc32_nogil(crc, p, n)
