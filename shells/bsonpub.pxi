# mewbase PUB frames recognised without decoding them (the BSON/TCP shell's hot path). _pybsonpub.py is the
# readable reference: the docstring of its bson_pub is the spec for everything here.

from bson.int64 import Int64 as _BpInt64

cdef enum:
    BP_MAX_DEPTH = 64        # _pybsonpub.MAX_DEPTH
    BP_MAX_KEYS = 64         # _pybsonpub.MAX_KEYS
    BP_NONE = 0
    BP_INT32 = 1
    BP_INT64 = 2
    BP_STR = 3


cdef struct BsonPub:
    Py_ssize_t chan_start
    Py_ssize_t chan_end
    Py_ssize_t ev_start
    Py_ssize_t ev_end
    int rid_kind
    int64_t rid
    int sess_kind
    int64_t sess
    Py_ssize_t sess_start
    Py_ssize_t sess_end


cdef inline bint c_utf8_ok(const unsigned char* s, Py_ssize_t n) noexcept nogil:
    # Strict UTF-8, as Python's decoder: no overlong forms, no surrogates, nothing past U+10FFFF.
    cdef Py_ssize_t i = 0
    cdef unsigned char c, c1
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
        elif c < 0xC2:
            return False
        elif c < 0xE0:
            if i + 1 >= n or (s[i + 1] & 0xC0) != 0x80:
                return False
            i += 2
        elif c < 0xF0:
            if i + 2 >= n:
                return False
            c1 = s[i + 1]
            if (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80:
                return False
            if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 > 0x9F):
                return False
            i += 3
        elif c < 0xF5:
            if i + 3 >= n:
                return False
            c1 = s[i + 1]
            if (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80 or (s[i + 3] & 0xC0) != 0x80:
                return False
            if (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 > 0x8F):
                return False
            i += 4
        else:
            return False
    return True


cdef inline Py_ssize_t c_bp_cstring(const unsigned char* b, Py_ssize_t pos, Py_ssize_t end) noexcept nogil:
    # Offset of the NUL ending the key at pos, which must come before end; -1 when there is none.
    cdef const unsigned char* z
    if pos >= end:
        return -1
    z = <const unsigned char*>memchr(b + pos, 0, end - pos)
    if z == NULL:
        return -1
    return z - b


cdef Py_ssize_t c_bp_string(const unsigned char* b, Py_ssize_t pos, Py_ssize_t end) noexcept nogil:
    # Offset of the NUL ending the checked string value at pos (before end); -1 when malformed.
    cdef int32_t s
    cdef Py_ssize_t e
    if end - pos < 4:
        return -1
    s = ld_i32le(b + pos)
    if s < 1 or s > end - pos - 4:
        return -1
    e = pos + 4 + s - 1
    if b[e] != 0 or not c_utf8_ok(b + pos + 4, s - 1):
        return -1
    return e


cdef bint c_bp_index_key(const unsigned char* k, Py_ssize_t n, Py_ssize_t idx) noexcept nogil:
    # Whether the n key bytes at k are the decimal digits of idx (no leading zeros).
    cdef unsigned char digits[24]
    cdef int m = 0
    cdef int i
    while True:
        digits[m] = <unsigned char>(48 + idx % 10)
        m += 1
        idx //= 10
        if idx == 0:
            break
    if n != m:
        return False
    for i in range(m):
        if k[i] != digits[m - 1 - i]:
            return False
    return True


cdef Py_ssize_t c_bp_value(int t, const unsigned char* b, Py_ssize_t pos, Py_ssize_t end, int depth) noexcept nogil:
    # Bytes taken by the checked value of type t at pos (ending by end); -1 when malformed or not accepted.
    cdef Py_ssize_t n
    cdef int32_t s
    if t == 0x01 or t == 0x09 or t == 0x11 or t == 0x12:
        n = 8
    elif t == 0x10:
        n = 4
    elif t == 0x07:
        n = 12
    elif t == 0x13:
        n = 16
    elif t == 0x0A or t == 0xFF or t == 0x7F:
        n = 0
    elif t == 0x08:
        if end - pos < 1 or b[pos] > 1:
            return -1
        return 1
    elif t == 0x02:
        n = c_bp_string(b, pos, end)
        if n < 0:
            return -1
        return n + 1 - pos
    elif t == 0x03 or t == 0x04:
        if end - pos < 5:
            return -1
        s = ld_i32le(b + pos)
        if s < 5 or s > end - pos:
            return -1
        if not c_bp_doc(b, pos, s, depth + 1, t == 0x04, False):
            return -1
        return s
    elif t == 0x05:
        if end - pos < 5:
            return -1
        s = ld_i32le(b + pos)
        if s < 0 or s > end - pos - 5:
            return -1
        t = b[pos + 4]
        if t == 2 or (t >= 9 and t < 0x80):
            return -1
        return 5 + <Py_ssize_t>s
    else:
        return -1       # deprecated or unusual: undefined, regex, DBPointer, code, symbol, code with scope
    if n > end - pos:
        return -1
    return n


cdef bint c_bp_doc(const unsigned char* b, Py_ssize_t start, Py_ssize_t n, int depth, bint array,
                   bint top) noexcept nogil:
    # Whether the document (or array) of n bytes at start passes the strict check (see bson_pub).
    cdef Py_ssize_t key_at[BP_MAX_KEYS]
    cdef Py_ssize_t key_len[BP_MAX_KEYS]
    cdef Py_ssize_t end = start + n - 1
    cdef Py_ssize_t pos = start + 4
    cdef Py_ssize_t count = 0
    cdef Py_ssize_t k, klen, size, j
    cdef int t
    if depth > BP_MAX_DEPTH or b[end] != 0:
        return False
    while pos < end:
        t = b[pos]
        k = c_bp_cstring(b, pos + 1, end)
        if k < 0:
            return False
        klen = k - pos - 1
        if array:
            if not c_bp_index_key(b + pos + 1, klen, count):
                return False
        else:
            if count >= BP_MAX_KEYS or not c_utf8_ok(b + pos + 1, klen):
                return False
            if klen == 4 and memcmp(b + pos + 1, b"$ref", 4) == 0:
                return False
            if top and count and klen == 3 and memcmp(b + pos + 1, b"_id", 3) == 0:
                return False
            for j in range(count):
                if key_len[j] == klen and memcmp(b + key_at[j], b + pos + 1, klen) == 0:
                    return False
            key_at[count] = pos + 1
            key_len[count] = klen
        count += 1
        size = c_bp_value(t, b, k + 1, end, depth)
        if size < 0:
            return False
        pos = k + 1 + size
    return pos == end


cdef inline Py_ssize_t c_bp_int(int t, const unsigned char* b, Py_ssize_t pos, Py_ssize_t end, int* kind,
                                int64_t* v) noexcept nogil:
    # An int32 or int64 value at pos: its size, or -1.
    if t == 0x10:
        if end - pos < 4:
            return -1
        kind[0] = BP_INT32
        v[0] = ld_i32le(b + pos)
        return 4
    if t == 0x12:
        if end - pos < 8:
            return -1
        kind[0] = BP_INT64
        v[0] = c_ld_i64le(b + pos)
        return 8
    return -1


cdef bint c_bp_frame(const unsigned char* b, Py_ssize_t start, Py_ssize_t n, BsonPub* out) noexcept nogil:
    # The PUB body {channel, event, rID?, sessID?} of n bytes at start.
    cdef Py_ssize_t end = start + n - 1
    cdef Py_ssize_t pos = start + 4
    cdef Py_ssize_t k, klen, vs, e, size
    cdef const unsigned char* key
    cdef int t
    cdef int seen = 0          # bits: 1 channel, 2 event, 4 rID, 8 sessID
    cdef int32_t s
    if b[end] != 0:
        return False
    while pos < end:
        t = b[pos]
        k = c_bp_cstring(b, pos + 1, end)
        if k < 0:
            return False
        key = b + pos + 1
        klen = k - pos - 1
        vs = k + 1
        if klen == 7 and memcmp(key, b"channel", 7) == 0:
            if seen & 1 or t != 0x02:
                return False
            seen |= 1
            e = c_bp_string(b, vs, end)
            if e < 0 or e == vs + 4:
                return False
            out.chan_start = vs + 4
            out.chan_end = e
            pos = e + 1
        elif klen == 5 and memcmp(key, b"event", 5) == 0:
            if seen & 2 or t != 0x03 or end - vs < 5:
                return False
            seen |= 2
            s = ld_i32le(b + vs)
            if s < 5 or s > end - vs or not c_bp_doc(b, vs, s, 1, False, True):
                return False
            out.ev_start = vs
            out.ev_end = vs + s
            pos = vs + s
        elif klen == 3 and memcmp(key, b"rID", 3) == 0:
            if seen & 4:
                return False
            seen |= 4
            size = c_bp_int(t, b, vs, end, &out.rid_kind, &out.rid)
            if size < 0:
                return False
            pos = vs + size
        elif klen == 6 and memcmp(key, b"sessID", 6) == 0:
            if seen & 8:
                return False
            seen |= 8
            if t == 0x02:
                e = c_bp_string(b, vs, end)
                if e < 0:
                    return False
                out.sess_kind = BP_STR
                out.sess_start = vs + 4
                out.sess_end = e
                pos = e + 1
            else:
                size = c_bp_int(t, b, vs, end, &out.sess_kind, &out.sess)
                if size < 0:
                    return False
                pos = vs + size
        else:
            return False
    return pos == end and (seen & 3) == 3


cdef bint c_bson_pub(const unsigned char* b, Py_ssize_t n, BsonPub* out) noexcept nogil:
    # The envelope {type: "PUB", frame: <body>}: whether it is one, filling out.
    cdef Py_ssize_t end, pos, k, klen, vs, e
    cdef Py_ssize_t fstart = -1
    cdef int32_t fn = 0
    cdef bint seen_type = False
    cdef int t
    out.rid_kind = BP_NONE
    out.sess_kind = BP_NONE
    if n < 5 or ld_i32le(b) != n or b[n - 1] != 0:
        return False
    end = n - 1
    pos = 4
    while pos < end:
        t = b[pos]
        k = c_bp_cstring(b, pos + 1, end)
        if k < 0:
            return False
        klen = k - pos - 1
        vs = k + 1
        if klen == 4 and memcmp(b + pos + 1, b"type", 4) == 0 and t == 0x02 and not seen_type:
            e = c_bp_string(b, vs, end)
            if e < 0 or e - vs - 4 != 3 or memcmp(b + vs + 4, b"PUB", 3) != 0:
                return False
            seen_type = True
            pos = e + 1
        elif klen == 5 and memcmp(b + pos + 1, b"frame", 5) == 0 and t == 0x03 and fstart < 0:
            if end - vs < 5:
                return False
            fn = ld_i32le(b + vs)
            if fn < 5 or fn > end - vs:
                return False
            fstart = vs
            pos = vs + fn
        else:
            return False
    if pos != end or not seen_type or fstart < 0:
        return False
    return c_bp_frame(b, fstart, fn, out)


def bson_pub(frame):
    """See :func:`riverbed.shells._pybsonpub.bson_pub` (the spec)."""
    cdef Py_buffer view
    cdef BsonPub r
    cdef bint ok
    cdef const unsigned char* b
    if type(frame) is bytes:
        b = <const unsigned char*>PyBytes_AS_STRING(frame)
        ok = c_bson_pub(b, len(<bytes>frame), &r)
        return c_bp_result(b, &r) if ok else None
    c_get_buffer(frame, &view)
    try:
        b = <const unsigned char*>view.buf
        ok = c_bson_pub(b, view.len, &r)
        return c_bp_result(b, &r) if ok else None
    finally:
        PyBuffer_Release(&view)


cdef object c_bp_result(const unsigned char* b, BsonPub* r):
    cdef object rid = None
    cdef object sess = None
    if r.rid_kind == BP_INT32:
        rid = <long long>r.rid
    elif r.rid_kind == BP_INT64:
        rid = _BpInt64(r.rid)
    if r.sess_kind == BP_INT32:
        sess = <long long>r.sess
    elif r.sess_kind == BP_INT64:
        sess = _BpInt64(r.sess)
    elif r.sess_kind == BP_STR:
        sess = PyUnicode_DecodeUTF8(<const char*>b + r.sess_start, r.sess_end - r.sess_start, NULL)
    return (PyUnicode_DecodeUTF8(<const char*>b + r.chan_start, r.chan_end - r.chan_start, NULL), rid, sess,
            r.ev_start, r.ev_end)
