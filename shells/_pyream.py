"""Pure-Python twin of ``ream.pxi`` (in the shells' compiled module ``_wire``): the REAM publish-run
splitter. Same name, same results. This twin is the readable reference and its docstring is the spec.

Pure function, no shared state; thread-safe.
"""

PUBLISH_PREFIX = b"EVENT PUBLISH "
LEN_MAX_SIZE_DIGITS = 12          # codec.SIZE_RE: a declared size has 1..12 digits


def _plain_name_byte(b):
    # a bare stream-name byte the fast path takes as is: printable ASCII but the double quote (a quoted
    # name, whitespace, a control byte or non-ASCII goes through the per-request parser)
    return 0x21 <= b <= 0x7E and b != 0x22


def ream_publish_run(buf, pos, max_payload, max_count):
    """The run of plain ``EVENT PUBLISH <stream> <size>\\n<payload>\\n`` requests at ``buf[pos:]``.

    A request is plain when its line is exactly ``EVENT PUBLISH `` + a name of printable ASCII bytes
    without ``"`` + one space + 1..12 ASCII digits (a value <= ``max_payload``) + ``\\n``, and the
    ``size`` bytes after that line hold no ``\\n`` and are followed by one. Every request of a run has
    the same name bytes as the first. The run stops before the first request that is not plain (another
    command, another stream, a size or payload line that disagrees, bytes not arrived yet) and after
    ``max_count`` requests.

    Returns ``(name, payloads, ends)``: the name bytes, each payload's bytes and, for each request, the
    offset in ``buf`` just past it; ``(None, [], [])`` when the request at ``pos`` is not plain (or
    ``max_count`` < 1). ``buf`` is any bytes-like object; nothing is raised for any content.
    """
    data = buf if isinstance(buf, (bytes, bytearray)) else bytes(buf)   # no copy of a read buffer
    n = len(data)
    if pos < 0:
        pos = n
    name = None
    payloads = []
    ends = []
    plen = len(PUBLISH_PREFIX)
    while len(ends) < max_count and pos < n:
        if not data.startswith(PUBLISH_PREFIX, pos):
            break
        i = pos + plen
        j = i
        while j < n and _plain_name_byte(data[j]):
            j += 1
        if j == i or j >= n or data[j] != 0x20:
            break
        if name is None:
            name = bytes(data[i:j])
        elif data[i:j] != name:
            break
        k = j + 1
        m = k
        while m < n and 0x30 <= data[m] <= 0x39:
            m += 1
        if m == k or m - k > LEN_MAX_SIZE_DIGITS or m >= n or data[m] != 0x0A:
            break
        size = int(data[k:m])
        if size > max_payload:
            break
        start = m + 1
        stop = start + size
        if stop >= n or data[stop] != 0x0A or data.find(b"\n", start, stop) >= 0:
            break
        payloads.append(bytes(data[start:stop]))
        pos = stop + 1
        ends.append(pos)
    if not ends:
        return None, [], []
    return name, payloads, ends
