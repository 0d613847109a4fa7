"""Compiled twin of :mod:`riverbed.shells._pywire`: the protocols' frame parsers. Same names, same
results, same errors.

The wire formats the shells read before anything reaches the broker: the RabbitMQ Stream frame splitter
and its Publish v1 -> sealed chunk pass (``rmq.pxi``), the BSON document splitter (``frames.pxi``), the
mewbase PUB recogniser (``bsonpub.pxi``) and the Kafka shell's record loops: a record batch v2's records ->
stored records, a chunk's records -> a record batch v2 (``kafka.pxi``). ``_pywire.py`` is the readable
reference and its docstrings are the spec. The chunk header, its CRC and the byte loads are the engine's:
this module includes the engine's ``bytes.pxi``, ``crc.pxi`` and ``header.pxi`` (an ``include``, not a
``cimport``: a cimport between our own modules cannot resolve under the ``riverbed.*`` package-dir
mapping), so the chunk layout has one definition. All functions are pure (no shared state) and thread-safe; the CRC of a big Publish
is ISA-L's (``crc.pxi``).
"""

from libc.stdint cimport INT64_MAX, INT64_MIN, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy, memmove
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.bytearray cimport (PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_GET_SIZE,
                                PyByteArray_Resize)
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8

import math

from riverbed.engine.errors import FrameError, FrameTooLarge
from riverbed.engine.format import CHUNK_MAGIC_VERSION, LEN_CHUNK_HEADER

COMPILED = True


cdef extern from "Python.h":
    PyObject* _bytes_new "PyBytes_FromStringAndSize"(const char* s, Py_ssize_t n)
    int _list_append "PyList_Append"(PyObject* lst, PyObject* item)
    void _decref "Py_DECREF"(PyObject* o)


# The chunk header the Publish path writes is the engine's; the import-time check makes a drift between
# these constants and format.py fail loudly instead of sealing bad chunks.
cdef enum:
    HDR_LEN = 48
    MAGIC = 0x50
    # Below this many bytes, releasing and re-taking the GIL costs more than the CRC it frees.
    NOGIL_MIN = 65536

if (LEN_CHUNK_HEADER, CHUNK_MAGIC_VERSION) != (HDR_LEN, MAGIC):
    raise ImportError("riverbed.engine.format and _wire.pyx disagree on the chunk header: rebuild _wire")


include "../engine/bytes.pxi"
include "../engine/crc.pxi"
include "../engine/header.pxi"
include "frames.pxi"
include "rmq.pxi"
include "bsonpub.pxi"
include "kafka.pxi"
include "ream.pxi"
