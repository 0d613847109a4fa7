cdef extern from "zlib.h":
    unsigned long z_crc32 "crc32"(unsigned long crc, const unsigned char* buf, unsigned int length) nogil


cdef inline uint32_t c_crc32_nogil(uint32_t crc, const unsigned char* p, size_t n) noexcept nogil:
    # zlib takes a uInt length: feed buffers over 4 GiB in 1 GiB steps.
    while n > 0x40000000:
        crc = <uint32_t>z_crc32(crc, p, 0x40000000)
        p += 0x40000000
        n -= 0x40000000
    return <uint32_t>z_crc32(crc, p, <unsigned int>n)


cdef uint32_t c_crc32(uint32_t crc, const unsigned char* p, size_t n) noexcept:
    """The caller must keep ``p`` alive and unresizable (a held Py_buffer) while the GIL is released."""
    if n >= NOGIL_MIN:
        with nogil:
            crc = c_crc32_nogil(crc, p, n)
        return crc
    return c_crc32_nogil(crc, p, n)


def crc32(data, value=0):
    """zlib crc32 of ``data`` (any buffer), continuing from ``value``."""
    cdef Py_buffer view
    # zlib.crc32 masks the start value to 32 bits; so do we (and a non-integer raises TypeError).
    cdef uint32_t start = <uint32_t>(<uint64_t>(value & 0xFFFFFFFF))
    cdef uint32_t crc
    c_get_buffer(data, &view)
    try:
        crc = c_crc32(start, <const unsigned char*>view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return crc
