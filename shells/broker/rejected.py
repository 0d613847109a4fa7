"""Counting a refused input by listener and reason, for ``riverbed_rejected_total{listener,reason}``.

The shells call :func:`count_rejection` where they refuse a request by a limit or a validation rule
(``"depth"``: nested deeper than ``--max-depth``; ``"field"``: a field of the wrong type or value;
``"encoding"``: text that is not valid UTF-8 / holds lone surrogates). Thread-safe (one dict update under
the GIL per call).
"""

_counts = {}


def count_rejection(listener, reason):
    """Count one refused input of ``listener`` (``"bson"``, ``"ws"``, ...) for ``reason``."""
    key = (listener, reason)
    _counts[key] = _counts.get(key, 0) + 1


def rejections():
    """``{(listener, reason): count}`` since the process started (a copy)."""
    return dict(_counts)
