"""Cython extensions only; everything else is in pyproject.toml.

RIVERBED_DEBUG_BUILD=1 builds with bounds checks, line tracing and -O0 -g (for gdb, coverage and
sanitizers). Two extensions, each made of several ``.pxi`` parts, because a ``cimport`` between our own
modules cannot resolve under the ``riverbed.*`` package-dir mapping: the engine's core
(``riverbed.engine._core``: chunks, CRC, index, record format, document store) and the shells' wire
parsers (``riverbed.shells._wire``: RabbitMQ Stream and mewbase frames), which includes the engine's
byte, CRC and chunk-header parts by relative path so the chunk layout has one definition.
"""
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("RIVERBED_DEBUG_BUILD") == "1"

directives = {
    "language_level": "3",
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "cdivision": not DEBUG,
    "initializedcheck": DEBUG,
    "embedsignature": True,
}
if DEBUG:
    directives["linetrace"] = True

macros = [("CYTHON_TRACE_NOGIL", "1")] if DEBUG else []
cflags = ["-O0", "-g"] if DEBUG else ["-O3"]

extensions = [
    Extension(
        "riverbed.engine._core",
        ["engine/_core.pyx"],
        libraries=["z"],
        define_macros=macros,
        extra_compile_args=cflags,
    ),
    Extension(
        "riverbed.shells._wire",
        ["shells/_wire.pyx"],
        libraries=["z"],
        define_macros=macros,
        extra_compile_args=cflags,
    ),
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives=directives,
        include_path=["engine"],
        # the generated C lands next to each .pyx; keep it out of git (see .gitignore)
    ),
)
