"""``decode=json`` in bulk: one Arrow JSON parse per batch instead of Python per record.

The core's ``json_lines`` (compiled, twin in :mod:`riverbed.engine._pyjsonlines`) copies the JSON
payloads of a batch's records into one newline-delimited buffer, leaving out every record the bulk parse
could read otherwise than the per-record path (see its docstring); ``pyarrow.json.read_json`` parses the
buffer with the columns' schema. A run of lines Arrow refuses (a value of another type than its column,
an integer past its column's range, invalid JSON) is cut in halves until the lines it refuses are found;
those, and the records ``json_lines`` left out, are read by :func:`riverbed.spark.amqp.decode_documents`,
the per-record path, and the two parts are put back in record order. So every value is what the
per-record path gives it; the bulk parse only makes it faster.

Column types the bulk parse takes (:func:`supported`): boolean, the integers, double, string, and
structs and arrays of these. A schema with any other type (timestamp, date, float, decimal, binary,
map) is read per record as before. Pure functions; thread-safe.
"""

import numpy as np
import pyarrow as pa
import pyarrow.json as pj

from riverbed.engine import core, record

MIN_SPLIT_ROWS = 64          # a refused run this short goes to the per-record path without more halving
MIN_BLOCK_BYTES = 1 << 20    # Arrow's parse block; never below the longest line


def _type_supported(t):
    if pa.types.is_struct(t):
        return all(_type_supported(f.type) for f in t)
    if pa.types.is_list(t):
        return _type_supported(t.value_type)
    return (pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_float64(t)
            or pa.types.is_string(t))


def _has_float(t):
    if pa.types.is_struct(t):
        return any(_has_float(f.type) for f in t)
    if pa.types.is_list(t):
        return _has_float(t.value_type)
    return pa.types.is_floating(t)


def supported(fields):
    """True when every one of ``fields`` (pyarrow fields) has a type the bulk parse reads exactly as
    the per-record path does."""
    return all(_type_supported(f.type) for f in fields)


def _parse(buf, schema, block):
    return pj.read_json(
        pa.BufferReader(buf),
        read_options=pj.ReadOptions(use_threads=False, block_size=block),
        parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore",
                                      newlines_in_values=False))


def parse_lines(lines, bounds, schema):
    """Parse the lines of ``json_lines`` with ``schema``: ``(ok, tables)``, ``ok`` a bool array over
    the lines (True: parsed) and ``tables`` the parsed runs in line order, each with one row per line.
    A run Arrow refuses is halved down to MIN_SPLIT_ROWS lines; lines in a refused run that short are
    not ok."""
    m = len(bounds) - 1
    ok = np.zeros(m, dtype=bool)
    tables = []
    if m <= 0:
        return ok, tables
    buf = pa.py_buffer(lines)
    block = max(MIN_BLOCK_BYTES, int(np.diff(bounds).max()) + 1)
    todo = [(0, m)]
    while todo:
        a, b = todo.pop()
        start, stop = int(bounds[a]), int(bounds[b])
        try:
            table = _parse(buf.slice(start, stop - start), schema, block)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            table = None
        if table is not None and table.num_rows == b - a:
            tables.append(table)
            ok[a:b] = True
        elif b - a > MIN_SPLIT_ROWS:
            mid = (a + b) // 2
            todo.append((mid, b))       # popped after every run of the first half: tables stay in order
            todo.append((a, mid))
    return ok, tables


def decode_json(value_offsets, data, body, fields):
    """One Arrow array per field of ``fields`` for a batch of stored records, as
    ``amqp.decode_documents(body, "json", fields)`` returns them. ``value_offsets`` and ``data`` are the
    buffers of ``body`` (a binary array with no nulls, offset 0). Never raises for bad records."""
    n = len(body)
    schema = pa.schema(fields)
    lines, rows, bounds = core.json_lines(value_offsets, data, record.max_depth(),
                                          not any(_has_float(f.type) for f in fields))
    rows = np.frombuffer(rows, dtype=np.int64)
    ok, tables = parse_lines(lines, np.frombuffer(bounds, dtype=np.int64), schema)
    fast_rows = rows[ok]
    fast = None
    if tables:
        fast = []
        for i, f in enumerate(fields):
            col = pa.concat_arrays([chunk for t in tables for chunk in t.column(i).chunks])
            fast.append(col if col.type == f.type else col.cast(f.type))
    if len(fast_rows) == n and fast is not None:
        return fast
    from riverbed.spark import amqp
    slow_mask = np.ones(n, dtype=bool)
    slow_mask[fast_rows] = False
    slow_rows = np.flatnonzero(slow_mask)
    slow = amqp.decode_documents(body.take(pa.array(slow_rows)), "json", fields)
    if fast is None:
        return slow
    order = np.empty(n, dtype=np.int64)
    order[fast_rows] = np.arange(len(fast_rows))
    order[slow_rows] = len(fast_rows) + np.arange(len(slow_rows))
    order = pa.array(order)
    return [pa.concat_arrays([a, b]).take(order) for a, b in zip(fast, slow)]
