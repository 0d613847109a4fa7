"""Suite-wide fixtures. The compiled core must be the one in use unless RIVERBED_NO_EXTENSIONS=1."""

import pytest

from riverbed.engine import _pycore, core


def pytest_sessionstart(session):
    if not core.NO_EXTENSIONS and not core.COMPILED:
        pytest.exit("the compiled core (riverbed.engine._core) is not in use: the build fell back to the "
                    "pure-Python twin. Rebuild (make install) or set RIVERBED_NO_EXTENSIONS=1.", returncode=3)


def pytest_report_header(config):
    return f"riverbed core: {'compiled' if core.COMPILED else 'pure Python (RIVERBED_NO_EXTENSIONS=1)'}"


@pytest.fixture(params=["compiled", "python"])
def twin(request):
    """Each core implementation in turn, for tests of the byte-level functions."""
    if request.param == "compiled":
        if core.NO_EXTENSIONS:
            pytest.skip("RIVERBED_NO_EXTENSIONS=1")
        from riverbed.engine import _core
        return _core
    return _pycore
