"""The build: two compiled modules (the engine's core, the shells' wire parsers) from one setup.py, and a
suite that refuses to run on a build that silently fell back to a pure-Python twin.

The fallback tests run pytest in a child process with one compiled module made unimportable
(``sys.modules[name] = None`` makes its import raise ImportError, as a missing or broken ``.so`` does).
The wheel test builds the package from a copy of the source tree (non-editable, as ``pip install .``
does) and reads the wheel's file list.
"""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = "tests/shells/test_wire_frames.py::test_wire_twin_fixture_yields_the_named_implementation"


def run_suite_without(module, env_extra=None):
    code = (f"import sys; sys.modules[{module!r}] = None; import pytest; "
            f"sys.exit(pytest.main(['-q', '-p', 'no:randomly', {PROBE!r}]))")
    env = {k: v for k, v in os.environ.items() if k != "RIVERBED_NO_EXTENSIONS"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=env)


@pytest.mark.parametrize("module", ["riverbed.shells._wire", "riverbed.engine._core"])
def test_the_suite_refuses_a_silent_fallback_to_a_twin(module):
    r = run_suite_without(module)
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"the compiled module {module} is not in use" in r.stdout + r.stderr


def test_the_suite_runs_on_the_twins_when_asked():
    r = run_suite_without("riverbed.shells._wire", {"RIVERBED_NO_EXTENSIONS": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 1 skipped" in r.stdout            # the python twin ran, the compiled one was skipped


def _copy_source(dst):
    # what a fresh checkout has: no venv, no build products, no generated C, no in-place extensions
    ignore = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.c",
                                    ".hypothesis", ".benchmarks", ".fuzz", "node_modules", "riverbed-data",
                                    "results", "corpus")
    shutil.copytree(ROOT, dst, ignore=ignore)


@pytest.mark.slow
def test_the_wheel_holds_both_extensions_under_the_riverbed_namespace(tmp_path):
    src = tmp_path / "src"
    _copy_source(src)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "out"),
                        str(src)], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr
    (wheel,) = (tmp_path / "out").glob("riverbed-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    exts = sorted(n.split(".")[0] for n in names if n.endswith(".so"))
    assert exts == ["riverbed/engine/_core", "riverbed/shells/_wire"], names
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"riverbed"}, top                      # no top-level engine/ or shells/ package
    for pure in ("riverbed/shells/wire.py", "riverbed/shells/_pywire.py", "riverbed/shells/_pybsonpub.py",
                 "riverbed/engine/core.py", "riverbed/engine/_pycore.py"):
        assert pure in names, pure
    assert not [n for n in names if n.endswith((".pyx", ".pxi", ".c"))]     # sources stay out of the wheel
