"""Suite-wide fixtures. The compiled modules must be the ones in use unless RIVERBED_NO_EXTENSIONS=1: the
engine's core (``riverbed.engine._core``) and the shells' wire parsers (``riverbed.shells._wire``)."""

import pytest

from riverbed.engine import _pycore, core
from riverbed.shells import _pywire, wire


def pytest_sessionstart(session):
    for picker, name in ((core, "riverbed.engine._core"), (wire, "riverbed.shells._wire")):
        if not picker.NO_EXTENSIONS and not picker.COMPILED:
            pytest.exit(f"the compiled module {name} is not in use: the build fell back to the pure-Python "
                        "twin. Rebuild (make install) or set RIVERBED_NO_EXTENSIONS=1.", returncode=3)


def pytest_report_header(config):
    return (f"riverbed core: {'compiled' if core.COMPILED else 'pure Python (RIVERBED_NO_EXTENSIONS=1)'}; "
            f"wire parsers: {'compiled' if wire.COMPILED else 'pure Python (RIVERBED_NO_EXTENSIONS=1)'}")


@pytest.fixture(params=["compiled", "python"])
def twin(request):
    """Each core implementation in turn, for tests of the byte-level functions."""
    if request.param == "compiled":
        if core.NO_EXTENSIONS:
            pytest.skip("RIVERBED_NO_EXTENSIONS=1")
        from riverbed.engine import _core
        return _core
    return _pycore


@pytest.fixture(params=["compiled", "python"])
def wire_twin(request):
    """Each implementation of the shells' wire parsers in turn (``_wire`` compiled, ``_pywire``)."""
    if request.param == "compiled":
        if wire.NO_EXTENSIONS:
            pytest.skip("RIVERBED_NO_EXTENSIONS=1")
        from riverbed.shells import _wire
        return _wire
    return _pywire
