# Arrow column buffers straight from chunks, for the Spark reader (riverbed.spark). The spec, errors and
# docstrings are those of _pycore.chunk_to_arrow; this part only makes the per-record loop C.
#
# Records go into caller-owned bytearrays that are grown in place and handed to pyarrow without a copy,
# so several chunks make one batch and no Python object is made per record.

cdef extern from "Python.h":
    int _ba_resize "PyByteArray_Resize"(PyObject* ba, Py_ssize_t n) except -1
    char* _ba_ptr "PyByteArray_AS_STRING"(PyObject* ba)
    Py_ssize_t _ba_len "PyByteArray_GET_SIZE"(PyObject* ba)
    bint _is_bytearray "PyByteArray_CheckExact"(PyObject* o)
    ctypedef struct PyByteArrayObject:
        Py_ssize_t ob_alloc     # bytes allocated (one more than the most the size can reach in place)


cdef enum:
    AB_OFFSETS = 0
    AB_TIMESTAMPS = 1
    AB_CHUNK_IDS = 2
    AB_VALUE_OFFSETS = 3
    AB_DATA = 4
    AB_COUNT = 5
    ARROW_BINARY_MAX = 0x7FFFFFFF    # an Arrow binary array addresses its data with int32 offsets


cdef struct ABuf:
    PyObject* ba            # borrowed: the caller's tuple keeps it alive
    unsigned char* p        # its storage; refreshed after every resize
    Py_ssize_t start        # length when the call began, restored on an error
    Py_ssize_t n            # bytes filled
    Py_ssize_t cap          # current length of the bytearray (n <= cap)


cdef struct ArrowWalk:
    ABuf b[AB_COUNT]
    int64_t next_offset     # offset of the next record the walk meets
    int64_t first           # records in [first, end) are appended
    int64_t end
    int64_t ts_us
    int64_t chunk_id
    Py_ssize_t appended


cdef inline void st_i64le(unsigned char* p, int64_t v) noexcept nogil:
    cdef uint64_t u = <uint64_t>v
    cdef int i
    for i in range(8):
        p[i] = <unsigned char>(u >> (8 * i))


cdef inline void st_i32le(unsigned char* p, int32_t v) noexcept nogil:
    cdef uint32_t u = <uint32_t>v
    p[0] = <unsigned char>u
    p[1] = <unsigned char>(u >> 8)
    p[2] = <unsigned char>(u >> 16)
    p[3] = <unsigned char>(u >> 24)


cdef int c_abuf_set(ABuf* b, Py_ssize_t size) except -1:
    _ba_resize(b.ba, size)
    b.cap = size
    b.p = <unsigned char*>_ba_ptr(b.ba)
    return 0


cdef inline int c_abuf_reserve(ABuf* b, Py_ssize_t extra) except -1:
    # The size is trimmed to the filled part after every call, which CPython does without giving back the
    # allocation (ob_alloc): grow into that first, for free, and only past it ask for more, geometrically.
    # Asking for twice the *size* instead would realloc on nearly every call, and a realloc of a
    # multi-megabyte buffer that cannot grow in place copies all of it (five buffers grow side by side).
    cdef Py_ssize_t need = b.n + extra
    cdef Py_ssize_t room
    if need > b.cap:
        room = (<PyByteArrayObject*>b.ba).ob_alloc - 1
        if need <= room:
            c_abuf_set(b, room)
        else:
            c_abuf_set(b, need if need > 2 * room else 2 * room)
    return 0


cdef int c_arrow_emit(ArrowWalk* w, const unsigned char* body, Py_ssize_t n) except -1:
    cdef ABuf* d = &w.b[AB_DATA]
    cdef int i
    if n > ARROW_BINARY_MAX - d.n:
        raise OverflowError("Arrow binary data would pass 2**31-1 bytes; start a new batch")
    for i in range(AB_DATA):
        c_abuf_reserve(&w.b[i], 8 if i != AB_VALUE_OFFSETS else 4)
    c_abuf_reserve(d, n)
    st_i64le(w.b[AB_OFFSETS].p + w.b[AB_OFFSETS].n, w.next_offset)
    w.b[AB_OFFSETS].n += 8
    st_i64le(w.b[AB_TIMESTAMPS].p + w.b[AB_TIMESTAMPS].n, w.ts_us)
    w.b[AB_TIMESTAMPS].n += 8
    st_i64le(w.b[AB_CHUNK_IDS].p + w.b[AB_CHUNK_IDS].n, w.chunk_id)
    w.b[AB_CHUNK_IDS].n += 8
    memcpy(d.p + d.n, body, n)
    d.n += n
    st_i32le(w.b[AB_VALUE_OFFSETS].p + w.b[AB_VALUE_OFFSETS].n, <int32_t>d.n)
    w.b[AB_VALUE_OFFSETS].n += 4
    w.appended += 1
    return 0


cdef int c_arrow_sub_batch(ArrowWalk* w, int code, const unsigned char* body, Py_ssize_t size,
                           Py_ssize_t count, Py_ssize_t usize) except -1:
    cdef Py_buffer view
    cdef Py_ssize_t records = 0
    # A sub-batch body may itself hold sub-batches (as in _pycore): bound the nesting like chunk.pxi does.
    if Py_EnterRecursiveCall(" while decoding a sub-batch entry"):
        return -1
    try:
        if code == 0:
            c_arrow_entries(w, body, size, count, &records)
        else:
            out = decompress(code, PyBytes_FromStringAndSize(<const char*>body, size), usize)
            c_get_buffer(out, &view)
            try:
                c_arrow_entries(w, <const unsigned char*>view.buf, view.len, count, &records)
            finally:
                PyBuffer_Release(&view)
    finally:
        Py_LeaveRecursiveCall()
    if records != count:
        raise ChunkError(f"entries hold {records} records, header says {count}")
    return 0


cdef int c_arrow_entries(ArrowWalk* w, const unsigned char* p, Py_ssize_t end, Py_ssize_t num_entries,
                         Py_ssize_t* records) except -1:
    cdef Py_ssize_t remaining = num_entries, n, pos = 0, count
    cdef unsigned char first
    records[0] = 0
    while remaining > 0:
        remaining -= 1
        if pos + 1 > end:
            raise ChunkError("data section ends before the last entry")
        first = p[pos]
        if first & 0x80 == 0:
            if pos + SIMPLE_HDR_LEN > end:
                raise ChunkError("truncated simple entry header")
            n = ld_u32(p + pos)
            pos += SIMPLE_HDR_LEN
            if n > end - pos:
                raise ChunkError("simple entry overruns the data section")
            if w.first <= w.next_offset < w.end:
                c_arrow_emit(w, p + pos, n)
            w.next_offset += 1
            records[0] += 1
            pos += n
        else:
            if pos + SUB_HDR_LEN > end:
                raise ChunkError("truncated sub-batch entry header")
            count = ld_u16(p + pos + 1)
            n = ld_u32(p + pos + 7)
            if n > end - pos - SUB_HDR_LEN:
                raise ChunkError("sub-batch entry overruns the data section")
            if w.next_offset + count > w.first and w.next_offset < w.end:
                c_arrow_sub_batch(w, (first >> 4) & 0x7, p + pos + SUB_HDR_LEN, n, count, ld_u32(p + pos + 3))
            else:
                w.next_offset += count
            records[0] += count
            pos += SUB_HDR_LEN + n
    if pos != end:
        raise ChunkError(f"{end - pos} bytes left after {num_entries} entries")
    return 0


def new_arrow_buffers():
    """Empty buffers for :func:`chunk_to_arrow`: ``(offsets, timestamps, chunk_ids, value_offsets, data)``,
    all ``bytearray``, value_offsets holding the leading int32 0 an Arrow binary array starts with."""
    return bytearray(), bytearray(), bytearray(), bytearray(4), bytearray()


cdef int c_check_arrow_out(object out) except -1:
    cdef Py_ssize_t n
    cdef const unsigned char* vo
    if len(out) != 5 or not all(type(b) is bytearray for b in out):
        raise ValueError("out must be the 5 bytearrays of new_arrow_buffers() or a previous chunk_to_arrow call")
    n = len(out[0])
    if (n % 8 or len(out[1]) != n or len(out[2]) != n or len(out[3]) != (n // 8 + 1) * 4
            or ld_i32le(<const unsigned char*>_ba_ptr(<PyObject*>out[3]) + len(out[3]) - 4) != len(out[4])):
        raise ValueError("out buffers disagree on the record count or the data length")
    return 0


def chunk_to_arrow(chunk, first_offset=0, end_offset=None, out=None, verify=True, wire=False):
    """Append the records of one chunk to the buffers of five Arrow columns, in one pass over its entries.
    See _pycore.chunk_to_arrow for the contract: same arguments, results and errors."""
    cdef Py_buffer view
    cdef Header h
    cdef ArrowWalk w
    cdef const unsigned char* p
    cdef Py_ssize_t start, stop, records = 0, hint, i
    cdef uint32_t crc
    cdef int held = 0
    if out is None:
        out = new_arrow_buffers()
    else:
        c_check_arrow_out(out)
    bufs = tuple(out)
    for i in range(AB_COUNT):
        w.b[i].ba = <PyObject*>bufs[i]
        w.b[i].start = w.b[i].n = w.b[i].cap = _ba_len(w.b[i].ba)
        w.b[i].p = <unsigned char*>_ba_ptr(w.b[i].ba)
    w.appended = 0
    try:
        c_get_buffer(chunk, &view)
        held = 1
        p = <const unsigned char*>view.buf
        if wire:
            c_read_header(p, view.len, &h)
            start = HDR_LEN
            if verify:
                if HDR_LEN + <uint64_t>h.data_len != <uint64_t>view.len:
                    raise ChunkError(f"data length {h.data_len} does not add up to the delivered {view.len} bytes")
                crc = c_crc32(0, p + HDR_LEN, h.data_len)
                if crc != h.crc:
                    raise ChunkError(f"data CRC 0x{crc:08x} does not match header CRC 0x{h.crc:08x}")
        else:
            if verify:
                c_check_chunk(p, view.len, &h)
            else:
                c_read_header(p, view.len, &h)
            start = HDR_LEN + h.bloom
        if h.timestamp > 9223372036854775 or h.timestamp < -9223372036854775:
            raise OverflowError(f"chunk timestamp {h.timestamp} ms does not fit in int64 microseconds")
        if h.chunk_id > <uint64_t>0x7FFFFFFFFFFFFFFF:
            raise OverflowError(f"chunk id {h.chunk_id} does not fit in int64")
        # Unverified, the header may claim more than is there: clip like the memoryview slice of _pycore.
        if start > view.len:
            start = view.len
        stop = start + h.data_len
        if stop > view.len:
            stop = view.len
        w.ts_us = h.timestamp * 1000
        w.chunk_id = <int64_t>h.chunk_id
        w.next_offset = w.chunk_id
        w.first = first_offset if first_offset > 0 else 0
        w.end = 0x7FFFFFFFFFFFFFFF if end_offset is None else end_offset
        # Reserve for the records the range can hold, at most the header's count and one per 4 data bytes
        # (a lying header must not make us allocate gigabytes); compressed sub-batches grow on demand.
        hint = h.records
        if hint > (stop - start) // SIMPLE_HDR_LEN:
            hint = (stop - start) // SIMPLE_HDR_LEN
        if w.end > w.chunk_id and w.end - w.chunk_id < hint:
            hint = w.end - w.chunk_id
        if w.first > w.chunk_id:
            hint = hint - (w.first - w.chunk_id) if w.first - w.chunk_id < hint else 0
        if w.end <= w.chunk_id:
            hint = 0
        if hint > 0:
            for i in range(AB_DATA):
                c_abuf_reserve(&w.b[i], hint * (8 if i != AB_VALUE_OFFSETS else 4))
            c_abuf_reserve(&w.b[AB_DATA], stop - start if stop - start < ARROW_BINARY_MAX else ARROW_BINARY_MAX)
        c_arrow_entries(&w, p + start, stop - start, h.entries, &records)
        if records != <Py_ssize_t>h.records:
            raise ChunkError(f"entries hold {records} records, header says {h.records}")
        for i in range(AB_COUNT):
            if w.b[i].cap != w.b[i].n:
                c_abuf_set(&w.b[i], w.b[i].n)
    except BaseException:
        for i in range(AB_COUNT):
            if _ba_len(w.b[i].ba) != w.b[i].start:
                _ba_resize(w.b[i].ba, w.b[i].start)
        raise
    finally:
        if held:
            PyBuffer_Release(&view)
    return bufs[0], bufs[1], bufs[2], bufs[3], bufs[4], w.appended
