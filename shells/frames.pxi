# Length-prefixed frame splitters for the socket read loops (RabbitMQ Stream: u32 BE excluding itself;
# BSON: i32 LE including itself). _pywire.py is the readable reference.

cdef int64_t c_frame_cap(object max_size) except? -2:
    # Frame lengths are 32-bit, so any cap is equivalent to one clamped into [-1, 2**32 - 1]; for a
    # non-integer cap x, "n > x" equals "n > floor(x)" for integer n.
    if max_size >= 0xFFFFFFFF:
        return 0xFFFFFFFF
    if max_size < 0:
        return -1
    return <int64_t>(max_size if type(max_size) is int else math.floor(max_size))


cdef int c_split_frames(const unsigned char* p, Py_ssize_t end, int64_t cap, object max_size, list frames,
                        Py_ssize_t* consumed, int view_key=-1, object mv=None) except -1:
    cdef Py_ssize_t pos = 0
    cdef int64_t n
    cdef PyObject* frame
    cdef int rc
    while end - pos >= 4:
        n = ld_u32(p + pos)
        # Refuse on the prefix alone: the peer must not make us buffer an oversized frame first.
        if n > cap:
            raise FrameTooLarge(f"frame of {n} bytes is over the {max_size}-byte limit", n)
        if end - pos - 4 < n:
            break
        if view_key >= 0 and n >= 2 and ((<int>p[pos + 4] << 8) | p[pos + 5]) == view_key:
            frames.append(mv[pos + 4:pos + 4 + n])
            pos += 4 + n
            continue
        frame = _bytes_new(<const char*>(p + pos + 4), <Py_ssize_t>n)
        if frame == NULL:
            return -1
        rc = _list_append(<PyObject*>frames, frame)
        _decref(frame)
        if rc < 0:
            return -1
        pos += 4 + n
    consumed[0] = pos
    return 0


cdef int c_split_bson_frames(const unsigned char* p, Py_ssize_t end, int64_t cap, object max_size, list frames,
                             Py_ssize_t* consumed) except -1:
    cdef Py_ssize_t pos = 0
    cdef int64_t n
    cdef PyObject* frame
    cdef int rc
    while end - pos >= 4:
        n = ld_i32le(p + pos)
        if n < 5:
            raise FrameError(f"BSON document length {n} is below the 5-byte minimum", n)
        if n > cap:
            raise FrameTooLarge(f"BSON document of {n} bytes is over the {max_size}-byte limit", n)
        if end - pos < n:
            break
        frame = _bytes_new(<const char*>(p + pos), <Py_ssize_t>n)
        if frame == NULL:
            return -1
        rc = _list_append(<PyObject*>frames, frame)
        _decref(frame)
        if rc < 0:
            return -1
        pos += n
    consumed[0] = pos
    return 0


def split_frames(buf, max_size, view_key=None):
    """Split RabbitMQ Stream frames: ``uint32 BE size (excluding itself) | payload``.

    Returns ``(frames, consumed)``: the complete payloads as ``bytes`` and how many bytes of ``buf`` they
    used; an incomplete tail is left for the next call. A declared size over ``max_size`` raises
    FrameTooLarge before any of that frame is buffered. Payloads whose 16-bit key is ``view_key`` come
    as memoryviews of ``buf`` instead of copies (big Publish frames): the caller must then not change
    ``buf`` while it uses them.
    """
    cdef Py_buffer view
    cdef Py_ssize_t consumed = 0
    cdef int64_t cap = c_frame_cap(max_size)
    cdef list frames = []
    cdef int vk = -1 if view_key is None else <int>view_key
    c_get_buffer(buf, &view)
    try:
        c_split_frames(<const unsigned char*>view.buf, view.len, cap, max_size, frames, &consumed, vk,
                       memoryview(buf) if vk >= 0 else None)
    finally:
        PyBuffer_Release(&view)
    return frames, consumed


def split_bson_frames(buf, max_size):
    """Split BSON documents: ``int32 LE size (including itself) | ...``. Same contract as split_frames;
    ``frames`` hold whole documents (length prefix included)."""
    cdef Py_buffer view
    cdef Py_ssize_t consumed = 0
    cdef int64_t cap = c_frame_cap(max_size)
    cdef list frames = []
    c_get_buffer(buf, &view)
    try:
        c_split_bson_frames(<const unsigned char*>view.buf, view.len, cap, max_size, frames, &consumed)
    finally:
        PyBuffer_Release(&view)
    return frames, consumed
