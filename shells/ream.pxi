# REAM: the run of plain pipelined EVENT PUBLISH requests in one received buffer. _pyream.py is the
# readable reference (its docstring is the spec).

cdef bytes REAM_PUBLISH_PREFIX = b"EVENT PUBLISH "

cdef enum:
    REAM_LEN_PREFIX = 14          # len(b"EVENT PUBLISH ")
    REAM_MAX_SIZE_DIGITS = 12     # codec.SIZE_RE: a declared size has 1..12 digits


cdef inline bint ream_plain_name_byte(unsigned char b) nogil:
    return 0x21 <= b <= 0x7E and b != 0x22


def ream_publish_run(buf, Py_ssize_t pos, max_payload, Py_ssize_t max_count):
    """The run of plain ``EVENT PUBLISH <stream> <size>\\n<payload>\\n`` requests at ``buf[pos:]``:
    ``(name, payloads, ends)``, or ``(None, [], [])``. See ``_pyream.ream_publish_run``."""
    cdef Py_buffer view
    cdef const unsigned char* p
    cdef const unsigned char* nl
    cdef Py_ssize_t n, i, j, k, m, start, stop, name_at = 0, name_len = -1, count = 0
    cdef int64_t size, cap
    cdef list payloads = []
    cdef list ends = []
    cdef PyObject* item
    cdef int rc
    # sizes have at most 12 digits, so any cap at or above 10**12 lets every size through
    cap = 10 ** 12 if max_payload >= 10 ** 12 else (<int64_t>max_payload if max_payload >= 0 else -1)
    c_get_buffer(buf, &view)
    try:
        p = <const unsigned char*>view.buf
        n = view.len
        if pos < 0:
            pos = n
        while count < max_count and pos < n:
            if n - pos < REAM_LEN_PREFIX or memcmp(p + pos, <const char*>REAM_PUBLISH_PREFIX,
                                                   REAM_LEN_PREFIX) != 0:
                break
            i = pos + REAM_LEN_PREFIX
            j = i
            while j < n and ream_plain_name_byte(p[j]):
                j += 1
            if j == i or j >= n or p[j] != 0x20:
                break
            if name_len < 0:
                name_at = i
                name_len = j - i
            elif j - i != name_len or memcmp(p + i, p + name_at, name_len) != 0:
                break
            k = j + 1
            m = k
            size = 0
            while m < n and 0x30 <= p[m] <= 0x39 and m - k < REAM_MAX_SIZE_DIGITS + 1:
                size = size * 10 + (p[m] - 0x30)
                m += 1
            if m == k or m - k > REAM_MAX_SIZE_DIGITS or m >= n or p[m] != 0x0A:
                break
            if size > cap:
                break
            start = m + 1
            stop = start + <Py_ssize_t>size
            if stop >= n or p[stop] != 0x0A:
                break
            if size > 0:
                nl = <const unsigned char*>memchr(p + start, 0x0A, <size_t>size)
                if nl != NULL:
                    break
            item = _bytes_new(<const char*>(p + start), stop - start)
            if item == NULL:
                raise MemoryError()
            rc = _list_append(<PyObject*>payloads, item)
            _decref(item)
            if rc < 0:
                raise MemoryError()
            pos = stop + 1
            ends.append(pos)
            count += 1
        if count == 0:
            return None, [], []
        return PyBytes_FromStringAndSize(<const char*>(p + name_at), name_len), payloads, ends
    finally:
        PyBuffer_Release(&view)
