#!/usr/bin/env bash
# A venv with the older rstream client (0.20.x) for the compatibility tests (tests/integration/
# test_rmq_compat.py); the project's own .venv keeps rstream 1.1.1. Both versions are in use out there.
#
#   ci/rstream-old.sh          # create or refresh the venv if needed; print its python's path on stdout
#
# Where: $RIVERBED_TEST_CACHE/rstream-<version>-py<X.Y>/ ($RIVERBED_TEST_CACHE defaults to
# $HOME/.cache/riverbed-test), outside the work tree, so `make clean` and fresh clones keep it. Idempotent:
# when the venv already has this exact rstream (a stamp file records it), it only prints the path, in a
# few milliseconds. A half-built venv (interrupted install) has no stamp and is rebuilt. Concurrent runs
# serialize on a lock file. The interpreter is $RSTREAM_OLD_BASE_PYTHON, else the project venv's base
# python (the one .venv was made from), else python3.
#
# `make test` runs it before pytest (so the install, if any, happens up front); the tests run it again to
# learn the path (a few milliseconds once installed), so pytest started by hand installs the client too.
# RIVERBED_RSTREAM_OLD_PYTHON=/path/to/python makes the tests use that interpreter instead.
set -euo pipefail

RSTREAM_OLD_VERSION=0.20.9          # the newest 0.20.x on PyPI

here=$(cd "$(dirname "$0")/.." && pwd)
cache=${RIVERBED_TEST_CACHE:-${HOME:-/tmp}/.cache/riverbed-test}

base=${RSTREAM_OLD_BASE_PYTHON:-}
if [ -z "$base" ]; then
    if [ -x "$here/.venv/bin/python" ]; then
        # the interpreter .venv was created from (same Python version as the suite)
        base=$("$here/.venv/bin/python" -c 'import sys; print(sys._base_executable)')
    else
        base=$(command -v python3)
    fi
fi
pyver=$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
venv="$cache/rstream-$RSTREAM_OLD_VERSION-py$pyver"
stamp="$venv/.rstream-$RSTREAM_OLD_VERSION"

if [ -f "$stamp" ] && [ -x "$venv/bin/python" ]; then
    echo "$venv/bin/python"
    exit 0
fi

mkdir -p "$cache"
exec 9>"$cache/.rstream-old.lock"
flock 9
if [ ! -f "$stamp" ] || [ ! -x "$venv/bin/python" ]; then
    echo "rstream-old: installing rstream $RSTREAM_OLD_VERSION into $venv" >&2
    rm -rf "$venv"
    "$base" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "rstream==$RSTREAM_OLD_VERSION" >&2
    "$venv/bin/python" -c "import rstream" >&2
    touch "$stamp"
fi
echo "$venv/bin/python"
