# zlib's CRC-32 as the chunk header's DataCrc uses it. C-level only: the engine's ``crc32`` is in chunk.pxi,
# and the shells' wire module includes this part too (its Publish path seals chunks).

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
