# Chunk bloom filter. Bits are numbered from the MSB of byte 0; bit 0 flags "has unfiltered entries".

cdef inline void c_bloom_bits(const unsigned char* v, Py_ssize_t n, uint32_t m, uint32_t* b1,
                              uint32_t* b2) noexcept:
    # m = nbits - 1: values land in [1, nbits - 1] so they never collide with the unfiltered bit.
    b1[0] = c_crc32(SEED_1, v, <size_t>n) % m + 1
    b2[0] = c_crc32(SEED_2, v, <size_t>n) % m + 1


cdef inline bint c_bit(const unsigned char* bloom, uint32_t bit) noexcept nogil:
    return (bloom[bit >> 3] & (0x80 >> (bit & 7))) != 0


def build_bloom(values, has_unfiltered, size):
    """Bloom filter bytes for the filter values of one chunk (``size`` bytes, 16..255), or b"" when there
    are no values."""
    cdef Py_buffer view
    cdef Py_ssize_t nbytes
    cdef uint32_t m, b1 = 0, b2 = 0
    cdef unsigned char* bloom
    cdef bytes result
    if not values:
        return b""
    nbytes = PyNumber_Index(size)
    # bytearray(size) then writing bit 1 is what _pycore does: mirror its errors for sizes it cannot fill.
    if nbytes < 0:
        raise ValueError("negative count")
    if nbytes == 0:
        raise IndexError("bytearray index out of range")
    if nbytes > 0x1FFFFFFF:
        raise OverflowError(f"bloom size {nbytes} is too large")
    result = c_new_bytes(nbytes)
    bloom = <unsigned char*>PyBytes_AS_STRING(result)
    memset(bloom, 0, nbytes)
    m = <uint32_t>(nbytes * 8 - 1)
    if has_unfiltered:
        bloom[0] |= 0x80
    for v in values:
        c_get_buffer(v, &view)
        try:
            c_bloom_bits(<const unsigned char*>view.buf, view.len, m, &b1, &b2)
        finally:
            PyBuffer_Release(&view)
        bloom[b1 >> 3] |= 0x80 >> (b1 & 7)
        bloom[b2 >> 3] |= 0x80 >> (b2 & 7)
    return result


def bloom_match(bloom, values, match_unfiltered):
    """Whether a chunk with this bloom may hold a record a subscriber with ``values`` wants.

    An empty bloom means the chunk has no filter values at all: it matches only ``match_unfiltered``
    subscribers (a subscriber with no values at all never calls this).
    """
    cdef Py_buffer bv, view
    cdef const unsigned char* bits
    cdef uint32_t m, b1 = 0, b2 = 0
    c_get_buffer(bloom, &bv)
    try:
        if bv.len == 0:
            return match_unfiltered
        bits = <const unsigned char*>bv.buf
        if match_unfiltered and bits[0] & 0x80:
            return True
        m = <uint32_t>(bv.len * 8 - 1)
        for v in values:
            c_get_buffer(v, &view)
            try:
                c_bloom_bits(<const unsigned char*>view.buf, view.len, m, &b1, &b2)
            finally:
                PyBuffer_Release(&view)
            if c_bit(bits, b1) and c_bit(bits, b2):
                return True
        return False
    finally:
        PyBuffer_Release(&bv)


def chunk_bloom_match(chunk, values, match_unfiltered):
    """Whether the stored ``chunk`` (header, bloom, data) is a user chunk that may hold a record a
    subscriber with filter ``values`` wants: :func:`bloom_match` on its bloom filter; False for a chunk of
    the log's own (offset tracking). Raises ChunkError for a bad header or a bloom past the end."""
    cdef Py_buffer view
    cdef Header h
    c_get_buffer(chunk, &view)
    try:
        c_read_header(<const unsigned char*>view.buf, view.len, &h)
        if HDR_LEN + <Py_ssize_t>h.bloom > view.len:
            raise ChunkError(f"bloom of {h.bloom} bytes runs past the {view.len}-byte chunk")
    finally:
        PyBuffer_Release(&view)
    if h.ctype != CHUNK_USER:
        return False
    if h.bloom == 0:
        return match_unfiltered
    return bloom_match(memoryview(chunk)[HDR_LEN:HDR_LEN + h.bloom], values, match_unfiltered)
