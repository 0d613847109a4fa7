# Big-endian / little-endian loads and stores. Written as shifts so they are alignment-safe; gcc -O3 turns
# each into a single load + bswap.

cdef inline uint16_t ld_u16(const unsigned char* p) noexcept nogil:
    return <uint16_t>((<uint16_t>p[0] << 8) | p[1])


cdef inline uint32_t ld_u32(const unsigned char* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef inline uint64_t ld_u64(const unsigned char* p) noexcept nogil:
    return (<uint64_t>ld_u32(p) << 32) | ld_u32(p + 4)


cdef inline int32_t ld_i32le(const unsigned char* p) noexcept nogil:
    return <int32_t>((<uint32_t>p[3] << 24) | (<uint32_t>p[2] << 16) | (<uint32_t>p[1] << 8) | <uint32_t>p[0])


cdef inline uint32_t c_ld_u32le(const unsigned char* p) noexcept nogil:
    return (<uint32_t>p[3] << 24) | (<uint32_t>p[2] << 16) | (<uint32_t>p[1] << 8) | <uint32_t>p[0]


cdef inline int64_t c_ld_i64le(const unsigned char* p) noexcept nogil:
    return <int64_t>((<uint64_t>c_ld_u32le(p + 4) << 32) | c_ld_u32le(p))


cdef inline void st_u16(unsigned char* p, uint16_t v) noexcept nogil:
    p[0] = <unsigned char>(v >> 8)
    p[1] = <unsigned char>v


cdef inline void st_u32(unsigned char* p, uint32_t v) noexcept nogil:
    p[0] = <unsigned char>(v >> 24)
    p[1] = <unsigned char>(v >> 16)
    p[2] = <unsigned char>(v >> 8)
    p[3] = <unsigned char>v


cdef inline void st_u64(unsigned char* p, uint64_t v) noexcept nogil:
    st_u32(p, <uint32_t>(v >> 32))
    st_u32(p + 4, <uint32_t>v)


cdef inline int c_get_buffer(object obj, Py_buffer* view) except -1:
    # PyBUF_SIMPLE: contiguous bytes whatever the exporter's item format, so len == nbytes (what b"".join
    # and zlib see), and read-only exporters such as bytes are accepted.
    return PyObject_GetBuffer(obj, view, PyBUF_SIMPLE)


cdef inline bytes c_new_bytes(Py_ssize_t n):
    # Uninitialised result, filled in place: the one allocation of every encoder.
    return PyBytes_FromStringAndSize(NULL, n)


def receive_buffer(Py_ssize_t size):
    """A ``bytearray`` of ``size`` bytes whose contents are NOT initialised: for a buffer a socket read
    fills before anyone reads it (a cluster member's receive buffer, shells/cluster/wire.py), where
    ``bytearray(size)`` would zero every byte first. Raises ValueError for a negative size."""
    if size < 0:
        raise ValueError("negative size")
    return PyByteArray_FromStringAndSize(NULL, size)
