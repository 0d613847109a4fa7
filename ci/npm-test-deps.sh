#!/usr/bin/env bash
# The Node packages the WebSocket JSON (Streamr v28) integration tests drive: the real
# `streamr-client@0.12.2` (the last version speaking the v28 protocol; 1.x speaks another) and `ws`.
#
#   ci/npm-test-deps.sh        # install if needed; print the node_modules path on stdout
#
# Where: $RIVERBED_TEST_CACHE/npm-streamr-client-<version>/ ($RIVERBED_TEST_CACHE defaults to
# $HOME/.cache/riverbed-test), outside the work tree. Idempotent: when a stamp file says this exact set is
# installed it only prints the path (milliseconds). A half-finished install has no stamp and is redone.
# Concurrent runs serialize on a lock file. Needs node and npm on PATH.
set -euo pipefail

STREAMR_CLIENT_VERSION=0.12.2
WS_VERSION=5.2.4           # the client's own dependency range is ws ^5.1.0; the raw tests use it too

cache=${RIVERBED_TEST_CACHE:-${HOME:-/tmp}/.cache/riverbed-test}
dir="$cache/npm-streamr-client-$STREAMR_CLIENT_VERSION"
stamp="$dir/.installed-$STREAMR_CLIENT_VERSION-ws$WS_VERSION"

if [ -f "$stamp" ] && [ -d "$dir/node_modules/streamr-client" ]; then
    echo "$dir/node_modules"
    exit 0
fi

command -v npm >/dev/null || { echo "npm-test-deps: npm is not installed" >&2; exit 1; }
mkdir -p "$cache"
exec 9>"$cache/.npm-streamr-client.lock"
flock 9
if [ ! -f "$stamp" ] || [ ! -d "$dir/node_modules/streamr-client" ]; then
    echo "npm-test-deps: installing streamr-client@$STREAMR_CLIENT_VERSION into $dir" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    printf '{"name":"riverbed-ws-tests","private":true}\n' >"$dir/package.json"
    (cd "$dir" && npm install --no-audit --no-fund --loglevel=error \
        "streamr-client@$STREAMR_CLIENT_VERSION" "ws@$WS_VERSION" >&2)
    node -e "require('$dir/node_modules/streamr-client')" >&2
    touch "$stamp"
fi
echo "$dir/node_modules"
