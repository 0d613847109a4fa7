# RabbitMQ Stream Publish v1 -> a sealed Osiris chunk, in one pass (the broker's hot path).
#
# A Publish v1 message is ``PublishingId u64 | entry`` where the entry is already an Osiris data entry
# (simple or sub-batch), so the chunk's data section is the message area minus the 8-byte ids. Doing the
# walk here keeps the per-message cost to one bounds check and one memcpy: the Python decoder it replaces
# made an int, a memoryview and a tuple per message, and the garbage collector then walked them.

cdef enum:
    PUB_HEAD = 9          # key u16 | version u16 | publisher id u8 | count i32
    PUB_ID = 8            # PublishingId u64 before each entry
    PUB_MIN_MSG = 12      # id + the shortest entry (a simple entry's u32 length)
    PUB_SUB_HEAD = 19     # id + sub-batch header (flags u8, records u16, uncompressed u32, size u32)


cdef tuple c_publish_chunk(const unsigned char* p, Py_ssize_t end, bint crc):
    cdef int64_t count
    cdef Py_ssize_t pos = PUB_HEAD, e, n, data_len, q = 0, i
    cdef uint64_t pid, prev = 0, first = 0
    cdef uint64_t records = 0
    cdef bint increasing = True
    cdef unsigned char* out
    cdef unsigned char* idp
    cdef Header h
    if end < PUB_HEAD:
        raise FrameError("Publish frame too short")
    count = <int32_t>ld_u32(p + 5)
    # Every message takes at least 12 bytes: a count that cannot fit is refused before any allocation.
    if count < 0 or count * PUB_MIN_MSG > end - PUB_HEAD:
        raise FrameError(f"Publish message count {count} does not fit the frame")
    data_len = end - PUB_HEAD - PUB_ID * count
    if data_len > 0xFFFFFFFF:
        raise FrameError(f"Publish frame of {end} bytes is over the 4 GiB chunk data limit")
    chunk = PyByteArray_FromStringAndSize(NULL, HDR_LEN + data_len)
    ids = c_new_bytes(PUB_ID * count)
    out = <unsigned char*>PyByteArray_AS_STRING(chunk) + HDR_LEN
    idp = <unsigned char*>PyBytes_AS_STRING(ids)
    subs = []
    for i in range(count):
        if end - pos < PUB_MIN_MSG:
            raise FrameError("Publish frame ends inside a message")
        pid = ld_u64(p + pos)
        memcpy(idp + PUB_ID * i, p + pos, PUB_ID)
        if i == 0:
            first = pid
        elif pid <= prev:
            increasing = False
        prev = pid
        n = ld_u32(p + pos + PUB_ID)
        if n < 0x80000000:
            e = pos + PUB_MIN_MSG + n
            records += 1
        else:
            if end - pos < PUB_SUB_HEAD:
                raise FrameError("Publish frame ends inside a message")
            e = pos + PUB_SUB_HEAD + <Py_ssize_t>ld_u32(p + pos + 15)
            records += ld_u16(p + pos + 9)
            subs.append((i, p[pos + 8], ld_u16(p + pos + 9), ld_u32(p + pos + 11), pos + PUB_SUB_HEAD, e))
        # The messages after this one need 12 bytes each: demanding that room now keeps the copy inside
        # the data section sized from the count. A frame failing it would fail with this same message
        # later in the walk (some later message could not fit), so the twins still agree.
        if e > end - PUB_MIN_MSG * (count - 1 - i):
            raise FrameError("Publish frame ends inside a message")
        memcpy(out + q, p + pos + PUB_ID, e - pos - PUB_ID)
        q += e - pos - PUB_ID
        pos = e
    if pos != end:
        raise FrameError(f"{end - pos} bytes left over after {count} messages")
    h.magic = MAGIC
    h.ctype = 0
    # NumEntries is a u16: a bigger batch is not a sealable chunk, and 0 in both counts says so.
    h.entries = <uint16_t>count if count <= 0xFFFF else 0
    h.records = <uint32_t>records if count <= 0xFFFF else 0
    h.timestamp = 0
    h.epoch = 0
    h.chunk_id = 0
    h.data_len = <uint32_t>data_len
    h.trailer_len = 0
    h.bloom = 0
    # No one else holds the new bytearray, so its buffer stays put while c_crc32 runs (zlib's fallback
    # releases the GIL).
    h.crc = c_crc32(0, out, <size_t>data_len) if crc else 0
    c_put_header(out - HDR_LEN, &h)
    return (p[4], count, chunk, ids, first, prev, increasing, records, subs)


def publish_chunk(payload, crc=True):
    """Turn a RabbitMQ Stream Publish v1 payload (key and version included) into a sealed chunk.

    With ``crc=False`` the header's data CRC is left 0 for the caller to fill in (the engine does it when
    it stores the chunk whole, and skips it when the chunk must be cut into several: no CRC computed twice).

    Returns ``(publisher_id, count, chunk, ids, first_id, last_id, increasing, num_records, sub_batches)``:

    * ``chunk``: a ``bytearray`` laid out as a whole user chunk, as the engine's
      :func:`~riverbed.engine.core.encode_chunk_buffer` makes it: the 48-byte header (magic, NumEntries =
      count, NumRecords, data CRC and length; chunk id, timestamp and epoch 0 for the writer to stamp)
      followed by the data section, each message's entry without its publishing id. With more than 65535 messages NumEntries and NumRecords are left 0 (a u16 cannot
      hold the count): the data section is still right, the header is not a sealable one.
    * ``ids``: the publishing ids as ``bytes``, 8 big-endian bytes each (a PublishConfirm body as is);
      ``first_id`` and ``last_id`` (0 when there are none) and ``increasing``, whether they strictly rise.
    * ``num_records``: records in the entries (a sub-batch counts its declared NumRecords).
    * ``sub_batches``: ``(message index, flags, records, uncompressed size, body start, body end)`` per
      sub-batch entry, positions in ``payload``, for the caller to validate.

    Raises FrameError when the payload does not parse (too short, a count that cannot fit, a message
    running past the end, bytes left over).
    """
    cdef Py_buffer view
    c_get_buffer(payload, &view)
    try:
        return c_publish_chunk(<const unsigned char*>view.buf, view.len, crc)
    finally:
        PyBuffer_Release(&view)


cdef enum:
    KEY_PUBLISH = 0x0002
    KEY_PUBLISH_CONFIRM = 0x0003
    CONFIRM_HEAD = 13     # size u32 | key u16 | version u16 | publisher id u8 | id count i32


def publish_alone(data, max_size, max_entries):
    """The one-message path's parser (issue 26): ``data``, one read from a connection, taken whole when it
    is exactly one RabbitMQ Stream Publish v1 frame (its u32 size first) of at most ``max_size`` bytes
    after the size, with 1..``max_entries`` messages, all plain (no sub-batch entry), that parses.

    Returns ``publish_chunk(payload, crc=False)``'s first eight values with, in the place of the
    sub-batches, ``confirm``: the PublishConfirm frame of every id (size prefix included), the bytes the
    general path's merged confirm of this frame alone would be. Anything else gives None, a malformed
    frame included: the general path then splits, checks and refuses it as usual.
    """
    cdef Py_buffer view
    cdef const unsigned char* p
    cdef Py_ssize_t n
    cdef int64_t count
    cdef int64_t cap = max_size
    cdef int64_t most = max_entries
    cdef unsigned char* c
    cdef tuple got
    c_get_buffer(data, &view)
    try:
        p = <const unsigned char*>view.buf
        n = view.len
        if n < 4 + PUB_HEAD or <int64_t>ld_u32(p) != n - 4 or n - 4 > cap:
            return None
        if ld_u16(p + 4) != KEY_PUBLISH or ld_u16(p + 6) != 1:
            return None
        count = <int32_t>ld_u32(p + 9)
        if count < 1 or count > most:
            return None
        try:
            got = c_publish_chunk(p + 4, n - 4, False)
        except FrameError:
            return None
    finally:
        PyBuffer_Release(&view)
    if got[8]:
        return None
    ids = <bytes>got[3]
    confirm = c_new_bytes(CONFIRM_HEAD + len(ids))
    c = <unsigned char*>PyBytes_AS_STRING(confirm)
    st_u32(c, <uint32_t>(CONFIRM_HEAD - 4 + len(ids)))
    st_u16(c + 4, KEY_PUBLISH_CONFIRM)
    st_u16(c + 6, 1)
    c[8] = <unsigned char>(<int>got[0])
    st_u32(c + 9, <uint32_t>count)
    memcpy(c + CONFIRM_HEAD, PyBytes_AS_STRING(ids), len(ids))
    return got[:8] + (confirm,)
