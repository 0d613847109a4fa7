"""The differential check of a compiled module against its pure-Python twin: the same call on both must
give the same result, or raise the same exception type with the same message (both are part of the
contract). Used by the engine core's and the shells' wire tests."""


def outcome(fn, *args):
    """``("ok", result)`` or ``("error", exception type, message)`` of ``fn(*args)``."""
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # the exception type and message are part of the contract
        return ("error", type(exc), str(exc))


def both(compiled, python, name, *args):
    """Call ``name`` of both modules with ``args``; assert the outcomes are equal; return the pure one's."""
    expected = outcome(getattr(python, name), *args)
    assert outcome(getattr(compiled, name), *args) == expected, name
    return expected


def check_public_names(compiled, python, names):
    """Both modules have every one of ``names``, and each says which twin it is (``COMPILED``)."""
    for name in names:
        assert hasattr(compiled, name) and hasattr(python, name), name
    assert compiled.COMPILED is True and python.COMPILED is False
