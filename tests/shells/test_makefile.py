"""The Makefile's install split, read with ``make -n`` (nothing is run): ``make serve`` installs the
package alone, ``make test`` (and ``make install``) the test and spark extras before running pytest."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry_run(target, tmp_path):
    # a clean make: under `make test` the parent's MAKEFLAGS/MAKELEVEL would add "Entering directory" lines
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    r = subprocess.run(["make", "--no-print-directory", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_serve_installs_the_package_alone(tmp_path):
    lines = dry_run("serve", tmp_path)
    installs = [ln for ln in lines if "pip install" in ln and "--upgrade pip" not in ln]
    assert installs == [f"{tmp_path / 'venv'}/bin/python -m pip install -q -e ."], lines
    assert lines[-1].endswith("bin/riverbed serve --data-dir riverbed-data")
    assert any("activate" in ln for ln in lines)       # it says how riverbed gets on PATH


@pytest.mark.parametrize("target", ["test", "install", "bench"])
def test_test_targets_install_the_extras_first(tmp_path, target):
    lines = dry_run(target, tmp_path)
    installs = [i for i, ln in enumerate(lines) if "pip install -q -e '.[test,spark]'" in ln]
    assert installs, lines
    runs = [i for i, ln in enumerate(lines) if "-m pytest" in ln]
    assert all(i > installs[0] for i in runs)
