# JSON payloads of a batch of stored records, joined into newline-delimited JSON for one Arrow parse.
#
# The spec, the rules and every docstring are those of _pyjsonlines.py (the twin); this part makes the
# per-record walk C: the AMQP section walk below mirrors c_decode_message (record.pxi) step for step but
# makes no Python object (a record with application-properties goes through the real walker, which
# builds its map), and the payload scan copies while it checks, one pass per byte.

from libc.string cimport memcmp


cdef enum:
    JL_NEWLINE = 0x0A
    JL_SPACE = 0x20
    # An integer literal of at most 15 digits is below 2**53, so a float column holds it exactly, as
    # pyarrow's conversion of a Python int requires; a longer one is left to the slow path when the
    # schema has a float column.
    JL_MAX_EXACT_DIGITS = 15


cdef bytes JL_CT_JSON = b"application/json"
cdef bytes JL_CT_OCTET = b"application/octet-stream"


cdef inline Py_ssize_t c_jl_utf8(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    # Length of the strict UTF-8 sequence (as Python's decoder accepts it) that starts a non-ASCII byte at
    # p, or 0: no overlongs, no surrogates (ED A0..BF), nothing past U+10FFFF.
    cdef unsigned char c = p[0], lo = 0x80, hi = 0xBF
    cdef Py_ssize_t k, i
    if 0xC2 <= c <= 0xDF:
        k = 2
    elif 0xE0 <= c <= 0xEF:
        k = 3
        if c == 0xE0:
            lo = 0xA0
        elif c == 0xED:
            hi = 0x9F
    elif 0xF0 <= c <= 0xF4:
        k = 4
        if c == 0xF0:
            lo = 0x90
        elif c == 0xF4:
            hi = 0x8F
    else:
        return 0
    if n < k or p[1] < lo or p[1] > hi:
        return 0
    for i in range(2, k):
        if p[i] < 0x80 or p[i] > 0xBF:
            return 0
    return k


cdef inline bint c_jl_hex_surrogate(unsigned char a, unsigned char b) noexcept nogil:
    return (a == 0x64 or a == 0x44) and ((0x38 <= b <= 0x39) or (0x61 <= b <= 0x66) or (0x41 <= b <= 0x46))


cdef inline bint c_jl_bare(unsigned char c) noexcept nogil:
    # A byte that may stand outside strings in the JSON the fast path takes: punctuation of numbers and
    # the letters of true, false and null (NaN and Infinity are not among them).
    return ((0x30 <= c <= 0x39) or c == 0x3A or c == 0x2C or c == 0x2D or c == 0x2B or c == 0x2E
            or c == 0x65 or c == 0x45 or c == 0x74 or c == 0x72 or c == 0x75 or c == 0x66 or c == 0x61
            or c == 0x6C or c == 0x73 or c == 0x6E)


cdef Py_ssize_t c_jl_scan(const unsigned char* p, Py_ssize_t n, unsigned char* out, int max_depth,
                          bint long_ints) noexcept nogil:
    # _pyjsonlines.scan_payload: copies an accepted payload to out (newlines outside strings as spaces)
    # and returns n; -1 when the payload is not one the fast path takes.
    cdef Py_ssize_t i = 0, k, digits = 0
    cdef int depth = 0
    cdef bint started = False, done = False, in_number = False, integral = False
    cdef unsigned char c, e
    while i < n:
        c = p[i]
        if in_number:
            if 0x30 <= c <= 0x39:
                digits += 1
            elif c == 0x2E or c == 0x65 or c == 0x45:
                integral = False                        # a fraction or an exponent: not an integer literal
            elif c != 0x2B and c != 0x2D:
                in_number = False
                if integral and digits > JL_MAX_EXACT_DIGITS and not long_ints:
                    return -1
        elif (0x30 <= c <= 0x39) or c == 0x2D:
            in_number = integral = True
            digits = 1 if c != 0x2D else 0
        if c == 0x22:                                   # a string: to its closing quote
            if done or not started:
                return -1
            out[i] = c
            i += 1
            if i < n and p[i] == 0x24:                  # "$...: maybe Extended JSON, which the slow path unwraps
                return -1
            while True:
                if i >= n:
                    return -1
                c = p[i]
                if c == 0x22:
                    out[i] = c
                    i += 1
                    break
                if c < 0x20:
                    return -1
                if c == 0x5C:
                    if i + 1 >= n:
                        return -1
                    e = p[i + 1]
                    if e == 0x75:
                        if i + 5 >= n or c_jl_hex_surrogate(p[i + 2], p[i + 3]):
                            return -1
                        memcpy(out + i, p + i, 6)
                        i += 6
                    else:
                        out[i] = c
                        out[i + 1] = e
                        i += 2
                    continue
                if c < 0x80:
                    out[i] = c
                    i += 1
                    continue
                k = c_jl_utf8(p + i, n - i)
                if k == 0:
                    return -1
                memcpy(out + i, p + i, k)
                i += k
            continue
        if c == 0x20 or c == 0x09:
            out[i] = c
        elif c == 0x0A or c == 0x0D:
            out[i] = JL_SPACE
        elif c == 0x7B or c == 0x5B:
            if done or (not started and c != 0x7B):
                return -1
            started = True
            depth += 1
            if depth > max_depth:
                return -1
            out[i] = c
        elif c == 0x7D or c == 0x5D:
            if depth == 0:
                return -1
            depth -= 1
            if depth == 0:
                done = True
            out[i] = c
        elif c_jl_bare(c):
            if done or not started:
                return -1
            out[i] = c
        else:
            return -1
        i += 1
    return n if done else -1


# What encode_record writes for a JSON payload with no creation time and no application properties:
# properties (7 fields, content-type sym8 "application/json"), then a data section. A record that starts
# with exactly these bytes and holds one data section to its end is taken without the section walk.
cdef bytes JL_SHELL_PREFIX = b"\x00\x53\x73\xc0\x19\x07" + b"\x40" * 6 + b"\xa3\x10application/json\x00\x53\x75"


cdef inline bint c_jl_shell_json(const unsigned char* b, Py_ssize_t end, Py_ssize_t* ps,
                                 Py_ssize_t* pe) noexcept:
    cdef Py_ssize_t k = len(JL_SHELL_PREFIX), head
    if end < k + 2 or memcmp(b, PyBytes_AS_STRING(JL_SHELL_PREFIX), k) != 0:
        return False
    if b[k] == REC_VBIN8:
        head = k + 2
        if b[k + 1] != end - head:
            return False
    elif b[k] == REC_VBIN32 and end >= k + 5:
        head = k + 5
        if <Py_ssize_t>ld_u32(b + k + 1) != end - head:
            return False
    else:
        return False
    ps[0] = head
    pe[0] = end
    return True


cdef int c_jl_message(const unsigned char* b, Py_ssize_t end, Py_ssize_t* ps, Py_ssize_t* pe) except -2:
    # _pyjsonlines.message_payload: 1 with the payload in [*ps, *pe) for a message c_decode_message reads
    # as one data section labeled JSON, 2 for the same with a content-type that leaves the payload to be
    # sniffed, 0 for anything else.
    cdef Py_ssize_t pos = 0, p, stop, q, nxt
    if c_jl_shell_json(b, end, ps, pe):
        return 1
    cdef int code, value, stage = 0, body = 0, new, field, data_sections = 0, label = 2
    cdef uint32_t count, i
    cdef bint repeat
    cdef Py_ssize_t ct_start = -1, ct_len = 0
    while pos < end:
        p = c_amqp_section(b, pos, end, &code)
        if p < 0:
            return 0
        new = REC_STAGE[code]
        repeat = stage == STAGE_BODY and code == SEC_DATA and body == REC_BODY_DATA
        if (new <= stage and not repeat) or (code == SEC_FOOTER and stage != STAGE_BODY):
            return 0
        stage = new
        value = b[p]
        if code == SEC_DATA:
            if value != REC_VBIN8 and value != REC_VBIN32:
                return 0
            pos = c_amqp_skip_body(b, value, p + 1, end, 0)
            if pos < 0:
                return 0
            ps[0] = c_var_start(value, p)
            pe[0] = pos
            data_sections += 1
            body = REC_BODY_DATA
        elif code == SEC_AMQP_VALUE or code == SEC_AMQP_SEQUENCE:
            return 0                                    # a body the fast path leaves to decode_record
        elif code == SEC_HEADER:
            if not c_is_list(value):
                return 0
            pos = c_amqp_skip_value(b, p, end, 0)
            if pos < 0:
                return 0
        elif code == SEC_PROPERTIES:
            if not c_is_list(value):
                return 0
            stop = c_amqp_skip_value(b, p, end, 0)
            if stop < 0:
                return 0
            ct_start = -1
            if value != REC_LIST0:
                c_amqp_frame(b, value, p + 1, end, &q, &count)
                for i in range(min(count, <uint32_t>(REC_CONTENT_TYPE + 1))):
                    field = b[q]
                    nxt = c_amqp_skip_value(b, q, stop, 1)
                    if i == REC_CONTENT_TYPE and c_is_string(field):
                        ct_start = c_var_start(field, q)
                        ct_len = nxt - ct_start
                    q = nxt
            pos = stop
        elif code == SEC_APP_PROPERTIES:
            if value != REC_MAP8 and value != REC_MAP32:
                return 0
            pos = c_amqp_app_properties(b, p, end, {})
            if pos < 0:
                return 0
        else:
            if value != REC_MAP8 and value != REC_MAP32:
                return 0
            pos = c_amqp_skip_value(b, p, end, 0)
            if pos < 0:
                return 0
    if stage < STAGE_BODY or body != REC_BODY_DATA or data_sections != 1:
        return 0
    if ct_start < 0 or ct_len == 0:
        return 2
    if ct_len == len(JL_CT_JSON) and memcmp(b + ct_start, PyBytes_AS_STRING(JL_CT_JSON), ct_len) == 0:
        return 1
    if ct_len == len(JL_CT_OCTET) and memcmp(b + ct_start, PyBytes_AS_STRING(JL_CT_OCTET), ct_len) == 0:
        return 2
    return 0


def json_lines(value_offsets, data, max_depth=REC_MAX_DEPTH, long_ints=True):
    """The JSON payloads of a batch of stored records as newline-delimited JSON. See
    :func:`riverbed.engine._pyjsonlines.json_lines` for the rules, the result and the errors."""
    cdef Py_buffer vo_view, data_view
    cdef const unsigned char* vo
    cdef const unsigned char* d
    cdef Py_ssize_t n, r, s, e, ps = 0, pe = 0, w, used = 0, taken = 0
    cdef int kind
    cdef int32_t a, z
    cdef unsigned char* out
    cdef unsigned char* rows_p
    cdef unsigned char* bounds_p
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
        raise ValueError(f"max_depth must be a positive int, not {max_depth!r}")
    c_get_buffer(value_offsets, &vo_view)
    try:
        c_get_buffer(data, &data_view)
        try:
            if vo_view.len < 4 or vo_view.len % 4:
                raise ValueError("value_offsets must hold n + 1 int32 offsets (n >= 0)")
            vo = <const unsigned char*>vo_view.buf
            d = <const unsigned char*>data_view.buf
            n = vo_view.len // 4 - 1
            a = ld_i32le(vo)
            if a < 0 or a > data_view.len:
                raise ValueError("value_offsets point outside data")
            for r in range(n):
                z = ld_i32le(vo + 4 * (r + 1))
                if z < a or z > data_view.len:
                    raise ValueError("value_offsets point outside data or go backwards")
                a = z
            lines = PyByteArray_FromStringAndSize(NULL, ld_i32le(vo + 4 * n) - ld_i32le(vo) + n)
            rows = PyByteArray_FromStringAndSize(NULL, 8 * n)
            bounds = PyByteArray_FromStringAndSize(NULL, 8 * (n + 1))
            out = <unsigned char*>PyByteArray_AS_STRING(lines)
            rows_p = <unsigned char*>PyByteArray_AS_STRING(rows)
            bounds_p = <unsigned char*>PyByteArray_AS_STRING(bounds)
            st_i64le(bounds_p, 0)
            for r in range(n):
                s = ld_i32le(vo + 4 * r)
                e = ld_i32le(vo + 4 * (r + 1))
                if e == s:
                    continue
                if d[s] == REC_DESCRIBED:
                    kind = c_jl_message(d + s, e - s, &ps, &pe)
                    if kind == 0:
                        continue
                    ps += s
                    pe += s
                else:
                    ps, pe = s, e
                w = c_jl_scan(d + ps, pe - ps, out + used, max_depth, long_ints)
                if w < 0:
                    continue
                used += w
                out[used] = JL_NEWLINE
                used += 1
                st_i64le(rows_p + 8 * taken, r)
                taken += 1
                st_i64le(bounds_p + 8 * taken, used)
        finally:
            PyBuffer_Release(&data_view)
    finally:
        PyBuffer_Release(&vo_view)
    del lines[used:]
    del rows[8 * taken:]
    del bounds[8 * (taken + 1):]
    return lines, rows, bounds
