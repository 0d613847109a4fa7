"""The network soak (bench/soak.py) for 30 seconds: a real server under hostile traffic on every listener
while well-behaved clients of every protocol publish and read back; every check must pass."""

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_soak_30_seconds(tmp_path, capsys):
    from bench import soak

    rc = soak.main(["--seconds", "30", "--work", str(tmp_path / "soak")])
    out = capsys.readouterr().out
    assert rc == 0, out[-6000:]
