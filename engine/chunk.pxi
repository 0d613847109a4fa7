# Chunk header readers, data-section encoders and decoders, and the public crc32. Layouts:
# riverbed.engine.format; the header struct and its writer are header.pxi.

def crc32(data, value=0):
    """zlib crc32 of ``data`` (any buffer), continuing from ``value`` (big buffers through ISA-L: crc.pxi)."""
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


cdef int c_read_header(const unsigned char* p, Py_ssize_t n, Header* h) except -1:
    if n < HDR_LEN:
        raise ChunkError(f"{n} bytes is shorter than the 48-byte chunk header")
    h.magic = p[0]
    h.ctype = p[1]
    h.entries = ld_u16(p + 2)
    h.records = ld_u32(p + 4)
    h.timestamp = <int64_t>ld_u64(p + 8)
    h.epoch = ld_u64(p + 16)
    h.chunk_id = ld_u64(p + 24)
    h.crc = ld_u32(p + 32)
    h.data_len = ld_u32(p + 36)
    h.trailer_len = ld_u32(p + 40)
    h.bloom = p[44]
    if h.magic != MAGIC:
        raise ChunkError(f"bad magic/version byte 0x{h.magic:02x} (expected 0x50)")
    return 0


cdef int c_check_chunk(const unsigned char* p, Py_ssize_t n, Header* h) except -1:
    cdef uint32_t crc
    c_read_header(p, n, h)
    if h.bloom and h.bloom < BLOOM_MIN:
        raise ChunkError(f"bloom size {h.bloom} is neither 0 nor 16..255")
    if <uint64_t>HDR_LEN + h.bloom + h.data_len + h.trailer_len != <uint64_t>n:
        raise ChunkError(f"lengths (bloom {h.bloom}, data {h.data_len}, trailer {h.trailer_len}) do not add up "
                         f"to the stored {n} bytes")
    crc = c_crc32(0, p + HDR_LEN + h.bloom, h.data_len)
    if crc != h.crc:
        raise ChunkError(f"data CRC 0x{crc:08x} does not match header CRC 0x{h.crc:08x}")
    return 0


cdef tuple c_header_tuple(const Header* h):
    return (h.magic, h.ctype, h.entries, h.records, h.timestamp, h.epoch, h.chunk_id, h.crc, h.data_len,
            h.trailer_len, h.bloom)


def read_header(buf):
    """Parse the 48-byte header into an 11-tuple (see format.H_*). Checks magic and size only."""
    cdef Py_buffer view
    cdef Header h
    c_get_buffer(buf, &view)
    try:
        c_read_header(<const unsigned char*>view.buf, view.len, &h)
    finally:
        PyBuffer_Release(&view)
    return c_header_tuple(&h)


def check_chunk(buf):
    """Header tuple of a complete chunk after checking lengths and the data CRC. Raises ChunkError."""
    cdef Py_buffer view
    cdef Header h
    c_get_buffer(buf, &view)
    try:
        c_check_chunk(<const unsigned char*>view.buf, view.len, &h)
    finally:
        PyBuffer_Release(&view)
    return c_header_tuple(&h)


# ---- header fields from Python ------------------------------------------------------------------------

cdef int c_uint_field(object v, uint64_t maxv, str name, uint64_t* out) except -1:
    # struct.pack semantics: any __index__ object, struct.error when it does not fit the field.
    if not PyIndex_Check(v):
        raise StructError(f"chunk header {name}: required argument is not an integer")
    v = PyNumber_Index(v)
    if v < 0 or v > maxv:
        raise StructError(f"chunk header {name} {v} is out of range 0..{maxv}")
    out[0] = <uint64_t>v
    return 0


cdef int c_int64_field(object v, str name, int64_t* out) except -1:
    if not PyIndex_Check(v):
        raise StructError(f"chunk header {name}: required argument is not an integer")
    v = PyNumber_Index(v)
    if v < -0x8000000000000000 or v > 0x7FFFFFFFFFFFFFFF:
        raise StructError(f"chunk header {name} {v} is out of the int64 range")
    out[0] = <int64_t>v
    return 0


cdef int c_len_field(Py_ssize_t n, uint64_t maxv, str name) except -1:
    if <uint64_t>n > maxv:
        raise StructError(f"chunk header {name} {n} is out of range 0..{maxv}")
    return 0


# ---- records -> simple entries ------------------------------------------------------------------------

cdef struct Span:
    const unsigned char* p
    Py_ssize_t n


cdef struct Records:
    # A pinned view of a sequence of records: pointers are valid until c_records_close. Bytes records are
    # pinned by the tuple that holds them, other exporters by a held Py_buffer (which also blocks resizes).
    Py_ssize_t count
    Py_ssize_t total        # size of the simple-entry run
    Span* spans
    Py_buffer* views
    Py_ssize_t nviews


cdef inline void c_records_init(Records* r) noexcept:
    r.count = 0
    r.total = 0
    r.spans = NULL
    r.views = NULL
    r.nviews = 0


cdef void c_records_close(Records* r) noexcept:
    cdef Py_ssize_t i
    for i in range(r.nviews):
        PyBuffer_Release(&r.views[i])
    PyMem_Free(r.views)
    PyMem_Free(r.spans)
    c_records_init(r)


cdef int c_records_open(tuple recs, Records* r) except -1:
    cdef Py_ssize_t i, n, count = len(recs)
    cdef const unsigned char* p
    cdef PyObject* item
    cdef Py_buffer* view
    r.spans = <Span*>PyMem_Malloc((count if count else 1) * sizeof(Span))
    if r.spans == NULL:
        raise MemoryError()
    for i in range(count):
        item = PyTuple_GET_ITEM(recs, i)
        if _is_bytes(item):
            p = <const unsigned char*>_bytes_ptr(item)
            n = _bytes_len(item)
        else:
            if r.views == NULL:
                r.views = <Py_buffer*>PyMem_Malloc(count * sizeof(Py_buffer))
                if r.views == NULL:
                    raise MemoryError()
            view = &r.views[r.nviews]
            c_get_buffer(<object>item, view)
            r.nviews += 1
            p = <const unsigned char*>view.buf
            n = view.len
        if n > MAX_ENTRY:
            raise ValueError(f"record of {n} bytes is over the 2 GiB entry limit")
        r.spans[i].p = p
        r.spans[i].n = n
        r.total += SIMPLE_HDR_LEN + n
        r.count = i + 1
    return 0


cdef void c_records_write(const Records* r, unsigned char* out) noexcept nogil:
    cdef Py_ssize_t i, n
    for i in range(r.count):
        n = r.spans[i].n
        st_u32(out, <uint32_t>n)
        memcpy(out + SIMPLE_HDR_LEN, r.spans[i].p, n)
        out += SIMPLE_HDR_LEN + n


cdef void c_seal_chunk(unsigned char* out, Header* h, Py_ssize_t data_at) noexcept:
    # the data CRC (right after the copy, so the data is still in cache), then the header; with the GIL
    # held, as c_crc32's fast path needs it
    h.crc = c_crc32(0, out + data_at, h.data_len)
    c_put_header(out, h)


cdef bytes c_encode_entries(tuple recs):
    cdef Records r
    cdef bytes result
    cdef unsigned char* out
    c_records_init(&r)
    try:
        c_records_open(recs, &r)
        result = c_new_bytes(r.total)
        out = <unsigned char*>PyBytes_AS_STRING(result)
        if r.total >= NOGIL_MIN:
            with nogil:
                c_records_write(&r, out)
        else:
            c_records_write(&r, out)
    finally:
        c_records_close(&r)
    return result


def encode_entries(records):
    """Data section of simple entries, one per record (a sequence of bytes-like objects)."""
    return c_encode_entries(tuple(records))


def encode_sub_batch(records, compression=COMPRESSION_NONE, compress=None):
    """One sub-batch entry holding ``records``. ``compress`` turns the simple-entry run into the body
    for a compression code other than none."""
    cdef Records r
    cdef Py_buffer bv
    cdef Py_ssize_t count = len(records)
    cdef int code = PyNumber_Index(compression) if compression != COMPRESSION_NONE else 0
    cdef bytes result
    cdef unsigned char* out
    if not 0 <= code <= 7:
        # _pycore lets 8..15 through (the code bits wrap into the flag byte); a 3-bit field cannot hold them.
        raise ValueError(f"compression code {code} out of range 0..7")
    recs = tuple(records)
    if code == 0:
        # Uncompressed: the body is the simple-entry run itself, written straight after the header.
        c_records_init(&r)
        try:
            c_records_open(recs, &r)
            if count > 0xFFFF:
                raise ValueError("a sub-batch holds at most 65535 records")
            c_len_field(r.total, 0xFFFFFFFF, "sub-batch length")
            result = c_new_bytes(SUB_HDR_LEN + r.total)
            out = <unsigned char*>PyBytes_AS_STRING(result)
            out[0] = 0x80
            st_u16(out + 1, <uint16_t>count)
            st_u32(out + 3, <uint32_t>r.total)
            st_u32(out + 7, <uint32_t>r.total)
            c_records_write(&r, out + SUB_HDR_LEN)
        finally:
            c_records_close(&r)
        return result
    inner = c_encode_entries(recs)
    body = compress(inner)
    if count > 0xFFFF:
        raise ValueError("a sub-batch holds at most 65535 records")
    c_len_field(len(inner), 0xFFFFFFFF, "sub-batch uncompressed length")
    c_get_buffer(body, &bv)
    try:
        c_len_field(bv.len, 0xFFFFFFFF, "sub-batch length")
        result = c_new_bytes(SUB_HDR_LEN + bv.len)
        out = <unsigned char*>PyBytes_AS_STRING(result)
        out[0] = <unsigned char>(0x80 | (code << 4))
        st_u16(out + 1, <uint16_t>count)
        st_u32(out + 3, <uint32_t>len(inner))
        st_u32(out + 7, <uint32_t>bv.len)
        memcpy(out + SUB_HDR_LEN, bv.buf, bv.len)
    finally:
        PyBuffer_Release(&bv)
    return result


# ---- chunks -------------------------------------------------------------------------------------------

cdef void c_fill_chunk_nogil(unsigned char* out, const Py_buffer* bloom, const Py_buffer* data,
                             const Py_buffer* trailer) noexcept nogil:
    cdef unsigned char* q = out + HDR_LEN
    memcpy(q, bloom.buf, bloom.len)
    q += bloom.len
    memcpy(q, data.buf, data.len)
    q += data.len
    memcpy(q, trailer.buf, trailer.len)


def build_chunk(data, num_entries, num_records, timestamp, chunk_id, epoch=0, chunk_type=CHUNK_USER,
                bloom=b"", trailer=b""):
    """Header + bloom + data + trailer as one ``bytes``; computes the data CRC."""
    cdef Py_buffer dv, bv, tv
    cdef Header h
    cdef uint64_t x = 0
    cdef Py_ssize_t total
    cdef bytes result
    cdef unsigned char* out
    cdef int held = 0
    try:
        c_get_buffer(data, &dv)
        held = 1
        c_get_buffer(bloom, &bv)
        held = 2
        c_get_buffer(trailer, &tv)
        held = 3
        # Same order as the struct fields, so the first bad one is the one _pycore reports.
        h.magic = MAGIC
        c_uint_field(chunk_type, 0xFF, "chunk type", &x)
        h.ctype = <uint8_t>x
        c_uint_field(num_entries, 0xFFFF, "entry count", &x)
        h.entries = <uint16_t>x
        c_uint_field(num_records, 0xFFFFFFFF, "record count", &x)
        h.records = <uint32_t>x
        c_int64_field(timestamp, "timestamp", &h.timestamp)
        c_uint_field(epoch, 0xFFFFFFFFFFFFFFFF, "epoch", &h.epoch)
        c_uint_field(chunk_id, 0xFFFFFFFFFFFFFFFF, "chunk id", &h.chunk_id)
        c_len_field(dv.len, 0xFFFFFFFF, "data length")
        c_len_field(tv.len, 0xFFFFFFFF, "trailer length")
        c_len_field(bv.len, 0xFF, "bloom size")
        h.data_len = <uint32_t>dv.len
        h.trailer_len = <uint32_t>tv.len
        h.bloom = <uint8_t>bv.len
        total = HDR_LEN + bv.len + dv.len + tv.len
        result = c_new_bytes(total)
        out = <unsigned char*>PyBytes_AS_STRING(result)
        if total >= NOGIL_MIN:
            with nogil:
                c_fill_chunk_nogil(out, &bv, &dv, &tv)
        else:
            c_fill_chunk_nogil(out, &bv, &dv, &tv)
        c_seal_chunk(out, &h, HDR_LEN + bv.len)
    finally:
        if held >= 3:
            PyBuffer_Release(&tv)
        if held >= 2:
            PyBuffer_Release(&bv)
        if held >= 1:
            PyBuffer_Release(&dv)
    return result


cdef object c_encode_chunk(records, chunk_id, timestamp, epoch, bint writable):
    cdef Records r
    cdef Header h
    cdef Py_ssize_t count = len(records)
    cdef object result
    cdef unsigned char* out
    recs = tuple(records)
    c_records_init(&r)
    try:
        c_records_open(recs, &r)
        h.magic = MAGIC
        h.ctype = 0
        c_len_field(count, 0xFFFF, "entry count")
        h.entries = <uint16_t>count
        h.records = <uint32_t>count
        c_int64_field(timestamp, "timestamp", &h.timestamp)
        c_uint_field(epoch, 0xFFFFFFFFFFFFFFFF, "epoch", &h.epoch)
        c_uint_field(chunk_id, 0xFFFFFFFFFFFFFFFF, "chunk id", &h.chunk_id)
        c_len_field(r.total, 0xFFFFFFFF, "data length")
        h.data_len = <uint32_t>r.total
        h.trailer_len = 0
        h.bloom = 0
        if writable:
            result = PyByteArray_FromStringAndSize(NULL, HDR_LEN + r.total)
            out = <unsigned char*>PyByteArray_AS_STRING(result)
        else:
            result = c_new_bytes(HDR_LEN + r.total)
            out = <unsigned char*>PyBytes_AS_STRING(result)
        if r.total >= NOGIL_MIN:
            with nogil:
                c_records_write(&r, out + HDR_LEN)
        else:
            c_records_write(&r, out + HDR_LEN)
        c_seal_chunk(out, &h, HDR_LEN)
    finally:
        c_records_close(&r)
    return result


def encode_chunk(records, chunk_id, timestamp, epoch=0):
    """A user chunk of simple entries, one per record."""
    return c_encode_chunk(records, chunk_id, timestamp, epoch, False)


def encode_chunk_buffer(records):
    """A user chunk of ``records`` (at most 65535) as a ``bytearray``, CRC computed, chunk id and timestamp
    0: the writer stamps those two in place (seal_chunk), so the record bytes are copied only once."""
    return c_encode_chunk(records, 0, 0, 0, True)


# ---- data section -> records --------------------------------------------------------------------------

cdef struct Out:
    # The result list: the first ``cap`` slots were preallocated (PyList_New) and are filled in place; any
    # record past them is appended. Slots [n, cap) are NULL until filled, so such a list never escapes
    # unless n >= cap, and it is kept out of the GC's reach (gc.get_objects from a codec callback) until
    # it is complete.
    PyObject* lst
    Py_ssize_t n
    Py_ssize_t cap


cdef inline int c_emit(Out* o, const unsigned char* p, Py_ssize_t n) except -1:
    cdef PyObject* rec = _bytes_new(<const char*>p, n)
    cdef int rc
    if rec == NULL:
        return -1
    if o.n < o.cap:
        _list_set(o.lst, o.n, rec)     # steals the reference
    else:
        rc = _list_append(o.lst, rec)
        _decref(rec)
        if rc < 0:
            return -1
    o.n += 1
    return 0


cdef int c_decode_sub_batch(int code, const unsigned char* body, Py_ssize_t size, Py_ssize_t count,
                            Py_ssize_t usize, Out* o) except -1:
    cdef Py_buffer view
    cdef Py_ssize_t before = o.n
    # A sub-batch body is decoded like a data section, so it may itself hold sub-batches (as in _pycore);
    # this turns unbounded nesting into RecursionError instead of a C stack overflow.
    if Py_EnterRecursiveCall(" while decoding a sub-batch entry"):
        return -1
    try:
        if code == 0:
            # decompress(0, body) is bytes(body) with no size check: decode in place, skip the copy.
            c_decode_entries(body, size, count, None, o)
        else:
            out = decompress(code, PyBytes_FromStringAndSize(<const char*>body, size), usize)
            c_get_buffer(out, &view)
            try:
                c_decode_entries(<const unsigned char*>view.buf, view.len, count, None, o)
            finally:
                PyBuffer_Release(&view)
    finally:
        Py_LeaveRecursiveCall()
    if o.n - before != count:
        raise ChunkError(f"entries hold {o.n - before} records, header says {count}")
    return 0


cdef int c_decode_entries(const unsigned char* p, Py_ssize_t end, Py_ssize_t num_entries, object shown_entries,
                          Out* o) except -1:
    cdef Py_ssize_t remaining = num_entries, n, pos = 0
    cdef unsigned char first
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
            c_emit(o, p + pos, n)
            pos += n
        else:
            if pos + SUB_HDR_LEN > end:
                raise ChunkError("truncated sub-batch entry header")
            n = ld_u32(p + pos + 7)
            if n > end - pos - SUB_HDR_LEN:
                raise ChunkError("sub-batch entry overruns the data section")
            c_decode_sub_batch((first >> 4) & 0x7, p + pos + SUB_HDR_LEN, n, ld_u16(p + pos + 1),
                               ld_u32(p + pos + 3), o)
            pos += SUB_HDR_LEN + n
    if pos != end:
        raise ChunkError(f"{end - pos} bytes left after "
                         f"{num_entries if shown_entries is None else shown_entries} entries")
    return 0


cdef list c_data_records(const unsigned char* p, Py_ssize_t end, Py_ssize_t num_entries, object shown_entries,
                         Py_ssize_t cap, Py_ssize_t* produced):
    # cap: slots to preallocate, at most the expected count. Every record of an uncompressed section takes
    # at least 4 bytes, so end // 4 bounds it whatever the header claims; compressed sub-batches may
    # append past it. Returns None when fewer than cap records came out (a count mismatch by then).
    cdef Out o
    if cap > end // SIMPLE_HDR_LEN:
        cap = end // SIMPLE_HDR_LEN
    if cap < 0:
        cap = 0
    out = PyList_New(cap)
    o.lst = <PyObject*>out
    o.n = 0
    o.cap = cap
    PyObject_GC_UnTrack(o.lst)
    c_decode_entries(p, end, num_entries, shown_entries, &o)
    produced[0] = o.n
    if o.n < cap:
        return None
    if not PyObject_GC_IsTracked(o.lst):
        PyObject_GC_Track(o.lst)
    return out


def data_records(data, num_entries, num_records):
    """All records of a data section as a list of ``bytes``; sub-batches are decompressed and expanded.

    Raises ChunkError when the entries overrun the section or the counts disagree with the header, and
    UnsupportedCompression for a codec that is not registered.
    """
    cdef Py_buffer view
    cdef Py_ssize_t end, ne, produced = 0, cap = 0
    cdef list out
    ne_obj = PyNumber_Index(num_entries)     # range() semantics
    c_get_buffer(data, &view)
    try:
        end = view.len
        # Every entry takes at least 4 bytes, so past end + 1 entries the walk has already failed with
        # "ends before the last entry": clamping keeps huge counts out of C integers and changes nothing.
        ne = 0 if ne_obj < 0 else (end + 1 if ne_obj > end + 1 else ne_obj)
        if type(num_records) is int and num_records > 0:
            cap = num_records if num_records <= end else end
        out = c_data_records(<const unsigned char*>view.buf, end, ne, num_entries, cap, &produced)
    finally:
        PyBuffer_Release(&view)
    if out is None or produced != num_records:
        raise ChunkError(f"entries hold {produced} records, header says {num_records}")
    return out


def scan_entries(data):
    """Walk a data section without decoding bodies: ``(ends, counts)``, the end offset of each entry in
    ``data`` and the number of records it holds (1 for a simple entry, NumRecords for a sub-batch).
    Raises ChunkError when an entry overruns the section."""
    cdef Py_buffer view
    cdef const unsigned char* p
    cdef Py_ssize_t end, pos = 0
    cdef uint32_t count
    ends = []
    counts = []
    c_get_buffer(data, &view)
    try:
        p = <const unsigned char*>view.buf
        end = view.len
        while pos < end:
            if p[pos] & 0x80 == 0:
                if pos + SIMPLE_HDR_LEN > end:
                    raise ChunkError("truncated simple entry header")
                pos += SIMPLE_HDR_LEN + <Py_ssize_t>ld_u32(p + pos)
                count = 1
            else:
                if pos + SUB_HDR_LEN > end:
                    raise ChunkError("truncated sub-batch entry header")
                count = ld_u16(p + pos + 1)
                pos += SUB_HDR_LEN + <Py_ssize_t>ld_u32(p + pos + 7)
            if pos > end:
                raise ChunkError("entry overruns the data section")
            ends.append(pos)
            counts.append(count)
    finally:
        PyBuffer_Release(&view)
    return ends, counts


def walk_simple_entries(data, Py_ssize_t pos, Py_ssize_t max_count):
    """Count the simple entries of ``data`` from ``pos`` without copying or allocating per entry, for a
    sub-batch body validated piece by piece as it is decompressed. Stops after ``max_count`` entries.

    Returns ``(count, pos)``: ``pos`` is where the walk stopped, past the end of ``data`` when the last
    entry's body runs on (the caller skips that much of the next piece), or within the last 3 bytes when
    an entry header is cut by the end of ``data``. Raises ChunkError on a sub-batch entry (a sub-batch
    holds simple entries only). ``max_count`` < 0 raises ValueError."""
    cdef Py_buffer view
    cdef const unsigned char* p
    cdef Py_ssize_t end, count = 0
    if max_count < 0 or pos < 0:
        raise ValueError("max_count and pos must be >= 0")
    c_get_buffer(data, &view)
    try:
        p = <const unsigned char*>view.buf
        end = view.len
        while count < max_count and pos + SIMPLE_HDR_LEN <= end:
            if p[pos] & 0x80:
                raise ChunkError("a sub-batch entry inside a sub-batch")
            pos += SIMPLE_HDR_LEN + <Py_ssize_t>ld_u32(p + pos)
            count += 1
        if count < max_count and pos < end and p[pos] & 0x80:
            raise ChunkError("a sub-batch entry inside a sub-batch")
    finally:
        PyBuffer_Release(&view)
    return count, pos


def cut_entries(data, max_bytes, max_entries, max_records):
    """Where to cut a data section into chunks: a list of ``(end, entries, records)``, one per piece, each
    piece ending at ``end`` (an offset in ``data``) and holding at most ``max_bytes`` bytes, ``max_entries``
    entries and ``max_records`` records, except that an entry over a limit by itself is a piece of its
    own. Raises ChunkError when an entry overruns the section."""
    cdef Py_buffer view
    cdef const unsigned char* p
    cdef Py_ssize_t end, pos = 0, start = 0, nxt
    cdef uint32_t count
    cdef int64_t entries = 0, records = 0
    cdef int64_t lim_b = max_bytes, lim_e = max_entries, lim_r = max_records
    cuts = []
    c_get_buffer(data, &view)
    try:
        p = <const unsigned char*>view.buf
        end = view.len
        while pos < end:
            if p[pos] & 0x80 == 0:
                if pos + SIMPLE_HDR_LEN > end:
                    raise ChunkError("truncated simple entry header")
                nxt = pos + SIMPLE_HDR_LEN + <Py_ssize_t>ld_u32(p + pos)
                count = 1
            else:
                if pos + SUB_HDR_LEN > end:
                    raise ChunkError("truncated sub-batch entry header")
                count = ld_u16(p + pos + 1)
                nxt = pos + SUB_HDR_LEN + <Py_ssize_t>ld_u32(p + pos + 7)
            if nxt > end:
                raise ChunkError("entry overruns the data section")
            if entries and (nxt - start > lim_b or entries + 1 > lim_e or records + count > lim_r):
                cuts.append((pos, entries, records))
                start = pos
                entries = 0
                records = 0
            entries += 1
            records += count
            pos = nxt
        if entries:
            cuts.append((pos, entries, records))
    finally:
        PyBuffer_Release(&view)
    return cuts


def chunk_records(buf, verify=True):
    """Records of a whole stored chunk, checking the CRC first unless ``verify`` is false."""
    cdef Py_buffer view
    cdef Header h
    cdef const unsigned char* p
    cdef Py_ssize_t start, stop, produced = 0
    cdef list out
    c_get_buffer(buf, &view)
    try:
        p = <const unsigned char*>view.buf
        if verify:
            c_check_chunk(p, view.len, &h)
        else:
            c_read_header(p, view.len, &h)
        # Unverified, the header may claim more than is there: clip like the memoryview slice of _pycore.
        start = HDR_LEN + h.bloom
        if start > view.len:
            start = view.len
        stop = start + h.data_len
        if stop > view.len:
            stop = view.len
        out = c_data_records(p + start, stop - start, h.entries, None, h.records, &produced)
    finally:
        PyBuffer_Release(&view)
    if out is None or produced != <Py_ssize_t>h.records:
        raise ChunkError(f"entries hold {produced} records, header says {h.records}")
    return out


STAMP_RANGE = "a chunk's chunk id, timestamp or epoch is outside its field's range"


def stamp_chunk(chunk, chunk_id, timestamp, epoch, crc):
    """Ready a sealed chunk for storing at ``chunk_id``, in place (the one-message commit's byte work).

    ``chunk`` is a ``bytearray`` of a 48-byte header and the data after it (no bloom, no trailer: a
    Publish frame's chunk, wire.publish_chunk). With ``crc`` true its data CRC (of every byte after the
    header) is computed into the header first; then ``timestamp`` (ms, i64), ``epoch`` and ``chunk_id``
    (u64) are stamped. Returns None. Raises TypeError when ``chunk`` is not a bytearray, struct.error for
    a value outside its field's range, ChunkError when ``chunk`` is shorter than the header (nothing is
    changed then)."""
    cdef uint64_t c_id, c_epoch
    cdef int64_t c_ts
    cdef Py_ssize_t n
    cdef unsigned char* p
    if type(chunk) is not bytearray:
        raise TypeError(f"a chunk to stamp must be a bytearray, not {type(chunk).__name__}")
    try:
        c_id = chunk_id
        c_ts = timestamp
        c_epoch = epoch
    except OverflowError:
        raise StructError(STAMP_RANGE) from None
    n = PyByteArray_GET_SIZE(chunk)
    if n < HDR_LEN:
        raise ChunkError(f"{n} bytes is shorter than the 48-byte chunk header")
    p = <unsigned char*>PyByteArray_AS_STRING(chunk)
    if crc:
        # nobody else holds the chunk (the engine's from here on): its buffer stays put during the CRC
        st_u32(p + 32, c_crc32(0, p + HDR_LEN, <size_t>(n - HDR_LEN)))
    st_u64(p + 8, <uint64_t>c_ts)
    st_u64(p + 16, c_epoch)
    st_u64(p + 24, c_id)
