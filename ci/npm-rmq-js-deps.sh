#!/usr/bin/env bash
# The Node package the RabbitMQ Stream JavaScript-client integration tests drive: the real
# `rabbitmq-stream-js-client@0.6.2` (the version whose own suite issue 19 ran against Riverbed).
#
#   ci/npm-rmq-js-deps.sh      # install if needed; print the node_modules path on stdout
#
# Where: $RIVERBED_TEST_CACHE/npm-rabbitmq-stream-js-client-<version>/ ($RIVERBED_TEST_CACHE defaults to
# $HOME/.cache/riverbed-test), outside the work tree. Idempotent: when a stamp file says this exact version
# is installed it only prints the path. A half-finished install has no stamp and is redone. Concurrent
# runs serialize on a lock file. Needs node and npm on PATH.
set -euo pipefail

RMQ_JS_CLIENT_VERSION=0.6.2

cache=${RIVERBED_TEST_CACHE:-${HOME:-/tmp}/.cache/riverbed-test}
dir="$cache/npm-rabbitmq-stream-js-client-$RMQ_JS_CLIENT_VERSION"
stamp="$dir/.installed-$RMQ_JS_CLIENT_VERSION"

if [ -f "$stamp" ] && [ -d "$dir/node_modules/rabbitmq-stream-js-client" ]; then
    echo "$dir/node_modules"
    exit 0
fi

command -v npm >/dev/null || { echo "npm-rmq-js-deps: npm is not installed" >&2; exit 1; }
mkdir -p "$cache"
exec 9>"$cache/.npm-rabbitmq-stream-js-client.lock"
flock 9
if [ ! -f "$stamp" ] || [ ! -d "$dir/node_modules/rabbitmq-stream-js-client" ]; then
    echo "npm-rmq-js-deps: installing rabbitmq-stream-js-client@$RMQ_JS_CLIENT_VERSION into $dir" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    printf '{"name":"riverbed-rmq-js-tests","private":true}\n' >"$dir/package.json"
    (cd "$dir" && npm install --no-audit --no-fund --loglevel=error \
        "rabbitmq-stream-js-client@$RMQ_JS_CLIENT_VERSION" >&2)
    node -e "require('$dir/node_modules/rabbitmq-stream-js-client')" >&2
    touch "$stamp"
fi
echo "$dir/node_modules"
