#!/usr/bin/env bash
# NATS with JetStream on this machine, loopback only, for the side-by-side benchmark (bench/compare.py).
#
#   ci/nats.sh install   # apt-get install nats-server (only if missing)
#   ci/nats.sh start     # install if needed, start `nats-server -js` with its store in $NATS_DIR on
#                        # $NATS_PORT, wait until it is ready
#   ci/nats.sh stop      # stop the server of $NATS_DIR; without NATS_DIR, every server this script
#                        # started (the pid files under /tmp/riverbed-nats-*) (idempotent)
#   ci/nats.sh status    # exit 0 and print the pid when the server of $NATS_DIR answers
#   ci/nats.sh pid       # the nats-server pid of $NATS_DIR, or nothing
#
# Environment: NATS_PORT (default 4232), NATS_DIR (default /tmp/riverbed-nats-$NATS_PORT; the JetStream
# store (jetstream/), the log and the pid file go there; the bench passes a fresh temporary directory
# named so). Debian 12 ships nats-server 2.9. Client port only (no monitoring, cluster or leaf ports), on
# 127.0.0.1, no auth. The package's own service is not used. Needs root (or sudo) to install only.
set -euo pipefail

PORT=${NATS_PORT:-4232}
DIR=${NATS_DIR:-/tmp/riverbed-nats-$PORT}
PIDFILE=$DIR/nats.pid
LOG=$DIR/nats.log

SVC=nats SVC_SERVER=nats-server SVC_NEEDS=nats-server SVC_DIR_VAR=NATS_DIR
# shellcheck source=ci/service-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/service-lib.sh"

answers() {
    # A NATS server greets every client with an INFO line.
    local line
    exec 3<>"/dev/tcp/127.0.0.1/$PORT" 2>/dev/null || return 1
    read -r -t 2 line <&3 || line=""
    exec 3<&- 3>&-
    [[ "$line" == INFO* ]]
}

ready() { grep -q "Server is ready" "$LOG" 2>/dev/null && answers; }

launch() {
    rm -f "$LOG"
    log "starting nats-server -js on 127.0.0.1:$PORT, store in $DIR/jetstream"
    # Its own session, so that a Ctrl-C in the terminal reaches the bench only; the bench stops it.
    setsid nats-server -a 127.0.0.1 -p "$PORT" -js -sd "$DIR" -P "$PIDFILE" -l "$LOG" \
        </dev/null >/dev/null 2>&1 &
}

service_main "$@"
