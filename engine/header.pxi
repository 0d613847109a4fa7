# The 48-byte chunk header as a C struct and its writer (layout: riverbed.engine.format). Shared by the
# engine's chunk encoders (chunk.pxi) and the shells' wire module, whose Publish path builds a sealed
# chunk in one pass; the including module defines HDR_LEN and MAGIC and checks them against format.py.

cdef struct Header:
    uint8_t magic
    uint8_t ctype
    uint16_t entries
    uint32_t records
    int64_t timestamp
    uint64_t epoch
    uint64_t chunk_id
    uint32_t crc
    uint32_t data_len
    uint32_t trailer_len
    uint8_t bloom


cdef void c_put_header(unsigned char* p, const Header* h) noexcept nogil:
    p[0] = h.magic
    p[1] = h.ctype
    st_u16(p + 2, h.entries)
    st_u32(p + 4, h.records)
    st_u64(p + 8, <uint64_t>h.timestamp)
    st_u64(p + 16, h.epoch)
    st_u64(p + 24, h.chunk_id)
    st_u32(p + 32, h.crc)
    st_u32(p + 36, h.data_len)
    st_u32(p + 40, h.trailer_len)
    p[44] = h.bloom
    p[45] = 0
    p[46] = 0
    p[47] = 0
