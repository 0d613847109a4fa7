"""Compiled twin of :mod:`riverbed.engine._pycore`. Same names, same results, same errors.

The byte layouts are documented in :mod:`riverbed.engine.format`; ``_pycore.py`` is the readable
reference and its docstrings are the spec for every function here. The code is split into ``.pxi`` parts
(``include``, not ``cimport``: a cimport between our own modules cannot resolve under the ``riverbed.*``
package-dir mapping). The protocols' frame parsers (RabbitMQ Stream Publish, mewbase PUB, both frame
splitters) are not here but in the shells' compiled module :mod:`riverbed.shells._wire`, which includes
``bytes.pxi``, ``crc.pxi`` and ``header.pxi`` from this folder. All functions are pure (no shared state)
and thread-safe; the long copies into a fresh result run with the GIL released, and the data CRC of a big
buffer is ISA-L's (``crc.pxi``, :mod:`riverbed.engine.datacrc`).
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_GET_SIZE
from cpython.list cimport PyList_New
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.number cimport PyIndex_Check, PyNumber_Index
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_GET_ITEM

import struct

from riverbed.engine.errors import ChunkError, FrameError, FrameTooLarge
from riverbed.engine.format import (
    BLOOM_MIN_SIZE, BLOOM_SEED_1, BLOOM_SEED_2, CHUNK_MAGIC_VERSION, CHUNK_USER, COMPRESSION_NONE,
    LEN_CHUNK_HEADER, LEN_SIMPLE_HEADER, LEN_SUB_BATCH_HEADER, MAX_ENTRY_SIZE, decompress,
)

COMPILED = True

# The header packing of _pycore goes through struct, so a field out of range raises struct.error there;
# raising the same type keeps the twins interchangeable for callers that catch it.
StructError = struct.error


# Raw C-API entry points for the hot loops: borrowed and new references as PyObject*, so a record can be
# stored into a preallocated list without the incref/decref pairs Cython's object wrappers would add.
cdef extern from "Python.h":
    bint _is_bytes "PyBytes_CheckExact"(PyObject* o)
    char* _bytes_ptr "PyBytes_AS_STRING"(PyObject* o)
    Py_ssize_t _bytes_len "PyBytes_GET_SIZE"(PyObject* o)
    PyObject* _bytes_new "PyBytes_FromStringAndSize"(const char* s, Py_ssize_t n)
    void _list_set "PyList_SET_ITEM"(PyObject* lst, Py_ssize_t i, PyObject* item)
    int _list_append "PyList_Append"(PyObject* lst, PyObject* item)
    void _decref "Py_DECREF"(PyObject* o)
    void PyObject_GC_Track(PyObject* o)
    void PyObject_GC_UnTrack(PyObject* o)
    int PyObject_GC_IsTracked(PyObject* o)
    int Py_EnterRecursiveCall(const char* where)    # nonzero (not -1) with RecursionError set
    void Py_LeaveRecursiveCall()


# Layout offsets are C constants (the loops need them at compile time); the import-time check below makes
# a drift between this file and format.py fail loudly instead of writing bad chunks.
cdef enum:
    HDR_LEN = 48
    SIMPLE_HDR_LEN = 4
    SUB_HDR_LEN = 11
    MAGIC = 0x50
    MAX_ENTRY = 0x7FFFFFFF
    BLOOM_MIN = 16
    # Below this many bytes, releasing and re-taking the GIL costs more than the work it frees.
    NOGIL_MIN = 65536

if (LEN_CHUNK_HEADER, LEN_SIMPLE_HEADER, LEN_SUB_BATCH_HEADER, CHUNK_MAGIC_VERSION, MAX_ENTRY_SIZE,
        BLOOM_MIN_SIZE) != (HDR_LEN, SIMPLE_HDR_LEN, SUB_HDR_LEN, MAGIC, MAX_ENTRY, BLOOM_MIN):
    raise ImportError("riverbed.engine.format and _core.pyx disagree on the chunk layout: rebuild _core")

cdef uint32_t SEED_1 = BLOOM_SEED_1
cdef uint32_t SEED_2 = BLOOM_SEED_2


include "bytes.pxi"
include "crc.pxi"
include "header.pxi"
include "chunk.pxi"
include "bloom.pxi"
include "arrow.pxi"
include "record.pxi"
include "docs.pxi"
include "jsonlines.pxi"
