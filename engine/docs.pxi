# Document store: predicate programs evaluated over raw BSON documents, and index values read out of raw
# BSON, without decoding the document. _pydocs.py is the readable reference: its docstrings are the spec
# (program format, kinds, three-valued results) for everything here.

from libc.string cimport memchr, memcmp
from cpython.unicode cimport PyUnicode_DecodeUTF8

from riverbed.engine import predicate as _predicate_mod

cdef enum:
    DOP_TRUE = 0
    DOP_FALSE = 1
    DOP_AND = 2
    DOP_OR = 3
    DOP_NOT = 4
    DOP_CMP = 5
    DOP_EXISTS = 6
    DOP_CONTAINS = 7
    DOP_REGEX = 8
    DOP_UNSURE = 9
    DCMP_EQ = 0
    DCMP_LT = 1
    DCMP_LE = 2
    DCMP_GT = 3
    DCMP_GE = 4
    DK_NULL = 1
    DK_NUM = 2
    DK_STR = 4
    DK_BOOL = 8
    DK_OTHER = 16
    # literal types of a CMP node
    DL_NULL = 0
    DL_BOOL = 1
    DL_INT = 2
    DL_DBL = 3
    DL_STR = 4
    DMAX_DEPTH = 500         # _pydocs.MAX_DEPTH

if ((_predicate_mod.OP_TRUE, _predicate_mod.OP_FALSE, _predicate_mod.OP_AND, _predicate_mod.OP_OR,
     _predicate_mod.OP_NOT, _predicate_mod.OP_CMP, _predicate_mod.OP_EXISTS, _predicate_mod.OP_CONTAINS,
     _predicate_mod.OP_REGEX, _predicate_mod.OP_UNSURE) != tuple(range(10))
        or (_predicate_mod.CMP_EQ, _predicate_mod.CMP_LT, _predicate_mod.CMP_LE, _predicate_mod.CMP_GT,
            _predicate_mod.CMP_GE) != tuple(range(5))
        or (_predicate_mod.K_NULL, _predicate_mod.K_NUM, _predicate_mod.K_STR, _predicate_mod.K_BOOL,
            _predicate_mod.K_OTHER) != (1, 2, 4, 8, 16)):
    raise ImportError("riverbed.engine.predicate and docs.pxi disagree on the matcher program: rebuild _core")


cdef struct DNode:
    int op
    int cmp
    int lit
    int kinds
    int64_t li
    double ld
    const unsigned char* ls
    Py_ssize_t ln
    int path0
    int npath
    int kid0
    int nkid
    PyObject* regex          # borrowed: DocMatcher.keep holds the reference


cdef inline double c_ld_f64le(const unsigned char* p) noexcept nogil:
    cdef uint64_t u = (<uint64_t>c_ld_u32le(p + 4) << 32) | c_ld_u32le(p)
    cdef double d
    memcpy(&d, &u, 8)
    return d


cdef inline int c_bson_kind(int t) noexcept nogil:
    if t == 0x0A or t == 0x06:
        return DK_NULL
    if t == 0x01 or t == 0x10 or t == 0x12:
        return DK_NUM
    if t == 0x02 or t == 0x0E:
        return DK_STR
    if t == 0x08:
        return DK_BOOL
    return DK_OTHER


cdef Py_ssize_t c_bson_value_size(int t, const unsigned char* p, Py_ssize_t avail) noexcept nogil:
    # Bytes taken by a value of BSON type t at p, which must end within avail bytes; -1 when malformed.
    cdef Py_ssize_t n
    cdef int32_t s
    cdef const unsigned char* z
    if t == 0x01 or t == 0x09 or t == 0x11 or t == 0x12:
        n = 8
    elif t == 0x06 or t == 0x0A or t == 0xFF or t == 0x7F:
        n = 0
    elif t == 0x07:
        n = 12
    elif t == 0x08:
        n = 1
    elif t == 0x10:
        n = 4
    elif t == 0x13:
        n = 16
    elif t == 0x02 or t == 0x0D or t == 0x0E:
        if avail < 4:
            return -1
        s = ld_i32le(p)
        if s < 1 or s > avail - 4:
            return -1
        n = 4 + <Py_ssize_t>s
    elif t == 0x03 or t == 0x04 or t == 0x0F:
        if avail < 5:
            return -1
        s = ld_i32le(p)
        if s < 5:
            return -1
        n = s
    elif t == 0x05:
        if avail < 5:
            return -1
        s = ld_i32le(p)
        if s < 0:
            return -1
        n = 5 + <Py_ssize_t>s
    elif t == 0x0B:
        z = <const unsigned char*>memchr(p, 0, avail)
        if z == NULL:
            return -1
        z = <const unsigned char*>memchr(z + 1, 0, avail - (z + 1 - p))
        if z == NULL:
            return -1
        n = z + 1 - p
    elif t == 0x0C:
        if avail < 4:
            return -1
        s = ld_i32le(p)
        if s < 1:
            return -1
        n = 4 + <Py_ssize_t>s + 12
    else:
        return -1
    if n > avail:
        return -1
    return n


cdef int c_bson_find(const unsigned char* doc, Py_ssize_t length, const unsigned char** parts,
                     const Py_ssize_t* plens, int nparts, int* t_out, const unsigned char** v_out,
                     Py_ssize_t* n_out) noexcept nogil:
    # 1 found (type, value pointer and size set), 0 missing, -1 malformed. See _pydocs._find.
    cdef int depth, t = 0
    cdef int32_t dlen
    cdef Py_ssize_t pos, end, klen, size = 0
    cdef const unsigned char* z = NULL
    cdef bint hit
    for depth in range(nparts):
        if length < 5:
            return -1
        dlen = ld_i32le(doc)
        if dlen < 5 or dlen > length:
            return -1
        end = dlen - 1
        pos = 4
        hit = False
        while pos < end:
            t = doc[pos]
            if end - pos - 1 <= 0:
                return -1
            z = <const unsigned char*>memchr(doc + pos + 1, 0, end - pos - 1)
            if z == NULL:
                return -1
            klen = z - (doc + pos + 1)
            size = c_bson_value_size(t, z + 1, end - (z + 1 - doc))
            if size < 0:
                return -1
            if klen == plens[depth] and memcmp(doc + pos + 1, parts[depth], klen) == 0:
                hit = True
                break
            pos = (z + 1 - doc) + size
        if not hit:
            return 0
        if depth == nparts - 1:
            t_out[0] = t
            v_out[0] = z + 1
            n_out[0] = size
            return 1
        if t != 0x03 and t != 0x04:
            return 0
        doc = z + 1
        length = size
    return 0


cdef inline int c_sign_i_d(int64_t i, double d) noexcept nogil:
    # sign of i - d, exactly; 2 when d is NaN
    cdef int64_t t
    cdef double fr
    if d != d:
        return 2
    if d >= 9223372036854775808.0:
        return -1
    if d < -9223372036854775808.0:
        return 1
    t = <int64_t>d
    if i < t:
        return -1
    if i > t:
        return 1
    fr = d - <double>t
    if fr > 0:
        return -1
    if fr < 0:
        return 1
    return 0


cdef inline int c_cmp_res(int s, int cmp) noexcept nogil:
    if s == 2:
        return 0
    if cmp == DCMP_EQ:
        return s == 0
    if cmp == DCMP_LT:
        return s < 0
    if cmp == DCMP_LE:
        return s <= 0
    if cmp == DCMP_GT:
        return s > 0
    return s >= 0


cdef inline int c_sign_bytes(const unsigned char* a, Py_ssize_t na, const unsigned char* b,
                             Py_ssize_t nb) noexcept nogil:
    cdef int r = memcmp(a, b, na if na < nb else nb)
    if r != 0:
        return -1 if r < 0 else 1
    return -1 if na < nb else (1 if na > nb else 0)


cdef bint c_contains(const unsigned char* h, Py_ssize_t nh, const unsigned char* needle,
                     Py_ssize_t nn) noexcept nogil:
    cdef const unsigned char* p = h
    cdef const unsigned char* last
    if nn == 0:
        return True
    if nn > nh:
        return False
    last = h + nh - nn
    while p <= last:
        p = <const unsigned char*>memchr(p, needle[0], last - p + 1)
        if p == NULL:
            return False
        if memcmp(p, needle, nn) == 0:
            return True
        p += 1
    return False


cdef class DocMatcher:
    """Compiled twin of :class:`riverbed.engine._pydocs.DocMatcher`: a predicate program ready to run over
    raw BSON documents. Immutable once built; ``match`` may run on any thread."""

    cdef DNode* nodes
    cdef int nnodes
    cdef int root
    cdef int* kids
    cdef const unsigned char** parts
    cdef Py_ssize_t* plens
    cdef list keep
    cdef readonly object program

    def __cinit__(self, *args, **kwargs):
        self.nodes = NULL
        self.kids = NULL
        self.parts = NULL
        self.plens = NULL

    def __init__(self, program):
        cdef list nodes = []
        cdef list kids = []
        cdef list parts = []
        cdef Py_ssize_t i
        cdef DNode* d
        self.keep = []
        self.root = self._add(program, nodes, kids, parts, 0)
        self.nnodes = len(nodes)
        self.nodes = <DNode*>PyMem_Malloc(sizeof(DNode) * self.nnodes)
        self.kids = <int*>PyMem_Malloc(sizeof(int) * (len(kids) + 1))
        self.parts = <const unsigned char**>PyMem_Malloc(sizeof(const unsigned char*) * (len(parts) + 1))
        self.plens = <Py_ssize_t*>PyMem_Malloc(sizeof(Py_ssize_t) * (len(parts) + 1))
        if self.nodes == NULL or self.kids == NULL or self.parts == NULL or self.plens == NULL:
            raise MemoryError()
        for i in range(len(kids)):
            self.kids[i] = kids[i]
        for i in range(len(parts)):
            self.parts[i] = <const unsigned char*>PyBytes_AS_STRING(parts[i])
            self.plens[i] = len(<bytes>parts[i])
        self.keep.extend(parts)
        for i in range(self.nnodes):
            rec = nodes[i]
            d = &self.nodes[i]
            d.op = rec[0]
            d.cmp = rec[1]
            d.lit = rec[2]
            d.kinds = rec[3]
            d.li = rec[4]
            d.ld = rec[5]
            d.ls = NULL
            d.ln = 0
            if rec[6] is not None:
                self.keep.append(rec[6])
                d.ls = <const unsigned char*>PyBytes_AS_STRING(rec[6])
                d.ln = len(<bytes>rec[6])
            d.path0 = rec[7]
            d.npath = rec[8]
            d.kid0 = rec[9]
            d.nkid = rec[10]
            d.regex = NULL
            if rec[11] is not None:
                self.keep.append(rec[11])
                d.regex = <PyObject*>rec[11]
        self.program = program

    def __dealloc__(self):
        PyMem_Free(self.nodes)
        PyMem_Free(self.kids)
        PyMem_Free(<void*>self.parts)
        PyMem_Free(self.plens)

    cdef int _add(self, object p, list nodes, list kids, list parts, int depth) except -1:
        cdef int op
        if depth > DMAX_DEPTH:
            raise ValueError("matcher program nested too deeply")
        if type(p) is not tuple or len(p) == 0 or type(p[0]) is not int:
            raise ValueError(f"bad matcher program node {p!r}")
        op = p[0]
        # op cmp lit kinds li ld ls path0 npath kid0 nkid regex
        rec = [op, 0, 0, 0, 0, 0.0, None, 0, 0, 0, 0, None]
        if (op == DOP_TRUE or op == DOP_FALSE) and len(p) == 1:
            pass
        elif (op == DOP_AND or op == DOP_OR) and len(p) == 2 and type(p[1]) is tuple:
            idx = [self._add(c, nodes, kids, parts, depth + 1) for c in p[1]]
            rec[9] = len(kids)
            rec[10] = len(idx)
            kids.extend(idx)
        elif op == DOP_NOT and len(p) == 2:
            i = self._add(p[1], nodes, kids, parts, depth + 1)
            rec[9] = len(kids)
            rec[10] = 1
            kids.append(i)
        elif DOP_CMP <= op <= DOP_UNSURE:
            path = p[1] if len(p) > 1 else None
            if type(path) is not tuple or not path or not all(type(c) is bytes for c in path):
                raise ValueError(f"bad path in matcher program node {p!r}")
            rec[7] = len(parts)
            rec[8] = len(path)
            ok = False
            if op == DOP_CMP and len(p) == 4 and type(p[2]) is int and DCMP_EQ <= p[2] <= DCMP_GE:
                rec[1] = p[2]
                lit = p[3]
                ok = True
                if lit is None:
                    rec[2] = DL_NULL
                elif type(lit) is bool:
                    rec[2] = DL_BOOL
                    rec[4] = 1 if lit else 0
                elif type(lit) is float:
                    rec[2] = DL_DBL
                    rec[5] = lit
                elif type(lit) is bytes:
                    rec[2] = DL_STR
                    rec[6] = lit
                elif type(lit) is int and -(1 << 63) <= lit < (1 << 63):
                    rec[2] = DL_INT
                    rec[4] = lit
                else:
                    ok = False
            elif op == DOP_EXISTS and len(p) == 2:
                ok = True
            elif op == DOP_CONTAINS and len(p) == 3 and type(p[2]) is bytes:
                rec[6] = p[2]
                ok = True
            elif op == DOP_REGEX and len(p) == 3 and hasattr(p[2], "search"):
                rec[11] = p[2]
                ok = True
            elif op == DOP_UNSURE and len(p) == 3 and type(p[2]) is int:
                rec[3] = p[2]
                ok = True
            if not ok:
                raise ValueError(f"bad matcher program node {p!r}")
            parts.extend(path)
        else:
            raise ValueError(f"bad matcher program node {p!r}")
        nodes.append(rec)
        return len(nodes) - 1

    cdef int c_eval(self, int i, const unsigned char* b, Py_ssize_t n) except -2:
        cdef DNode* d = &self.nodes[i]
        cdef int k, r, res, t = 0, kind, s
        cdef const unsigned char* v = NULL
        cdef Py_ssize_t size = 0
        cdef int64_t iv
        cdef double dv
        if d.op == DOP_TRUE:
            return 1
        if d.op == DOP_FALSE:
            return 0
        if d.op == DOP_AND:
            res = 1
            for k in range(d.kid0, d.kid0 + d.nkid):
                r = self.c_eval(self.kids[k], b, n)
                if r == 0:
                    return 0
                if r < 0:
                    res = -1
            return res
        if d.op == DOP_OR:
            res = 0
            for k in range(d.kid0, d.kid0 + d.nkid):
                r = self.c_eval(self.kids[k], b, n)
                if r == 1:
                    return 1
                if r < 0:
                    res = -1
            return res
        if d.op == DOP_NOT:
            r = self.c_eval(self.kids[d.kid0], b, n)
            return r if r < 0 else 1 - r
        r = c_bson_find(b, n, self.parts + d.path0, self.plens + d.path0, d.npath, &t, &v, &size)
        if r < 0:
            return -1
        if d.op == DOP_EXISTS:
            return r
        if r == 0:
            return 0
        kind = c_bson_kind(t)
        if d.op == DOP_CMP:
            if d.lit == DL_NULL:
                return kind == DK_NULL and (d.cmp == DCMP_EQ or d.cmp == DCMP_LE or d.cmp == DCMP_GE)
            if d.lit == DL_BOOL:
                if kind != DK_BOOL:
                    return 0
                s = (v[0] != 0) - <int>d.li
                return c_cmp_res(s, d.cmp)
            if d.lit == DL_STR:
                if kind != DK_STR:
                    return 0
                return c_cmp_res(c_sign_bytes(v + 4, ld_i32le(v) - 1, d.ls, d.ln), d.cmp)
            if kind != DK_NUM:
                return 0
            if t == 0x01:
                dv = c_ld_f64le(v)
                if d.lit == DL_DBL:
                    s = 2 if (dv != dv or d.ld != d.ld) else (-1 if dv < d.ld else (1 if dv > d.ld else 0))
                else:
                    s = c_sign_i_d(d.li, dv)
                    s = s if s == 2 else -s
                return c_cmp_res(s, d.cmp)
            iv = ld_i32le(v) if t == 0x10 else c_ld_i64le(v)
            if d.lit == DL_DBL:
                s = c_sign_i_d(iv, d.ld)
            else:
                s = -1 if iv < d.li else (1 if iv > d.li else 0)
            return c_cmp_res(s, d.cmp)
        if d.op == DOP_CONTAINS:
            return kind == DK_STR and c_contains(v + 4, ld_i32le(v) - 1, d.ls, d.ln)
        if d.op == DOP_REGEX:
            if kind != DK_STR:
                return 0
            try:
                text = PyUnicode_DecodeUTF8(<const char*>v + 4, ld_i32le(v) - 1, NULL)
            except UnicodeDecodeError:
                return -1
            return (<object>d.regex).search(text) is not None
        # DOP_UNSURE
        return -1 if (kind & d.kinds) else 0

    def match(self, raw):
        """1, 0 or -1 (unknown) for the BSON document ``raw`` (any bytes-like)."""
        cdef Py_buffer view
        c_get_buffer(raw, &view)
        try:
            return self.c_eval(self.root, <const unsigned char*>view.buf, view.len)
        finally:
            PyBuffer_Release(&view)


def bson_values(raw, paths):
    """Compiled twin of :func:`riverbed.engine._pydocs.bson_values`."""
    cdef Py_buffer view
    cdef const unsigned char* cparts[64]
    cdef Py_ssize_t clens[64]
    cdef Py_ssize_t j, n
    cdef int r, t = 0
    cdef const unsigned char* v = NULL
    cdef Py_ssize_t size = 0
    cdef list out = []
    c_get_buffer(raw, &view)
    try:
        for path in paths:
            n = len(path)
            if n > 64:
                raise ValueError("a path has at most 64 components")
            for j in range(n):
                part = path[j]
                if type(part) is not bytes:
                    raise TypeError("path components must be bytes")
                cparts[j] = <const unsigned char*>PyBytes_AS_STRING(part)
                clens[j] = len(<bytes>part)
            r = c_bson_find(<const unsigned char*>view.buf, view.len, cparts, clens, <int>n, &t, &v, &size) \
                if n > 0 else 0
            if r < 0:
                raise ValueError("malformed BSON document")
            if r == 0:
                out.append(...)
            elif t == 0x0A or t == 0x06:
                out.append(None)
            elif t == 0x08:
                out.append(v[0] != 0)
            elif t == 0x01:
                out.append(c_ld_f64le(v))
            elif t == 0x10:
                out.append(<int32_t>ld_i32le(v))
            elif t == 0x12:
                out.append(c_ld_i64le(v))
            elif t == 0x02 or t == 0x0E:
                out.append(PyUnicode_DecodeUTF8(<const char*>v + 4, ld_i32le(v) - 1, NULL))
            else:
                out.append(...)
        return out
    finally:
        PyBuffer_Release(&view)


cdef enum:
    DSTRING_CUT = 120        # dockeys.STRING_CUT

from riverbed.engine import dockeys as _dockeys_mod
if _dockeys_mod.STRING_CUT != DSTRING_CUT:
    raise ImportError("riverbed.engine.dockeys and docs.pxi disagree on the string key cut: rebuild _core")

cdef extern from "math.h" nogil:
    double nextafter(double x, double y)
    const double INFINITY


cdef bytes c_number_key(double d, uint64_t extra):
    # dockeys.number_key of the number d + extra, d being the largest double <= it
    cdef unsigned char buf[12]
    cdef uint64_t u
    cdef Py_ssize_t n = 10
    if d == 0:
        d = 0.0
    memcpy(&u, &d, 8)
    if u >> 63:
        u = ~u
    else:
        u |= (<uint64_t>1) << 63
    buf[0] = 0x10
    st_u64(buf + 1, u)
    buf[9] = 0
    if extra:
        if extra < 256:
            buf[9] = 1
            buf[10] = <unsigned char>extra
            n = 11
        else:                       # an int64's excess over its double is below 2**11
            buf[9] = 2
            buf[10] = <unsigned char>(extra >> 8)
            buf[11] = <unsigned char>extra
            n = 12
    return PyBytes_FromStringAndSize(<char*>buf, n)


cdef object c_value_key(int t, const unsigned char* v):
    # dockeys.value_key of the BSON value of type t at v, straight from its bytes; None when it has none
    cdef unsigned char buf[2 * DSTRING_CUT + 4]
    cdef Py_ssize_t n, i, sl, cut
    cdef double d
    cdef int64_t iv
    cdef const unsigned char* s
    if t == 0x0A or t == 0x06:
        return b"\x05"
    if t == 0x08:
        return b"\x30\x01" if v[0] != 0 else b"\x30\x00"
    if t == 0x01:
        d = c_ld_f64le(v)
        if d != d:
            return None
        return c_number_key(d, 0)
    if t == 0x10 or t == 0x12:
        iv = ld_i32le(v) if t == 0x10 else c_ld_i64le(v)
        if -9007199254740992 <= iv <= 9007199254740992:
            return c_number_key(<double>iv, 0)
        d = <double>iv
        if c_sign_i_d(iv, d) < 0:
            d = nextafter(d, -INFINITY)
        return c_number_key(d, <uint64_t>iv - <uint64_t>(<int64_t>d))
    if t == 0x02 or t == 0x0E:
        sl = ld_i32le(v) - 1
        s = v + 4
        cut = sl if sl <= DSTRING_CUT else DSTRING_CUT
        buf[0] = 0x20
        n = 1
        for i in range(cut):
            buf[n] = s[i]
            n += 1
            if s[i] == 0:
                buf[n] = 0xFF
                n += 1
        buf[n] = 0
        buf[n + 1] = 1 if sl > DSTRING_CUT else 0
        return PyBytes_FromStringAndSize(<char*>buf, n + 2)
    return None


def bson_index_keys(raw, paths):
    """Compiled twin of :func:`riverbed.engine._pydocs.bson_index_keys`."""
    cdef Py_buffer view
    cdef const unsigned char* cparts[64]
    cdef Py_ssize_t clens[64]
    cdef Py_ssize_t j, n
    cdef int r, t = 0
    cdef const unsigned char* v = NULL
    cdef Py_ssize_t size = 0
    cdef list out = []
    c_get_buffer(raw, &view)
    try:
        for path in paths:
            n = len(path)
            if n > 64:
                raise ValueError("a path has at most 64 components")
            for j in range(n):
                part = path[j]
                if type(part) is not bytes:
                    raise TypeError("path components must be bytes")
                cparts[j] = <const unsigned char*>PyBytes_AS_STRING(part)
                clens[j] = len(<bytes>part)
            r = c_bson_find(<const unsigned char*>view.buf, view.len, cparts, clens, <int>n, &t, &v, &size) \
                if n > 0 else 0
            if r < 0:
                raise ValueError("malformed BSON document")
            out.append(c_value_key(t, v) if r > 0 else None)
        return out
    finally:
        PyBuffer_Release(&view)
