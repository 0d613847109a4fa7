"""`pytest bench/` collects the engine micro-benchmarks (``bench_*.py``; pytest-benchmark), which the
default ``test_*.py`` pattern would miss. ``make bench`` names the files itself. ``compare.py`` and the
``_*.py`` helpers of ``make bench-compare`` are not tests and are never collected."""

import pytest


def pytest_collect_file(file_path, parent):
    if (file_path.suffix == ".py" and file_path.name.startswith("bench_")
            and not parent.session.isinitpath(file_path)):
        return pytest.Module.from_parent(parent, path=file_path)
    return None
