# The one record format: AMQP 1.0 bare messages (encode, decode) and payload sniffing.
#
# _pyrecord.py has the byte layout and is the spec: same names, same results, same error types. The
# decoder walks the record with C pointers and makes Python objects only for what it returns (no struct
# call, slice or exception per field), so a shell pays one C pass per delivered record. Every walker
# returns the position after what it read, or -1 when the bytes are not AMQP 1.0; "not a message" is an
# answer (None), never an exception.

import json as _rec_json
import uuid as _rec_uuid

from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int16_t


cdef extern from "Python.h":
    const char* _unicode_utf8 "PyUnicode_AsUTF8AndSize"(object s, Py_ssize_t* size) except NULL


cdef enum:
    REC_DESCRIBED = 0x00
    REC_SMALLULONG = 0x53
    REC_ULONG = 0x80
    REC_NULL = 0x40
    REC_TRUE = 0x41
    REC_FALSE = 0x42
    REC_UINT0 = 0x43
    REC_ULONG0 = 0x44
    REC_LIST0 = 0x45
    REC_BOOLEAN = 0x56
    REC_CHAR = 0x73
    REC_FLOAT = 0x72
    REC_DOUBLE = 0x82
    REC_TIMESTAMP = 0x83
    REC_UUID = 0x98
    REC_VBIN8 = 0xA0
    REC_STR8 = 0xA1
    REC_SYM8 = 0xA3
    REC_VBIN32 = 0xB0
    REC_STR32 = 0xB1
    REC_SYM32 = 0xB3
    REC_LIST8 = 0xC0
    REC_MAP8 = 0xC1
    REC_LIST32 = 0xD0
    REC_MAP32 = 0xD1
    REC_ARRAY8 = 0xE0
    REC_ARRAY32 = 0xF0

    SEC_HEADER = 0x70
    SEC_DELIVERY_ANNOTATIONS = 0x71
    SEC_MESSAGE_ANNOTATIONS = 0x72
    SEC_PROPERTIES = 0x73
    SEC_APP_PROPERTIES = 0x74
    SEC_DATA = 0x75
    SEC_AMQP_SEQUENCE = 0x76
    SEC_AMQP_VALUE = 0x77
    SEC_FOOTER = 0x78
    STAGE_BODY = 6

    REC_LEN_DESCRIPTOR = 3
    REC_LEN_LONG_DESCRIPTOR = 10
    REC_MAX_DEPTH = 64
    REC_CONTENT_TYPE = 6
    REC_CREATION_TIME = 9
    REC_LEN_BSON_MIN = 5

    REC_BODY_DATA = 1
    REC_BODY_VALUE_BINARY = 2
    REC_BODY_VALUE_STRING = 3
    REC_BODY_VALUE = 4
    REC_BODY_SEQUENCE = 5

    REC_KIND_BYTES = 0
    REC_KIND_JSON = 1
    REC_KIND_BSON = 2

BODY_DATA = REC_BODY_DATA
BODY_VALUE_BINARY = REC_BODY_VALUE_BINARY
BODY_VALUE_STRING = REC_BODY_VALUE_STRING
BODY_VALUE = REC_BODY_VALUE
BODY_SEQUENCE = REC_BODY_SEQUENCE
KIND_BYTES = REC_KIND_BYTES
KIND_JSON = REC_KIND_JSON
KIND_BSON = REC_KIND_BSON


# Bytes after a fixed-width format code, -1 for every other code; and the stage each section code moves
# the section walk to (0: not a section). Filled once at import.
cdef signed char REC_WIDTH[256]
cdef unsigned char REC_STAGE[256]


cdef void c_rec_tables() noexcept:
    cdef int i
    memset(REC_WIDTH, -1, sizeof(REC_WIDTH))
    memset(REC_STAGE, 0, sizeof(REC_STAGE))
    for i in range(0x40, 0x46):
        REC_WIDTH[i] = 0
    for i in range(0x50, 0x57):
        REC_WIDTH[i] = 1
    REC_WIDTH[0x60] = REC_WIDTH[0x61] = 2
    for i in range(0x70, 0x75):
        REC_WIDTH[i] = 4
    for i in range(0x80, 0x85):
        REC_WIDTH[i] = 8
    REC_WIDTH[0x94] = REC_WIDTH[0x98] = 16
    for i in range(SEC_HEADER, SEC_APP_PROPERTIES + 1):
        REC_STAGE[i] = i - SEC_HEADER + 1
    REC_STAGE[SEC_DATA] = REC_STAGE[SEC_AMQP_SEQUENCE] = REC_STAGE[SEC_AMQP_VALUE] = STAGE_BODY
    REC_STAGE[SEC_FOOTER] = STAGE_BODY + 1

c_rec_tables()

# Symbolic section descriptors (the other spelling of 00 53 xx).
cdef dict REC_SECTION_NAMES = {
    b"amqp:header:list": SEC_HEADER,
    b"amqp:delivery-annotations:map": SEC_DELIVERY_ANNOTATIONS,
    b"amqp:message-annotations:map": SEC_MESSAGE_ANNOTATIONS,
    b"amqp:properties:list": SEC_PROPERTIES,
    b"amqp:application-properties:map": SEC_APP_PROPERTIES,
    b"amqp:data:binary": SEC_DATA,
    b"amqp:amqp-sequence:list": SEC_AMQP_SEQUENCE,
    b"amqp:amqp-value:*": SEC_AMQP_VALUE,
    b"amqp:footer:map": SEC_FOOTER,
}


def _rec_no_constant(name):
    raise ValueError(f"{name} is not JSON")


# NaN and Infinity are Python's extension, not JSON (the twin configures its decoder the same way).
cdef object REC_JSON = _rec_json.JSONDecoder(parse_constant=_rec_no_constant)


cdef inline bint c_is_string(int code) noexcept nogil:
    return code == REC_STR8 or code == REC_STR32 or code == REC_SYM8 or code == REC_SYM32


cdef inline bint c_is_list(int code) noexcept nogil:
    return code == REC_LIST0 or code == REC_LIST8 or code == REC_LIST32


cdef inline Py_ssize_t c_var_start(int code, Py_ssize_t pos) noexcept nogil:
    # Start of the bytes of a vbin/str/sym value whose code is at pos: 8-bit forms have a 1-byte length.
    return pos + 2 if (code & 0xF0) == 0xA0 else pos + 5


cdef Py_ssize_t c_amqp_frame(const unsigned char* b, int code, Py_ssize_t pos, Py_ssize_t end,
                             Py_ssize_t* first, uint32_t* count) noexcept nogil:
    # list/map/array body at pos: first element and count; returns the body's end. size counts count too.
    cdef uint32_t size
    cdef Py_ssize_t stop
    if (code & 0xF0) == 0xC0 or (code & 0xF0) == 0xE0:
        if pos + 2 > end:
            return -1
        size = b[pos]
        count[0] = b[pos + 1]
        first[0] = pos + 2
        stop = pos + 1 + size
        if size < 1:
            return -1
    else:
        if pos + 8 > end:
            return -1
        size = ld_u32(b + pos)
        count[0] = ld_u32(b + pos + 4)
        first[0] = pos + 8
        stop = pos + 4 + <Py_ssize_t>size
        if size < 4:
            return -1
    return -1 if stop > end else stop


cdef Py_ssize_t c_amqp_skip_body(const unsigned char* b, int code, Py_ssize_t pos, Py_ssize_t end,
                                 int depth) noexcept nogil:
    cdef int width = REC_WIDTH[code]
    cdef Py_ssize_t stop
    if width >= 0:
        stop = pos + width
    elif code == REC_VBIN8 or code == REC_STR8 or code == REC_SYM8:
        if pos >= end:
            return -1
        stop = pos + 1 + b[pos]
    elif code == REC_VBIN32 or code == REC_STR32 or code == REC_SYM32:
        if pos + 4 > end:
            return -1
        stop = pos + 4 + <Py_ssize_t>ld_u32(b + pos)
    elif (code == REC_LIST8 or code == REC_LIST32 or code == REC_MAP8 or code == REC_MAP32
          or code == REC_ARRAY8 or code == REC_ARRAY32):
        return c_amqp_skip_compound(b, code, pos, end, depth)
    else:
        return -1
    return -1 if stop > end else stop


cdef Py_ssize_t c_amqp_skip_compound(const unsigned char* b, int code, Py_ssize_t pos, Py_ssize_t end,
                                     int depth) noexcept nogil:
    cdef Py_ssize_t p, stop
    cdef uint32_t count, i
    cdef int elem, width
    if depth >= REC_MAX_DEPTH:
        return -1
    stop = c_amqp_frame(b, code, pos, end, &p, &count)
    if stop < 0:
        return -1
    if code == REC_ARRAY8 or code == REC_ARRAY32:
        p = c_amqp_constructor(b, p, stop, depth + 1, &elem)
        if p < 0:
            return -1
        width = REC_WIDTH[elem]
        if width >= 0:
            # fixed-width elements: no walk (a 0-width type would otherwise loop count times on nothing)
            p += <Py_ssize_t>width * count
        else:
            for i in range(count):
                p = c_amqp_skip_body(b, elem, p, stop, depth + 1)
                if p < 0:
                    return -1
    else:
        if (code == REC_MAP8 or code == REC_MAP32) and count % 2:
            return -1
        for i in range(count):
            p = c_amqp_skip_value(b, p, stop, depth + 1)
            if p < 0:
                return -1
    return stop if p == stop else -1


cdef Py_ssize_t c_amqp_constructor(const unsigned char* b, Py_ssize_t pos, Py_ssize_t end, int depth,
                                   int* code) noexcept nogil:
    # A described constructor's descriptor is checked and dropped (00 descriptor constructor, recursively).
    while True:
        if pos >= end:
            return -1
        code[0] = b[pos]
        if code[0] != REC_DESCRIBED:
            return pos + 1
        if depth >= REC_MAX_DEPTH:
            return -1
        pos = c_amqp_skip_value(b, pos + 1, end, depth + 1)
        if pos < 0:
            return -1
        depth += 1


cdef Py_ssize_t c_amqp_skip_value(const unsigned char* b, Py_ssize_t pos, Py_ssize_t end,
                                  int depth) noexcept nogil:
    cdef int code
    pos = c_amqp_constructor(b, pos, end, depth, &code)
    if pos < 0:
        return -1
    return c_amqp_skip_body(b, code, pos, end, depth)


cdef inline str c_amqp_text(const unsigned char* b, int code, Py_ssize_t pos, Py_ssize_t stop):
    # A str8/str32/sym8/sym32 already checked to end at stop.
    cdef Py_ssize_t start = c_var_start(code, pos)
    return PyUnicode_DecodeUTF8(<const char*>b + start, stop - start, "replace")


cdef inline bytes c_amqp_bytes(const unsigned char* b, Py_ssize_t start, Py_ssize_t stop):
    return PyBytes_FromStringAndSize(<const char*>b + start, stop - start)


cdef object c_amqp_property(const unsigned char* b, Py_ssize_t pos, Py_ssize_t stop):
    # An application-properties value already checked to end at stop (mapping in _pyrecord.decode_message).
    cdef int code = b[pos]
    cdef const unsigned char* v = b + pos + 1
    cdef uint32_t u32
    cdef uint64_t u64
    cdef float f32
    cdef double f64
    if c_is_string(code):
        return c_amqp_text(b, code, pos, stop)
    if code == REC_VBIN8 or code == REC_VBIN32:
        return c_amqp_bytes(b, c_var_start(code, pos), stop)
    if code == REC_NULL:
        return None
    if code == REC_TRUE or code == REC_FALSE:
        return code == REC_TRUE
    if code == REC_BOOLEAN:
        return v[0] != 0
    if code == REC_UINT0 or code == REC_ULONG0:
        return 0
    if code == 0x50 or code == 0x52 or code == 0x53:
        return v[0]
    if code == 0x51 or code == 0x54 or code == 0x55:
        return <signed char>v[0]
    if code == 0x60:
        return ld_u16(v)
    if code == 0x61:
        return <int16_t>ld_u16(v)
    if code == 0x70:
        return ld_u32(v)
    if code == 0x71:
        return <int32_t>ld_u32(v)
    if code == REC_FLOAT:
        u32 = ld_u32(v)
        memcpy(&f32, &u32, 4)
        return <double>f32
    if code == REC_CHAR:
        u32 = ld_u32(v)
        return chr(u32) if u32 <= 0x10FFFF else "\ufffd"
    if code == 0x80:
        return ld_u64(v)
    if code == 0x81 or code == REC_TIMESTAMP:
        return <int64_t>ld_u64(v)
    if code == REC_DOUBLE:
        u64 = ld_u64(v)
        memcpy(&f64, &u64, 8)
        return f64
    if code == REC_UUID:
        return _rec_uuid.UUID(bytes=c_amqp_bytes(b, pos + 1, stop))
    return c_amqp_bytes(b, pos, stop)      # decimals, lists, maps, arrays, described: as encoded


cdef tuple c_amqp_properties(const unsigned char* b, Py_ssize_t pos, Py_ssize_t end):
    # (content_type, creation_time, end) of the properties list at pos, or None when it does not parse.
    cdef Py_ssize_t stop, p, nxt
    cdef uint32_t count, i
    cdef int code = b[pos], field
    cdef object content_type = None, creation_time = None
    stop = c_amqp_skip_value(b, pos, end, 0)        # checks the whole list first
    if stop < 0:
        return None
    if code != REC_LIST0:
        c_amqp_frame(b, code, pos + 1, end, &p, &count)
        for i in range(min(count, <uint32_t>(REC_CREATION_TIME + 1))):
            field = b[p]
            nxt = c_amqp_skip_value(b, p, stop, 1)
            if i == REC_CONTENT_TYPE and c_is_string(field):
                content_type = c_amqp_text(b, field, p, nxt)
            elif i == REC_CREATION_TIME and field == REC_TIMESTAMP:
                creation_time = <int64_t>ld_u64(b + p + 1)
            p = nxt
    return (content_type, creation_time, stop)


cdef Py_ssize_t c_amqp_app_properties(const unsigned char* b, Py_ssize_t pos, Py_ssize_t end,
                                      dict out) except -2:
    cdef Py_ssize_t stop, p, nxt
    cdef uint32_t count, i
    cdef int code
    stop = c_amqp_skip_value(b, pos, end, 0)
    if stop < 0:
        return -1
    c_amqp_frame(b, b[pos], pos + 1, end, &p, &count)
    for i in range(count // 2):
        code = b[p]
        if not c_is_string(code):
            return -1
        nxt = c_amqp_skip_value(b, p, stop, 1)
        key = c_amqp_text(b, code, p, nxt)
        p = nxt
        nxt = c_amqp_skip_value(b, p, stop, 1)
        out[key] = c_amqp_property(b, p, nxt)
        p = nxt
    return stop


cdef Py_ssize_t c_amqp_section(const unsigned char* b, Py_ssize_t pos, Py_ssize_t end, int* code) except -2:
    # Descriptor of the section at pos: its code in *code, the position of its value returned.
    cdef int form
    cdef uint64_t u64
    cdef Py_ssize_t p
    if pos + 2 > end or b[pos] != REC_DESCRIBED:
        return -1
    form = b[pos + 1]
    code[0] = 0
    if form == REC_SMALLULONG:
        if pos + REC_LEN_DESCRIPTOR > end:
            return -1
        code[0] = b[pos + 2]
        p = pos + REC_LEN_DESCRIPTOR
    elif form == REC_ULONG:
        if pos + REC_LEN_LONG_DESCRIPTOR > end:
            return -1
        u64 = ld_u64(b + pos + 2)
        code[0] = <int>u64 if u64 <= SEC_FOOTER else 0
        p = pos + REC_LEN_LONG_DESCRIPTOR
    elif form == REC_SYM8 or form == REC_SYM32:
        p = c_amqp_skip_body(b, form, pos + 2, end, 0)
        if p < 0:
            return -1
        code[0] = REC_SECTION_NAMES.get(c_amqp_bytes(b, c_var_start(form, pos + 1), p), 0)
    else:
        return -1
    if code[0] < SEC_HEADER or code[0] > SEC_FOOTER or p >= end:
        return -1
    return p


cdef object c_decode_message(const unsigned char* b, Py_ssize_t end):
    cdef Py_ssize_t pos = 0, p
    cdef int code, value, stage = 0, body = 0, new
    cdef bint repeat
    cdef object content_type = None, creation_time = None, app_properties = None
    cdef list sections = []
    cdef tuple fields
    if end == 0:
        return None
    while pos < end:
        p = c_amqp_section(b, pos, end, &code)
        if p < 0:
            return None
        new = REC_STAGE[code]
        repeat = stage == STAGE_BODY and ((code == SEC_DATA and body == REC_BODY_DATA)
                                          or (code == SEC_AMQP_SEQUENCE and body == REC_BODY_SEQUENCE))
        if (new <= stage and not repeat) or (code == SEC_FOOTER and stage != STAGE_BODY):
            return None
        stage = new
        value = b[p]
        if code == SEC_DATA:
            if value != REC_VBIN8 and value != REC_VBIN32:
                return None
            pos = c_amqp_skip_body(b, value, p + 1, end, 0)
            if pos < 0:
                return None
            sections.append(c_amqp_bytes(b, c_var_start(value, p), pos))
            body = REC_BODY_DATA
        elif code == SEC_AMQP_VALUE:
            pos = c_amqp_skip_value(b, p, end, 0)
            if pos < 0:
                return None
            if value == REC_VBIN8 or value == REC_VBIN32:
                sections.append(c_amqp_bytes(b, c_var_start(value, p), pos))
                body = REC_BODY_VALUE_BINARY
            elif c_is_string(value):
                sections.append(c_amqp_bytes(b, c_var_start(value, p), pos))
                body = REC_BODY_VALUE_STRING
            else:
                sections.append(c_amqp_bytes(b, p, pos))
                body = REC_BODY_VALUE
        elif code == SEC_HEADER or code == SEC_AMQP_SEQUENCE:
            if not c_is_list(value):
                return None
            pos = c_amqp_skip_value(b, p, end, 0)
            if pos < 0:
                return None
            if code == SEC_AMQP_SEQUENCE:
                sections.append(c_amqp_bytes(b, p, pos))
                body = REC_BODY_SEQUENCE
        elif code == SEC_PROPERTIES:
            if not c_is_list(value):
                return None
            fields = c_amqp_properties(b, p, end)
            if fields is None:
                return None
            content_type, creation_time, pos = fields
        elif code == SEC_APP_PROPERTIES:
            if value != REC_MAP8 and value != REC_MAP32:
                return None
            app_properties = {}
            pos = c_amqp_app_properties(b, p, end, app_properties)
            if pos < 0:
                return None
        else:                                       # annotations and footer
            if value != REC_MAP8 and value != REC_MAP32:
                return None
            pos = c_amqp_skip_value(b, p, end, 0)
            if pos < 0:
                return None
    if stage < STAGE_BODY:
        return None                                 # no body
    return (content_type, creation_time, app_properties, sections, body)


def decode_message(buf):
    """Read one record as an AMQP 1.0 message, or None when it is not a complete one.

    Returns ``(content_type, creation_time, app_properties, sections, body_kind)``; see
    :func:`riverbed.engine._pyrecord.decode_message` for every field. Pure; thread-safe.
    """
    cdef Py_buffer view
    c_get_buffer(buf, &view)
    try:
        return c_decode_message(<const unsigned char*>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)


# ---- encoding ------------------------------------------------------------------------------------------

cdef inline Py_ssize_t c_var_len(Py_ssize_t n) noexcept nogil:
    # Constructor + length field of a variable-width value of n bytes.
    return 2 if n <= 0xFF else 5


cdef inline unsigned char* c_put_var(unsigned char* o, int small, int big, const void* p,
                                     Py_ssize_t n) noexcept nogil:
    if n <= 0xFF:
        o[0] = <unsigned char>small
        o[1] = <unsigned char>n
        o += 2
    else:
        o[0] = <unsigned char>big
        st_u32(o + 1, <uint32_t>n)
        o += 5
    memcpy(o, p, n)
    return o + n


cdef inline bint c_small_compound(Py_ssize_t body, Py_ssize_t count) noexcept nogil:
    return 1 + body <= 0xFF and count <= 0xFF


cdef inline unsigned char* c_put_compound(unsigned char* o, int small, int big, Py_ssize_t body,
                                          Py_ssize_t count) noexcept nogil:
    if c_small_compound(body, count):
        o[0] = <unsigned char>small
        o[1] = <unsigned char>(1 + body)
        o[2] = <unsigned char>count
        return o + 3
    o[0] = <unsigned char>big
    st_u32(o + 1, <uint32_t>(4 + body))
    st_u32(o + 5, <uint32_t>count)
    return o + 9


cdef inline Py_ssize_t c_compound_len(Py_ssize_t body, Py_ssize_t count) noexcept nogil:
    return (3 if c_small_compound(body, count) else 9) + body


cdef bytes c_encode_message(object sections, object content_type, object creation_time, object app_properties):
    cdef bytes ct = None
    cdef Py_ssize_t ct_len = 0, fields = 0, count = 0, total = 0, i, nprops = 0, map_body = 0, n1
    cdef int64_t ms = 0
    cdef bint has_props = content_type is not None or creation_time is not None
    cdef bint has_ms = creation_time is not None
    cdef Records recs
    cdef Span* props = NULL
    cdef unsigned char* o
    cdef list keep
    if has_props:
        if content_type is not None:
            if not isinstance(content_type, str):
                raise TypeError(f"content_type must be str, not {type(content_type).__name__}")
            ct = (<str>content_type).encode("ascii")    # a symbol is ASCII: UnicodeEncodeError (a ValueError)
            ct_len = len(ct)
            fields = REC_CONTENT_TYPE + c_var_len(ct_len) + ct_len
        else:
            fields = REC_CONTENT_TYPE + 1
        count = REC_CONTENT_TYPE + 1
        if has_ms:
            n = PyNumber_Index(creation_time)
            if not -0x8000000000000000 <= n <= 0x7FFFFFFFFFFFFFFF:
                raise OverflowError(f"creation_time {n} ms does not fit in an AMQP timestamp (int64)")
            ms = n
            fields += 2 + 9
            count = REC_CREATION_TIME + 1
        total += REC_LEN_DESCRIPTOR + c_compound_len(fields, count)
    c_records_init(&recs)
    try:
        if app_properties:
            # keys and values as UTF-8 or byte spans, pinned by `keep` until the copy below
            nprops = len(app_properties)
            props = <Span*>PyMem_Malloc(2 * nprops * sizeof(Span) + 1)
            if props == NULL:
                raise MemoryError()
            keep = []
            i = 0
            for key, value in app_properties.items():
                if i >= 2 * nprops:
                    raise RuntimeError("dictionary changed size during iteration")
                if not isinstance(key, str):
                    raise TypeError(f"application property key must be str, not {type(key).__name__}")
                props[i].p = <const unsigned char*>_unicode_utf8(key, &props[i].n)
                if isinstance(value, str):
                    props[i + 1].p = <const unsigned char*>_unicode_utf8(value, &props[i + 1].n)
                    props[i + 1].n = ~props[i + 1].n          # a str value: marked by the one's complement
                else:
                    if not isinstance(value, bytes):
                        try:
                            value = bytes(memoryview(value))
                        except TypeError:
                            raise TypeError(f"application property {key!r} must be str or bytes-like, "
                                            f"not {type(value).__name__}") from None
                        keep.append(value)
                    props[i + 1].p = <const unsigned char*>PyBytes_AS_STRING(value)
                    props[i + 1].n = len(<bytes>value)
                map_body += c_var_len(props[i].n) + props[i].n
                n1 = props[i + 1].n if props[i + 1].n >= 0 else ~props[i + 1].n
                map_body += c_var_len(n1) + n1
                i += 2
            nprops = i // 2
            total += REC_LEN_DESCRIPTOR + c_compound_len(map_body, 2 * nprops)
        c_records_open(tuple(sections), &recs)
        if recs.count == 0:
            raise ValueError("an AMQP message needs at least one data section")
        for i in range(recs.count):
            total += REC_LEN_DESCRIPTOR + c_var_len(recs.spans[i].n) + recs.spans[i].n
        out = c_new_bytes(total)
        o = <unsigned char*>PyBytes_AS_STRING(out)
        if has_props:
            o[0] = REC_DESCRIBED
            o[1] = REC_SMALLULONG
            o[2] = SEC_PROPERTIES
            o = c_put_compound(o + 3, REC_LIST8, REC_LIST32, fields, count)
            memset(o, REC_NULL, REC_CONTENT_TYPE)
            o += REC_CONTENT_TYPE
            if ct is None:
                o[0] = REC_NULL
                o += 1
            else:
                o = c_put_var(o, REC_SYM8, REC_SYM32, PyBytes_AS_STRING(ct), ct_len)
            if has_ms:
                o[0] = REC_NULL
                o[1] = REC_NULL
                o[2] = REC_TIMESTAMP
                st_u64(o + 3, <uint64_t>ms)
                o += 11
        if nprops:
            o[0] = REC_DESCRIBED
            o[1] = REC_SMALLULONG
            o[2] = SEC_APP_PROPERTIES
            o = c_put_compound(o + 3, REC_MAP8, REC_MAP32, map_body, 2 * nprops)
            for i in range(0, 2 * nprops, 2):
                o = c_put_var(o, REC_STR8, REC_STR32, props[i].p, props[i].n)
                if props[i + 1].n < 0:
                    o = c_put_var(o, REC_STR8, REC_STR32, props[i + 1].p, ~props[i + 1].n)
                else:
                    o = c_put_var(o, REC_VBIN8, REC_VBIN32, props[i + 1].p, props[i + 1].n)
        for i in range(recs.count):
            o[0] = REC_DESCRIBED
            o[1] = REC_SMALLULONG
            o[2] = SEC_DATA
            o = c_put_var(o + 3, REC_VBIN8, REC_VBIN32, recs.spans[i].p, recs.spans[i].n)
        return out
    finally:
        c_records_close(&recs)
        PyMem_Free(props)


def encode_message(sections, content_type=None, creation_time=None, app_properties=None):
    """One AMQP 1.0 bare message as ``bytes``: properties (content-type, creation-time),
    application-properties, one data section per frame of ``sections``. See
    :func:`riverbed.engine._pyrecord.encode_message` for the arguments and the errors. Pure; thread-safe.
    """
    return c_encode_message(sections, content_type, creation_time, app_properties)


# ---- payload sniffing ----------------------------------------------------------------------------------

cdef inline bint c_json_space(unsigned char c) noexcept nogil:
    return c == 0x20 or c == 0x09 or c == 0x0A or c == 0x0D


cdef int c_payload_kind(const unsigned char* p, Py_ssize_t n) except -1:
    cdef Py_ssize_t a = 0, z = n
    while a < z and c_json_space(p[a]):
        a += 1
    while z > a and c_json_space(p[z - 1]):
        z -= 1
    # The braces are the cheap test; only a payload that passes it is parsed, by Python's json as in the twin.
    if z - a >= 2 and p[a] == 0x7B and p[z - 1] == 0x7D:
        try:
            REC_JSON.decode(PyUnicode_DecodeUTF8(<const char*>p, n, NULL))
            return REC_KIND_JSON
        except (ValueError, RecursionError):
            pass
    if n >= REC_LEN_BSON_MIN and ld_i32le(p) == n and p[n - 1] == 0:
        return REC_KIND_BSON
    return REC_KIND_BYTES


def payload_kind(buf):
    """What a payload with no telling content-type is: KIND_JSON, KIND_BSON or KIND_BYTES. See
    :func:`riverbed.engine._pyrecord.payload_kind`. Pure; thread-safe."""
    cdef Py_buffer view
    c_get_buffer(buf, &view)
    try:
        return c_payload_kind(<const unsigned char*>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
