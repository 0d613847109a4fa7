# Sourced (not run) by ci/redis.sh and ci/nats.sh: what a peer server of the benchmark shares when it
# runs loopback only from a directory of its own, with its pid file there.
#
# Provides:
#   log MSG...        "<SVC>.sh: MSG" on stderr
#   do_install        apt-get install Debian's $SVC_SERVER when a command of $SVC_NEEDS is missing
#                     (as root, else through `sudo -n`; fails with a message when neither is available)
#   server_pid        the pid in $PIDFILE when that process is alive and its /proc/PID/comm names $SVC
#   do_status         "running pid P 127.0.0.1:$PORT dir $DIR" (exit 0) when server_pid and `answers`
#                     succeed, else "stopped" (exit 1)
#   do_start          install if needed; unless already running: create $DIR, remove $PIDFILE, `launch`,
#                     then wait up to 10 s for server_pid and `ready`; on failure print the last lines of
#                     $LOG, stop what started and exit 1
#   stop_dir DIR      stop the server of DIR/$SVC.pid (TERM, up to 10 s, then KILL) and remove the pid file
#   do_stop           stop the server of $<SVC_DIR_VAR>; when that is unset or empty, every server under
#                     /tmp/riverbed-$SVC-*/ (idempotent); prints "stopped"
#   service_main ARG  the command line: install|start|stop|status|pid, else usage and exit 2
#
# The sourcing script sets, before sourcing:
#   SVC          the short name (redis, nats): log prefix, pid file name, /proc comm match, /tmp pattern
#   SVC_SERVER   the server binary, which is also its Debian package's name (redis-server, nats-server)
#   SVC_NEEDS    the commands that must all exist for the server to count as installed
#   SVC_DIR_VAR  the name of the environment variable that selects the server's directory (REDIS_DIR)
#   PORT, DIR, PIDFILE (=$DIR/$SVC.pid), LOG (the server's log file in $DIR)
# and defines, before calling service_main:
#   answers      exit 0 when the server on 127.0.0.1:$PORT answers its protocol
#   launch       log the start and start the server (detached, writing $PIDFILE and $LOG)
#   ready        exit 0 once the server started by `launch` is ready for clients

SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; fi

log() { echo "$SVC.sh: $*" >&2; }

installed() {
    local c
    for c in $SVC_NEEDS; do command -v "$c" >/dev/null 2>&1 || return 1; done
}

do_install() {
    if installed; then return 0; fi
    if [ "$(id -u)" != 0 ] && [ -z "$SUDO" ]; then
        log "$SVC_SERVER is not installed and installing it needs root (or sudo)"; return 1
    fi
    log "installing Debian's $SVC_SERVER (apt-get)"
    $SUDO apt-get update -q >/dev/null
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$SVC_SERVER" >/dev/null
    installed || { log "$SVC_SERVER still missing after apt-get install"; return 1; }
}

dir_pid() {
    # The pid in DIR/$SVC.pid when that process is alive and is ours.
    local p
    [ -r "$1/$SVC.pid" ] || return 1
    p=$(cat "$1/$SVC.pid" 2>/dev/null) || return 1
    [ -n "$p" ] && grep -q "$SVC" "/proc/$p/comm" 2>/dev/null || return 1
    echo "$p"
}

server_pid() { dir_pid "$DIR"; }

do_status() {
    if server_pid >/dev/null && answers; then
        echo "running pid $(server_pid) 127.0.0.1:$PORT dir $DIR"
        return 0
    fi
    echo "stopped"
    return 1
}

do_start() {
    do_install
    if do_status >/dev/null 2>&1; then log "already running"; do_status; return 0; fi
    mkdir -p "$DIR"
    rm -f "$PIDFILE"
    launch
    for _ in $(seq 1 100); do
        if server_pid >/dev/null && ready; then do_status; return 0; fi
        sleep 0.1
    done
    log "$SVC_SERVER did not come up; last log lines:"
    tail -n 20 "$LOG" >&2 || true
    stop_dir "$DIR"
    return 1
}

stop_dir() {
    # One server, by the pid in its directory's pid file.
    local dir=$1 p
    [ -r "$dir/$SVC.pid" ] || return 0
    if p=$(dir_pid "$dir"); then
        log "stopping $SVC_SERVER pid $p ($dir)"
        kill "$p" 2>/dev/null || true
        for _ in $(seq 1 100); do [ -d "/proc/$p" ] || break; sleep 0.1; done
        [ -d "/proc/$p" ] && kill -9 "$p" 2>/dev/null || true
    fi
    rm -f "$dir/$SVC.pid"
}

do_stop() {
    if [ -n "${!SVC_DIR_VAR:-}" ]; then
        stop_dir "${!SVC_DIR_VAR}"
    else
        for f in /tmp/riverbed-"$SVC"-*/"$SVC".pid; do
            [ -e "$f" ] && stop_dir "$(dirname "$f")"
        done
    fi
    echo "stopped"
}

service_main() {
    case "${1:-}" in
        install) do_install ;;
        start) do_start ;;
        stop) do_stop ;;
        status) do_status ;;
        pid) server_pid ;;
        *) echo "usage: $0 install|start|stop|status|pid" >&2; exit 2 ;;
    esac
}
