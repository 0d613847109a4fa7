# Kafka record batches v2 <-> the one record format: the byte loops of the Kafka shell's Produce and Fetch
# paths. _pywire.py holds the reference (kafka_stored, kafka_batch) and its docstrings are the spec.
#
# Both walk each record once with no Python object made per record on the layouts the shells write:
# Produce writes each Kafka record's stored form (the AMQP message records.to_stored makes) straight into
# the chunk's data section; Fetch reads each stored record's sections in place and writes its Kafka record
# straight into the batch. What the fast path does not take is decided by the pure twin, so both give the
# same bytes and the same errors: a whole Produce call (a varint past 64 bits, a timestamp past int64, a
# header name given twice, more than K_MAX_SPANS headers in one record), or one Fetch record (an AMQP
# message laid out otherwise than the shells write it: other sections, long descriptors, application
# property values that are not text or binary, text that is not UTF-8, ...), through ``from_stored``.

import crc32c as _k_crc32c

from riverbed.engine import core as _k_core
from riverbed.shells import _pywire as _k_py

cdef enum:
    K_SLOW = 1                # the fast path does not take this input: the pure twin decides
    K_MAX_SPANS = 16          # headers (and data sections) one record may have on the fast path
    K_BATCH_HEADER = 61
    K_BATCH_OVERHEAD = 12
    K_CRC_START = 21
    K_SIMPLE_HDR = 4        # a chunk's simple entry: u32 BE length (top bit 0), then the record
    K_MA_LEN = 24             # 00 53 72 d1 size u32, count u32, a3 05 "x-key" b0 len u32: before the key
    K_PROPS_LEN = 38          # 00 53 73 c0 33 07, six nulls, a3 18 "application/octet-stream"
    K_PROPS_TS_LEN = 11       # ... 40 40 83 <int64 ms>: creation-time (field 9)

cdef const char* K_XKEY = b"\xa3\x05x-key\xb0"
cdef const char* K_PROPS = (b"\x00\x53\x73\xc0\x21\x07\x40\x40\x40\x40\x40\x40\xa3\x18"
                                     b"application/octet-stream")
# to_stored's properties with a creation time: K_PROPS sized for 10 fields, then 40 40 83 (the int64 follows)
cdef const char* K_PLAIN = (b"\x00\x53\x73\xc0\x2c\x0a\x40\x40\x40\x40\x40\x40\xa3\x18"
                            b"application/octet-stream\x40\x40\x83")
if K_PLAIN[:41] != K_PROPS[:4] + bytes((0x21 + K_PROPS_TS_LEN, 10)) + K_PROPS[6:K_PROPS_LEN] + b"\x40\x40\x83":
    raise ImportError("kafka.pxi: K_PLAIN is not K_PROPS with a creation time")

cdef struct KSpan:
    Py_ssize_t off
    Py_ssize_t len


# ---- varints and UTF-8 -----------------------------------------------------------------------------------

cdef inline int k_zz(const unsigned char* b, Py_ssize_t* pos, Py_ssize_t end, int64_t* out) except -1:
    """A zigzag varint at pos[0]; 0, or K_SLOW when its value needs more than 64 bits (the pure twin's
    ints are unbounded). Raises FrameError with the twin's messages."""
    cdef Py_ssize_t p = pos[0]
    cdef uint64_t byte
    if p < end:                 # one or two bytes: a record's varints but its timestamp's, read without a call
        byte = b[p]
        if byte < 0x80:
            pos[0] = p + 1
            out[0] = <int64_t>((byte >> 1) ^ (0 - (byte & 1)))
            return 0
        if p + 1 < end and b[p + 1] < 0x80:
            byte = (byte & 0x7F) | (<uint64_t>b[p + 1] << 7)
            pos[0] = p + 2
            out[0] = <int64_t>((byte >> 1) ^ (0 - (byte & 1)))
            return 0
    return k_zz_long(b, pos, end, out)


cdef int k_zz_long(const unsigned char* b, Py_ssize_t* pos, Py_ssize_t end, int64_t* out) except -1:
    cdef Py_ssize_t p = pos[0]
    cdef uint64_t result, byte
    cdef int shift = 7
    cdef int wide = 0
    if p >= end:
        raise FrameError("truncated varint")
    byte = b[p]
    if byte < 0x80:
        pos[0] = p + 1
        out[0] = <int64_t>((byte >> 1) ^ (0 - (byte & 1)))
        return 0
    result = byte & 0x7F
    p += 1
    while True:
        if p >= end or shift > 63:
            raise FrameError("bad varint")
        byte = b[p]
        if shift == 63 and (byte & 0x7E):
            wide = K_SLOW
        result |= (byte & 0x7F) << shift
        p += 1
        if byte < 0x80:
            break
        shift += 7
    pos[0] = p
    out[0] = <int64_t>((result >> 1) ^ (0 - (result & 1)))
    return wide


cdef inline Py_ssize_t k_zz_len(int64_t v) noexcept nogil:
    cdef uint64_t u = (<uint64_t>v << 1) ^ <uint64_t>(v >> 63)
    cdef Py_ssize_t n = 1
    while u > 0x7F:
        u >>= 7
        n += 1
    return n


cdef inline unsigned char* k_put_zz(unsigned char* o, int64_t v) noexcept nogil:
    cdef uint64_t u = (<uint64_t>v << 1) ^ <uint64_t>(v >> 63)
    while u > 0x7F:
        o[0] = <unsigned char>((u & 0x7F) | 0x80)
        o += 1
        u >>= 7
    o[0] = <unsigned char>u
    return o + 1


cdef bint k_utf8(const unsigned char* s, Py_ssize_t n) noexcept nogil:
    """Whether ``s`` is UTF-8 as Python's strict decoder takes it (no overlongs, no surrogates, nothing
    past U+10FFFF)."""
    cdef Py_ssize_t i = 0
    cdef unsigned char c, c1
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        if c < 0xC2:
            return False
        if c < 0xE0:
            if i + 1 >= n or (s[i + 1] & 0xC0) != 0x80:
                return False
            i += 2
        elif c < 0xF0:
            if i + 2 >= n:
                return False
            c1 = s[i + 1]
            if (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80:
                return False
            if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 >= 0xA0):
                return False
            i += 3
        elif c < 0xF5:
            if i + 3 >= n:
                return False
            c1 = s[i + 1]
            if (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80 or (s[i + 3] & 0xC0) != 0x80:
                return False
            if (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 >= 0x90):
                return False
            i += 4
        else:
            return False
    return True


cdef inline unsigned char* k_room(bytearray out, Py_ssize_t* used, Py_ssize_t need) except NULL:
    # ``need`` bytes at ``used`` of ``out``, whose size is its capacity until the caller trims it: sized
    # from an estimate first and doubled when short, so no record costs a realloc and a copy of the rest
    cdef Py_ssize_t cap = PyByteArray_GET_SIZE(out)
    cdef Py_ssize_t at = used[0]
    if at + need > cap:
        PyByteArray_Resize(out, max(2 * cap, at + need))
    used[0] = at + need
    return <unsigned char*>PyByteArray_AS_STRING(out) + at


cdef inline Py_ssize_t k_var_head(Py_ssize_t n) noexcept nogil:
    return 2 if n <= 0xFF else 5


cdef inline unsigned char* k_put_var(unsigned char* o, unsigned char small, unsigned char big,
                                     const unsigned char* p, Py_ssize_t n) noexcept nogil:
    if n <= 0xFF:
        o[0] = small
        o[1] = <unsigned char>n
        o += 2
    else:
        o[0] = big
        st_u32(o + 1, <uint32_t>n)
        o += 5
    # memmove, not memcpy: knowing n <= 255 here, gcc inlined the memcpy as ``rep movsb``, slow on AMD for
    # a 100-byte value (over a third of this loop's time; the loop took 1.35-1.9x as long); it does not
    # inline a memmove of unknown length (bench_core.py's test_kafka_stored_5000x100 reports it)
    memmove(o, p, n)
    return o + n


# ---- Produce: Kafka records -> stored records ----------------------------------------------------------

cdef int c_kafka_stored(const unsigned char* b, Py_ssize_t n, int64_t count, int64_t base_ts, bytearray out,
                        Py_ssize_t* used, Py_ssize_t* filled) except -1:
    cdef Py_ssize_t pos = 0, end, kp, vp, size, body, q
    cdef int64_t i, j, length, delta, ts, klen, vlen, nh, hk, hv
    cdef int nhe
    cdef KSpan names[K_MAX_SPANS]
    cdef KSpan vals[K_MAX_SPANS]
    cdef bint text[K_MAX_SPANS]
    cdef unsigned char* o
    for i in range(count):
        if k_zz(b, &pos, n, &length):
            return K_SLOW
        if length < 1 or length > n - pos:
            raise FrameError("record length out of range")
        end = pos + <Py_ssize_t>length
        pos += 1                                  # attributes: unused
        if k_zz(b, &pos, end, &delta) or k_zz(b, &pos, end, &ts):   # ts: the offset delta, unused
            return K_SLOW
        if k_zz(b, &pos, end, &klen):
            return K_SLOW
        kp = -1
        if klen >= 0:
            if klen > end - pos:
                raise FrameError("key past the record")
            kp = pos
            pos += <Py_ssize_t>klen
        if k_zz(b, &pos, end, &vlen):
            return K_SLOW
        vp = -1
        if vlen >= 0:
            if vlen > end - pos:
                raise FrameError("value past the record")
            vp = pos
            pos += <Py_ssize_t>vlen
        else:
            vlen = 0
        if k_zz(b, &pos, end, &nh):
            return K_SLOW
        if nh > K_MAX_SPANS:
            return K_SLOW
        nhe = <int>nh if nh > 0 else 0
        for j in range(nhe):
            if k_zz(b, &pos, end, &hk):
                return K_SLOW
            if hk < 0 or hk > end - pos:
                raise FrameError("bad header key")
            if not k_utf8(b + pos, <Py_ssize_t>hk):
                raise FrameError("header key is not UTF-8")
            names[j].off = pos
            names[j].len = <Py_ssize_t>hk
            pos += <Py_ssize_t>hk
            if k_zz(b, &pos, end, &hv):
                return K_SLOW
            if hv >= 0:
                if hv > end - pos:
                    raise FrameError("header value past the record")
                vals[j].off = pos
                vals[j].len = <Py_ssize_t>hv
                text[j] = k_utf8(b + pos, <Py_ssize_t>hv)
                pos += <Py_ssize_t>hv
            else:
                vals[j].off = pos
                vals[j].len = 0
                text[j] = False                   # a null value is stored as an empty binary
        if pos != end:
            raise FrameError("record length mismatch")
        if (delta > 0 and base_ts > INT64_MAX - delta) or (delta < 0 and base_ts < INT64_MIN - delta):
            return K_SLOW
        ts = base_ts + delta
        # headers become a dict in to_stored: a name given twice is the pure twin's to lay out
        for j in range(1, nhe):
            for q in range(j):
                if names[q].len == names[j].len and memcmp(b + names[q].off, b + names[j].off, names[j].len) == 0:
                    return K_SLOW
        size = K_PROPS_LEN + (K_PROPS_TS_LEN if ts >= 0 else 0) + 3 + k_var_head(vlen) + vlen
        if kp >= 0:
            size += K_MA_LEN + klen
        body = 0
        if nhe:
            for j in range(nhe):
                body += k_var_head(names[j].len) + names[j].len + k_var_head(vals[j].len) + vals[j].len
            size += 3 + (3 if 1 + body <= 0xFF and 2 * nhe <= 0xFF else 9) + body
        o = k_room(out, filled, 4 + size)
        st_u32(o, <uint32_t>size)
        o += 4
        if kp >= 0:
            o[0] = 0x00
            o[1] = 0x53
            o[2] = 0x72
            o[3] = 0xD1
            st_u32(o + 4, <uint32_t>(16 + klen))
            st_u32(o + 8, 2)
            memcpy(o + 12, K_XKEY, 8)
            st_u32(o + 20, <uint32_t>klen)
            memcpy(o + K_MA_LEN, b + kp, <size_t>klen)
            o += K_MA_LEN + klen
        memcpy(o, K_PROPS, K_PROPS_LEN)
        if ts >= 0:
            o[4] = 0x21 + K_PROPS_TS_LEN
            o[5] = 10
            o += K_PROPS_LEN
            o[0] = 0x40
            o[1] = 0x40
            o[2] = 0x83
            st_u64(o + 3, <uint64_t>ts)
            o += K_PROPS_TS_LEN
        else:
            o += K_PROPS_LEN
        if nhe:
            o[0] = 0x00
            o[1] = 0x53
            o[2] = 0x74
            if 1 + body <= 0xFF and 2 * nhe <= 0xFF:
                o[3] = 0xC1
                o[4] = <unsigned char>(1 + body)
                o[5] = <unsigned char>(2 * nhe)
                o += 6
            else:
                o[3] = 0xD1
                st_u32(o + 4, <uint32_t>(4 + body))
                st_u32(o + 8, <uint32_t>(2 * nhe))
                o += 12
            for j in range(nhe):
                o = k_put_var(o, 0xA1, 0xB1, b + names[j].off, names[j].len)
                if text[j]:
                    o = k_put_var(o, 0xA1, 0xB1, b + vals[j].off, vals[j].len)
                else:
                    o = k_put_var(o, 0xA0, 0xB0, b + vals[j].off, vals[j].len)
        o[0] = 0x00
        o[1] = 0x53
        o[2] = 0x75
        k_put_var(o + 3, 0xA0, 0xB0, b + (vp if vp >= 0 else 0), <Py_ssize_t>vlen)
    used[0] = pos
    return 0


def kafka_stored(body, count, base_ts, bytearray out, to_stored):
    """Produce: the first ``count`` records of a batch's records section ``body`` (bytes-like,
    decompressed; timestamps are deltas from ``base_ts``), each stored as ``to_stored(key, value,
    headers, timestamp)`` makes it, appended to bytearray ``out`` as simple entries (u32 BE length,
    then the record). Returns the bytes of ``body`` used. Raises FrameError as the pure twin does;
    ``out`` then holds an unknown part of the records (the caller drops it).

    The stored layout is written here for the records to_stored makes (the Kafka shell's mapping);
    ``to_stored`` itself is called only through the pure twin, for input the fast path hands over."""
    r, used = _k_stored(body, count, base_ts, out)
    if r == K_SLOW:
        return _k_py.kafka_stored(body, count, base_ts, out, to_stored)
    return used


cdef tuple _k_stored(body, int64_t count, int64_t base_ts, bytearray out):
    # (0 or K_SLOW, body bytes used); ``out`` trimmed to what was written (K_SLOW: to what it was)
    cdef Py_buffer view
    cdef Py_ssize_t used = 0, start = PyByteArray_GET_SIZE(out), filled = start
    cdef int r = K_SLOW
    c_get_buffer(body, &view)
    try:
        # a stored record is its Kafka record plus at most about 90 bytes of AMQP framing
        PyByteArray_Resize(out, start + view.len + 96 * max(count, 0))
        r = c_kafka_stored(<const unsigned char*>view.buf, view.len, count, base_ts, out, &used, &filled)
    finally:
        PyBuffer_Release(&view)
        PyByteArray_Resize(out, start if r == K_SLOW else filled)
    return r, used


def kafka_stored_fast(body, count, base_ts, bytearray out):
    """:func:`kafka_stored` without the pure twin: None (``out`` as it was) where the fast path hands
    over. For tests that the common layouts take the fast path."""
    r, used = _k_stored(body, count, base_ts, out)
    return None if r == K_SLOW else used


# ---- Fetch: stored records -> a Kafka record batch -----------------------------------------------------

cdef struct KRec:
    bint has_ts
    int64_t ts
    Py_ssize_t key_off         # -1: no key
    Py_ssize_t key_len
    int nsec
    Py_ssize_t value_len
    int nh
    KSpan sec[K_MAX_SPANS]
    KSpan name[K_MAX_SPANS]
    KSpan val[K_MAX_SPANS]


cdef inline Py_ssize_t k_fixed(unsigned char c) noexcept nogil:
    """Bytes after a fixed-width AMQP format code, or -1 for any other code."""
    if 0x40 <= c <= 0x45:
        return 0
    if 0x50 <= c <= 0x56:
        return 1
    if c == 0x60 or c == 0x61:
        return 2
    if 0x70 <= c <= 0x74:
        return 4
    if 0x80 <= c <= 0x84:
        return 8
    if c == 0x94 or c == 0x98:
        return 16
    return -1


cdef inline bint k_compound(const unsigned char* b, Py_ssize_t pos, Py_ssize_t n, unsigned char small,
                            unsigned char big, Py_ssize_t* first, Py_ssize_t* count, Py_ssize_t* stop) noexcept nogil:
    # a list8/map8 or list32/map32 at ``pos`` (its code): its first element, count and end
    cdef uint32_t size
    if b[pos] == small:
        if pos + 3 > n or b[pos + 1] < 1:
            return False
        first[0] = pos + 3
        count[0] = b[pos + 2]
        stop[0] = pos + 2 + b[pos + 1]
    elif b[pos] == big:
        if pos + 9 > n:
            return False
        size = ld_u32(b + pos + 1)
        if size < 4 or size > n - pos - 5:
            return False
        first[0] = pos + 9
        count[0] = ld_u32(b + pos + 5)
        stop[0] = pos + 5 + size
    else:
        return False
    return stop[0] <= n


cdef inline bint k_string(const unsigned char* b, Py_ssize_t p, Py_ssize_t stop, bint binary, KSpan* s) noexcept nogil:
    # a str8/sym8/str32/sym32 (or, with ``binary``, also vbin8/vbin32) at ``p``; UTF-8 checked for text
    cdef unsigned char c = b[p]
    cdef bint is_text = c == 0xA1 or c == 0xA3 or c == 0xB1 or c == 0xB3
    if not is_text and not (binary and (c == 0xA0 or c == 0xB0)):
        return False
    if c & 0xF0 == 0xA0:
        if p + 2 > stop:
            return False
        s.len = b[p + 1]
        s.off = p + 2
    else:
        if p + 5 > stop:
            return False
        s.len = ld_u32(b + p + 1)
        s.off = p + 5
    if s.len > stop - s.off:
        return False
    return not is_text or k_utf8(b + s.off, s.len)


cdef bint k_parse_stored(const unsigned char* b, Py_ssize_t n, KRec* r) noexcept nogil:
    """A stored record as from_stored reads it, for the layouts the shells write; False hands it over."""
    cdef Py_ssize_t pos = 0, first, count, stop, p, w, i, q
    cdef uint32_t klen
    cdef unsigned char c
    cdef int pkey = -1
    r.has_ts = False
    r.key_off = -1
    r.key_len = 0
    r.nsec = 0
    r.value_len = 0
    r.nh = 0
    if n == 0 or b[0] != 0x00:                # not an AMQP message: a raw payload, whole
        r.nsec = 1
        r.sec[0].off = 0
        r.sec[0].len = n
        r.value_len = n
        return True
    if n >= 3 and b[1] == 0x53 and b[2] == 0x72:          # message annotations: only to_stored's x-key map
        if n < K_MA_LEN or b[3] != 0xD1 or ld_u32(b + 8) != 2 or memcmp(b + 12, K_XKEY, 8) != 0:
            return False
        klen = ld_u32(b + 20)
        if klen > n - K_MA_LEN or ld_u32(b + 4) != 16 + klen:
            return False
        r.key_off = K_MA_LEN
        r.key_len = klen
        pos = K_MA_LEN + klen
    if (pos + K_PROPS_LEN <= n and b[pos + 4] == 0x21 + K_PROPS_TS_LEN and b[pos + 5] == 10
            and pos + K_PROPS_LEN + K_PROPS_TS_LEN <= n and memcmp(b + pos, K_PROPS, 4) == 0
            and memcmp(b + pos + 6, K_PROPS + 6, K_PROPS_LEN - 6) == 0
            and b[pos + K_PROPS_LEN] == 0x40 and b[pos + K_PROPS_LEN + 1] == 0x40
            and b[pos + K_PROPS_LEN + 2] == 0x83):
        # to_stored's own properties with a creation time (what a Kafka producer's records carry): the
        # same as the walk below finds, without it
        r.has_ts = True
        r.ts = <int64_t>ld_u64(b + pos + K_PROPS_LEN + 3)
        pos += K_PROPS_LEN + K_PROPS_TS_LEN
    elif pos + 3 < n and b[pos] == 0x00 and b[pos + 1] == 0x53 and b[pos + 2] == 0x73:   # properties
        pos += 3
        if b[pos] == 0x45:
            pos += 1
        else:
            if not k_compound(b, pos, n, 0xC0, 0xD0, &first, &count, &stop):
                return False
            p = first
            for i in range(count):
                if p >= stop:
                    return False
                c = b[p]
                w = k_fixed(c)
                if w < 0:
                    if c == 0xA0 or c == 0xA1 or c == 0xA3:
                        if p + 2 > stop:
                            return False
                        w = 1 + b[p + 1]
                    elif c == 0xB0 or c == 0xB1 or c == 0xB3:
                        if p + 5 > stop:
                            return False
                        w = 4 + <Py_ssize_t>ld_u32(b + p + 1)
                    else:
                        return False
                if w > stop - p - 1:
                    return False
                if i == 9 and c == 0x83:
                    r.has_ts = True
                    r.ts = <int64_t>ld_u64(b + p + 1)
                p += 1 + w
            if p != stop:
                return False
            pos = stop
    if pos + 3 < n and b[pos] == 0x00 and b[pos + 1] == 0x53 and b[pos + 2] == 0x74:   # application properties
        pos += 3
        if not k_compound(b, pos, n, 0xC1, 0xD1, &first, &count, &stop):
            return False
        if count % 2 or count > 2 * K_MAX_SPANS:
            return False
        p = first
        for i in range(count // 2):
            if p >= stop or not k_string(b, p, stop, False, &r.name[i]):
                return False
            p = r.name[i].off + r.name[i].len
            if p >= stop or not k_string(b, p, stop, True, &r.val[i]):
                return False
            p = r.val[i].off + r.val[i].len
            for q in range(i):                # a dict in from_stored: a name given twice is its to lay out
                if r.name[q].len == r.name[i].len and memcmp(b + r.name[q].off, b + r.name[i].off,
                                                             r.name[i].len) == 0:
                    return False
            if pkey < 0 and r.name[i].len == 4 and memcmp(b + r.name[i].off, b"pkey", 4) == 0:
                pkey = <int>i
        if p != stop:
            return False
        r.nh = <int>(count // 2)
        pos = stop
    while pos < n:                                        # data sections, the body
        if pos + 4 > n or b[pos] != 0x00 or b[pos + 1] != 0x53 or b[pos + 2] != 0x75 or r.nsec == K_MAX_SPANS:
            return False
        pos += 3
        c = b[pos]
        if c == 0xA0:
            if pos + 2 > n:
                return False
            r.sec[r.nsec].len = b[pos + 1]
            r.sec[r.nsec].off = pos + 2
        elif c == 0xB0:
            if pos + 5 > n:
                return False
            r.sec[r.nsec].len = ld_u32(b + pos + 1)
            r.sec[r.nsec].off = pos + 5
        else:
            return False
        if r.sec[r.nsec].len > n - r.sec[r.nsec].off:
            return False
        pos = r.sec[r.nsec].off + r.sec[r.nsec].len
        r.value_len += r.sec[r.nsec].len
        r.nsec += 1
    if r.nsec == 0:
        return False
    if r.key_off < 0 and pkey >= 0:
        r.key_off = r.val[pkey].off
        r.key_len = r.val[pkey].len
    return True


cdef inline uint64_t k_ld8(const void* p) noexcept nogil:
    cdef uint64_t v
    memcpy(&v, p, 8)            # one unaligned load
    return v


cdef inline bint k_plain(const unsigned char* b, Py_ssize_t n, int64_t* ts, Py_ssize_t* vp, Py_ssize_t* vlen) noexcept nogil:
    # to_stored's form of a record with no key and no header: its properties with a creation time (bytes
    # 0..40 fixed, K_PLAIN: compared a word at a time), then one data section; its timestamp and value
    # span, or False for any other form
    cdef Py_ssize_t p = K_PROPS_LEN + K_PROPS_TS_LEN
    if n < p + 5:
        return False
    if ((k_ld8(b) ^ k_ld8(K_PLAIN)) | (k_ld8(b + 8) ^ k_ld8(K_PLAIN + 8)) | (k_ld8(b + 16) ^ k_ld8(K_PLAIN + 16))
            | (k_ld8(b + 24) ^ k_ld8(K_PLAIN + 24)) | (k_ld8(b + 32) ^ k_ld8(K_PLAIN + 32))):
        return False
    if b[40] != 0x83 or b[p] != 0x00 or b[p + 1] != 0x53 or b[p + 2] != 0x75:
        return False
    if b[p + 3] == 0xA0:
        vp[0] = p + 5
        vlen[0] = b[p + 4]
    elif b[p + 3] == 0xB0 and n >= p + 8:
        vp[0] = p + 8
        vlen[0] = <Py_ssize_t>ld_u32(b + p + 4)
    else:
        return False
    if vlen[0] != n - vp[0]:
        return False
    ts[0] = <int64_t>ld_u64(b + K_PROPS_LEN + 3)
    return True


cdef inline int k_plain_record(bytearray out, Py_ssize_t* filled, const unsigned char* b, Py_ssize_t n, int64_t i,
                               int64_t* base_ts, int64_t* max_ts) except -1:
    # to_stored's form of a record with a value alone (what Kafka producers mostly send) written at once as
    # record ``i`` of a batch, the same bytes as k_batch_record's general path: 1, or 0 (nothing written)
    # for any other form
    cdef int64_t ts, delta
    cdef Py_ssize_t vp, vlen, size
    cdef unsigned char* o
    if not k_plain(b, n, &ts, &vp, &vlen):
        return 0
    if i == 0:
        base_ts[0] = max_ts[0] = ts
    elif ts > max_ts[0]:
        max_ts[0] = ts
    delta = <int64_t>(<uint64_t>ts - <uint64_t>base_ts[0])
    size = 1 + k_zz_len(delta) + k_zz_len(i) + 1 + k_zz_len(vlen) + vlen + 1
    o = k_room(out, filled, k_zz_len(size) + size)
    o = k_put_zz(o, size)
    o[0] = 0
    o = k_put_zz(o + 1, delta)
    o = k_put_zz(o, i)
    o[0] = 0x01                           # no key
    o = k_put_zz(o + 1, vlen)
    memcpy(o, b + vp, vlen)
    o[vlen] = 0                           # no headers
    return 1


cdef int k_batch_record(bytearray out, Py_ssize_t* filled, const unsigned char* b, Py_ssize_t n, object raw,
                        int64_t i, int64_t* base_ts, int64_t* max_ts, int64_t chunk_ts, from_stored) except -1:
    # record ``i`` of a batch (its offset delta) appended at filled[0]: read in place, or handed to
    # ``from_stored(raw, chunk_ts)`` (``raw`` the record's bytes, made from ``b`` when None)
    cdef KRec rec
    cdef Py_ssize_t size, k
    cdef int64_t ts, delta
    cdef unsigned char* o
    cdef object slow = None
    if k_plain_record(out, filled, b, n, i, base_ts, max_ts):
        return 0
    if k_parse_stored(b, n, &rec):
        ts = rec.ts if rec.has_ts else chunk_ts
    else:
        if raw is None:
            raw = PyBytes_FromStringAndSize(<const char*>b, n)
        slow = from_stored(raw, chunk_ts)
        ts = slow[0]
    if i == 0:
        base_ts[0] = max_ts[0] = ts
    elif ts > max_ts[0]:
        max_ts[0] = ts
    delta = <int64_t>(<uint64_t>ts - <uint64_t>base_ts[0])     # wraps as Kafka's (Java's) long arithmetic
    if slow is not None:
        slow = _k_py.kafka_record(i, delta, slow[1], slow[2], slow[3])
        memcpy(k_room(out, filled, len(<bytes>slow)), PyBytes_AS_STRING(slow), len(<bytes>slow))
        return 0
    size = 1 + k_zz_len(delta) + k_zz_len(i)
    size += 1 if rec.key_off < 0 else k_zz_len(rec.key_len) + rec.key_len
    size += k_zz_len(rec.value_len) + rec.value_len + k_zz_len(rec.nh)
    for k in range(rec.nh):
        size += k_zz_len(rec.name[k].len) + rec.name[k].len + k_zz_len(rec.val[k].len) + rec.val[k].len
    o = k_room(out, filled, k_zz_len(size) + size)
    o = k_put_zz(o, size)
    o[0] = 0
    o = k_put_zz(o + 1, delta)
    o = k_put_zz(o, i)
    if rec.key_off < 0:
        o[0] = 0x01
        o += 1
    else:
        o = k_put_zz(o, rec.key_len)
        memcpy(o, b + rec.key_off, rec.key_len)
        o += rec.key_len
    o = k_put_zz(o, rec.value_len)
    for k in range(rec.nsec):
        memcpy(o, b + rec.sec[k].off, rec.sec[k].len)
        o += rec.sec[k].len
    o = k_put_zz(o, rec.nh)
    for k in range(rec.nh):
        o = k_put_zz(o, rec.name[k].len)
        memcpy(o, b + rec.name[k].off, rec.name[k].len)
        o = k_put_zz(o + rec.name[k].len, rec.val[k].len)
        memcpy(o, b + rec.val[k].off, rec.val[k].len)
        o += rec.val[k].len
    return 0


cdef void k_seal(bytearray out, Py_ssize_t at, Py_ssize_t filled, int64_t base_offset, int64_t count, int64_t base_ts,
                 int64_t max_ts) except *:
    # the 61-byte header of the batch at ``at`` whose records end at ``filled``, its CRC-32C set
    cdef unsigned char* o = <unsigned char*>PyByteArray_AS_STRING(out) + at
    st_u64(o, <uint64_t>base_offset)
    st_u32(o + 8, <uint32_t>(filled - at - K_BATCH_OVERHEAD))
    st_u32(o + 12, 0xFFFFFFFF)                # partition leader epoch -1
    o[16] = 2                                 # magic
    st_u16(o + 21, 0)                         # attributes
    st_u32(o + 23, <uint32_t>(count - 1))     # last offset delta
    st_u64(o + 27, <uint64_t>base_ts)
    st_u64(o + 35, <uint64_t>max_ts)
    st_u64(o + 43, 0xFFFFFFFFFFFFFFFF)        # producer id -1
    st_u16(o + 51, 0xFFFF)                    # producer epoch -1
    st_u32(o + 53, 0xFFFFFFFF)                # base sequence -1
    st_u32(o + 57, <uint32_t>count)
    crc = _k_crc32c.crc32c(memoryview(out)[at + K_CRC_START:filled])
    st_u32(<unsigned char*>PyByteArray_AS_STRING(out) + at + 17, <uint32_t>crc)


cdef object c_kafka_batch(list raws, Py_ssize_t skip, int64_t base_offset, int64_t chunk_ts, from_stored):
    """The batch, or None when there are no records."""
    cdef Py_ssize_t total = len(raws), i, filled = K_BATCH_HEADER, cap = K_BATCH_HEADER
    cdef int64_t base_ts = 0, max_ts = 0
    cdef bytearray out
    cdef object raw
    if skip >= total:
        return None
    for i in range(skip, total):
        cap += len(raws[i]) + 32           # a Kafka record is its stored one's spans plus a few varints
    out = PyByteArray_FromStringAndSize(NULL, cap)
    for i in range(skip, total):
        raw = raws[i]
        if type(raw) is not bytes:
            raw = bytes(raw)
        k_batch_record(out, &filled, <const unsigned char*>PyBytes_AS_STRING(raw), len(<bytes>raw), raw, i - skip,
                       &base_ts, &max_ts, chunk_ts, from_stored)
    PyByteArray_Resize(out, filled)
    k_seal(out, 0, filled, base_offset, total - skip, base_ts, max_ts)
    return out


def kafka_batch(list raws, Py_ssize_t skip, int64_t base_offset, int64_t chunk_ts, from_stored):
    """Fetch: the stored records ``raws[skip:]`` (bytes each: one chunk's, as the broker reads them) as
    one record batch v2 from ``base_offset``, each record read as ``from_stored(raw, chunk_ts)`` gives
    it (timestamp ms, key, value, headers): a ``bytearray``, CRC-32C set, no compression, attributes 0,
    no producer; or None when there is no record from ``skip`` on. ``from_stored`` is called only for
    records the fast path does not read itself (see kafka.pxi's head)."""
    return c_kafka_batch(raws, skip, base_offset, chunk_ts, from_stored)


cdef inline int k_reserve(bytearray out, Py_ssize_t at, Py_ssize_t need) except -1:
    # ``out``'s size is its capacity (the caller trims it): at least ``at + need``, grown at least twofold so
    # a buffer filled chunk by chunk is copied O(1) times, its new bytes left unset
    cdef Py_ssize_t cap = PyByteArray_GET_SIZE(out)
    if at + need > cap:
        PyByteArray_Resize(out, max(2 * cap, at + need))
    return 0


cdef inline Py_ssize_t k_chunk_room(const unsigned char* p, Py_ssize_t plen) noexcept nogil:
    # what a chunk's batch takes for the layouts the shells write: a Kafka record is its stored one's spans
    # plus a few varints (32 bytes cover them; a WebSocket ``pkey`` is both key and header and may take
    # more: k_room grows the buffer then). Read from the header alone.
    if plen < HDR_LEN:
        return 0
    return K_BATCH_HEADER + <Py_ssize_t>ld_u32(p + 36) + 32 * <Py_ssize_t>ld_u32(p + 4)


cdef Py_ssize_t c_kafka_chunk_at(const unsigned char* p, Py_ssize_t plen, Py_ssize_t skip, int64_t base_offset,
                                 int64_t chunk_ts, bytearray out, Py_ssize_t at, from_stored) except -2:
    # The batch written at out[at:] (out's size is its capacity: grown here when short, never trimmed);
    # returns its end (``at`` when the chunk has no record from ``skip`` on), or -1 when the data section is
    # not simple entries that walk to the header's counts (sub-batches, or a chunk chunk_records refuses):
    # the caller then goes through chunk_records, which decides. On an exception out[at:] is unspecified.
    cdef Py_ssize_t start, end, pos, ln, count = 0, i = 0, filled
    cdef int64_t base_ts = 0, max_ts = 0
    if plen < HDR_LEN:
        return -1
    start = HDR_LEN + p[44]
    end = start + <Py_ssize_t>ld_u32(p + 36)
    if start > plen or end > plen:
        return -1
    pos = start
    while pos < end:                          # the walk first: counts, bounds, no sub-batch
        if p[pos] & 0x80 or pos + K_SIMPLE_HDR > end:
            return -1
        ln = <Py_ssize_t>ld_u32(p + pos)
        if ln > end - pos - K_SIMPLE_HDR:
            return -1
        pos += K_SIMPLE_HDR + ln
        count += 1
    if count != <Py_ssize_t>ld_u32(p + 4) or count != <Py_ssize_t>ld_u16(p + 2):
        return -1
    if skip >= count:
        return at
    # room for the whole chunk at once; k_room grows it past that only for records read by from_stored
    k_reserve(out, at, K_BATCH_HEADER + (end - start) + 32 * (count - skip))
    filled = at + K_BATCH_HEADER
    pos = start
    while pos < end:
        ln = <Py_ssize_t>ld_u32(p + pos)
        if i >= skip and not k_plain_record(out, &filled, p + pos + K_SIMPLE_HDR, ln, i - skip, &base_ts, &max_ts):
            k_batch_record(out, &filled, p + pos + K_SIMPLE_HDR, ln, None, i - skip, &base_ts, &max_ts,
                           chunk_ts, from_stored)
        pos += K_SIMPLE_HDR + ln
        i += 1
    k_seal(out, at, filled, base_offset, count - skip, base_ts, max_ts)
    return filled


cdef Py_ssize_t k_chunk_batch_at(chunk, Py_ssize_t skip, int64_t base_offset, int64_t chunk_ts, bytearray out,
                                 Py_ssize_t at, from_stored) except -1:
    # c_kafka_chunk_at on any bytes-like chunk, sub-batches through chunk_records and c_kafka_batch
    cdef Py_buffer view
    cdef Py_ssize_t r, n
    c_get_buffer(chunk, &view)
    try:
        r = c_kafka_chunk_at(<const unsigned char*>view.buf, view.len, skip, base_offset, chunk_ts, out, at,
                             from_stored)
    finally:
        PyBuffer_Release(&view)
    if r >= 0:
        return r
    batch = c_kafka_batch(_k_core.chunk_records(chunk, False), skip, base_offset, chunk_ts, from_stored)
    if batch is None:
        return at
    n = PyByteArray_GET_SIZE(batch)
    k_reserve(out, at, n)
    memcpy(PyByteArray_AS_STRING(out) + at, PyByteArray_AS_STRING(batch), n)
    return at + n


def kafka_chunk_batch(chunk, Py_ssize_t skip, int64_t base_offset, int64_t chunk_ts, bytearray out not None,
                      from_stored):
    """Fetch: the records of one stored user chunk ``chunk`` (bytes-like, as ``read_chunks`` gives it)
    from its ``skip``-th on, appended to ``out`` as the one record batch v2 :func:`kafka_batch` makes of
    them (from ``base_offset``, ``chunk_ts`` the chunk's timestamp). Returns the bytes appended: 0 when
    the chunk has no record from ``skip`` on. Raises ChunkError (``out`` as it was) for a data section
    ``chunk_records`` refuses.

    A chunk of simple entries is read in place, record by record, into ``out``: no object per record.
    Any other (sub-batches) goes through ``chunk_records`` and :func:`kafka_batch`."""
    cdef Py_ssize_t at = PyByteArray_GET_SIZE(out), end = -1
    try:
        end = k_chunk_batch_at(chunk, skip, base_offset, chunk_ts, out, at, from_stored)
    finally:
        PyByteArray_Resize(out, at if end < 0 else end)
    return end - at


def kafka_chunk_batch_at(chunk, Py_ssize_t skip, int64_t base_offset, int64_t chunk_ts, bytearray out not None,
                         Py_ssize_t at, from_stored):
    """Fetch, into a buffer filled chunk after chunk: :func:`kafka_chunk_batch`'s batch written at
    ``out[at:]`` (0 <= ``at`` <= ``len(out)``), over whatever is there, and its end returned (``at`` when
    the chunk has no record from ``skip`` on). ``out[:at]`` is kept; ``out`` may end up longer than the
    returned end (room for the next chunks: :func:`kafka_reserve`): the caller trims it when done. Raises
    ChunkError as kafka_chunk_batch; ``out[at:]`` is then unspecified."""
    if at < 0 or at > PyByteArray_GET_SIZE(out):
        raise ValueError("at outside the buffer")
    return k_chunk_batch_at(chunk, skip, base_offset, chunk_ts, out, at, from_stored)


def kafka_reserve(bytearray out not None, Py_ssize_t at, list chunks not None):
    """Room in ``out`` past ``at`` for the batches of ``chunks`` (``(chunk_id, stored chunk)`` pairs, as
    ``read_chunk_views`` gives them) before :func:`kafka_chunk_batch_at` writes them: ``out`` made long
    enough for what the shells' layouts take (61 bytes per chunk, its data section, 32 per record; read
    from the headers), growing at least twofold, its new bytes unset; ``out[:at]`` is kept. Only a size
    hint: the writes grow ``out`` themselves when it is short (the pure twin does nothing here)."""
    cdef Py_buffer view
    cdef Py_ssize_t need = 0
    if at < 0 or at > PyByteArray_GET_SIZE(out):
        raise ValueError("at outside the buffer")
    for item in chunks:
        c_get_buffer((<tuple?>item)[1], &view)
        need += k_chunk_room(<const unsigned char*>view.buf, view.len)
        PyBuffer_Release(&view)
    k_reserve(out, at, need)


def kafka_batch_fast(list raws, Py_ssize_t skip, int64_t base_offset, int64_t chunk_ts):
    """:func:`kafka_batch` reading every record itself: None where any record would be handed over (or
    there is none). For tests that the common layouts take the fast path."""
    def refuse(raw, chunk_ts):
        raise LookupError
    try:
        return c_kafka_batch(raws, skip, base_offset, chunk_ts, refuse)
    except LookupError:
        return None


# ---- Produce: an idempotent producer's sequences --------------------------------------------------------

def kafka_sequence_ids(list seqs):
    """An idempotent producer's sequences, ``(base sequence, records)`` per batch (ints >= 0), as the
    engine's publishing ids: each batch's ``base .. base + records - 1`` as big-endian u64s, in order
    (bytes). Raises OverflowError past int64."""
    cdef Py_ssize_t total = 0, n, j
    cdef int64_t base
    cdef unsigned char* o
    for item in seqs:
        n = item[1]
        if n < 0:
            raise ValueError("negative record count")
        total += n
    out = PyBytes_FromStringAndSize(NULL, 8 * total)
    o = <unsigned char*>PyBytes_AS_STRING(out)
    for item in seqs:
        base = item[0]
        n = item[1]
        if base < 0:
            raise ValueError("negative sequence")
        if n and base - 1 > INT64_MAX - n:
            raise OverflowError("sequence past int64")
        for j in range(n):
            st_u64(o, <uint64_t>(base + j))
            o += 8
    return out
