#!/usr/bin/env bash
# Redis 7 (Streams) on this machine, loopback only, for the side-by-side benchmark (bench/compare.py).
#
#   ci/redis.sh install   # apt-get install redis-server (only if missing)
#   ci/redis.sh start     # install if needed, start a server in $REDIS_DIR on $REDIS_PORT, wait for PING
#   ci/redis.sh stop      # stop the server of $REDIS_DIR; without REDIS_DIR, every server this script
#                         # started (the pid files under /tmp/riverbed-redis-*) (idempotent)
#   ci/redis.sh status    # exit 0 and print the pid when the server of $REDIS_DIR answers
#   ci/redis.sh pid       # the redis-server pid of $REDIS_DIR, or nothing
#
# Environment: REDIS_PORT (default 6390), REDIS_DIR (default /tmp/riverbed-redis-$REDIS_PORT; the AOF,
# the log and the pid file go there; the bench passes a fresh temporary directory named so).
# Durability as the bench specifies it: the append-only file on, fsync once a second
# (`appendonly yes`, `appendfsync everysec`); RDB snapshots and automatic AOF rewrites off, so that no
# background fork lands in a timed run. Debian 12 ships redis-server 7.0. The package's own service
# (port 6379) is not used; the image's policy-rc.d keeps it stopped. Needs root (or sudo) to install only.
set -euo pipefail

PORT=${REDIS_PORT:-6390}
DIR=${REDIS_DIR:-/tmp/riverbed-redis-$PORT}
PIDFILE=$DIR/redis.pid
LOG=$DIR/redis.log

SVC=redis SVC_SERVER=redis-server SVC_NEEDS="redis-server redis-cli" SVC_DIR_VAR=REDIS_DIR
# shellcheck source=ci/service-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/service-lib.sh"

answers() { [ "$(redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null)" = PONG ]; }

ready() { answers; }

launch() {
    log "starting redis-server on 127.0.0.1:$PORT in $DIR (appendonly yes, appendfsync everysec)"
    redis-server --bind 127.0.0.1 --port "$PORT" --protected-mode yes --dir "$DIR" \
        --daemonize yes --pidfile "$PIDFILE" --logfile "$LOG" \
        --appendonly yes --appendfsync everysec --save "" --auto-aof-rewrite-percentage 0
}

service_main "$@"
