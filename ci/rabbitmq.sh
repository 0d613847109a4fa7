#!/usr/bin/env bash
# The real RabbitMQ Streams server on this machine, loopback only, for side-by-side benchmarks.
#
#   ci/rabbitmq.sh install   # apt-get install rabbitmq-server (only if missing), loopback config, stream plugin
#   ci/rabbitmq.sh start     # install if needed, start the node, wait until it answers (idempotent)
#   ci/rabbitmq.sh stop      # stop the node and epmd (idempotent)
#   ci/rabbitmq.sh status    # exit 0 and print the node's pid when it is running
#   ci/rabbitmq.sh pid       # the beam.smp pid (the server process to measure), or nothing
#
# Debian 12 ships rabbitmq-server 3.10.8. The image has no systemd and a policy-rc.d that blocks service
# starts, so the package installs stopped and we start the node with start-stop-daemon ourselves. Every
# listener (AMQP 5672, stream 5552, Erlang distribution, epmd) binds 127.0.0.1. guest/guest works from
# loopback. Needs root (or passwordless sudo) for install/start/stop.
set -euo pipefail

PIDFILE=/var/run/rabbitmq/pid
ENV_CONF=/etc/rabbitmq/rabbitmq-env.conf
CONF=/etc/rabbitmq/rabbitmq.conf
STREAM_PORT=${RABBITMQ_STREAM_PORT:-5552}

SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
        echo "rabbitmq.sh: needs root (or sudo) to install/start RabbitMQ" >&2; exit 1; fi
fi

log() { echo "rabbitmq.sh: $*" >&2; }

installed() { dpkg-query -W -f='${Status}' rabbitmq-server 2>/dev/null | grep -q "install ok installed"; }

write_config() {
    # Written every time so that a changed port or a hand-edited file is put back.
    $SUDO mkdir -p /etc/rabbitmq
    $SUDO tee "$ENV_CONF" >/dev/null <<'EOF'
# Written by riverbed ci/rabbitmq.sh: loopback only.
NODENAME=rabbit@localhost
NODE_IP_ADDRESS=127.0.0.1
SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
export ERL_EPMD_ADDRESS=127.0.0.1
EOF
    $SUDO tee "$CONF" >/dev/null <<EOF
# Written by riverbed ci/rabbitmq.sh: loopback only.
listeners.tcp.1 = 127.0.0.1:5672
stream.listeners.tcp.1 = 127.0.0.1:${STREAM_PORT}
stream.advertised_host = 127.0.0.1
stream.advertised_port = ${STREAM_PORT}
disk_free_limit.absolute = 200MB
loopback_users.guest = true
EOF
}

do_install() {
    if ! installed; then
        log "installing Debian's rabbitmq-server (apt-get)"
        export DEBIAN_FRONTEND=noninteractive
        # epmd must not come up on 0.0.0.0 during the package's postinst either.
        export ERL_EPMD_ADDRESS=127.0.0.1
        $SUDO apt-get update -q >/dev/null
        $SUDO env DEBIAN_FRONTEND=noninteractive ERL_EPMD_ADDRESS=127.0.0.1 \
            apt-get install -y -q --no-install-recommends rabbitmq-server >/dev/null
        # The postinst may have left an epmd behind; never leave one on a wildcard address.
        epmd -kill >/dev/null 2>&1 || true
    fi
    write_config
    if ! grep -q rabbitmq_stream /etc/rabbitmq/enabled_plugins 2>/dev/null; then
        $SUDO rabbitmq-plugins enable --offline rabbitmq_stream >/dev/null
    fi
}

beam_pid() {
    # The Erlang VM that runs the node (the process whose CPU and memory we measure).
    local p
    [ -r "$PIDFILE" ] || return 1
    p=$(cat "$PIDFILE" 2>/dev/null) || return 1
    [ -n "$p" ] && [ -d "/proc/$p" ] || return 1
    # The pid file holds the beam.smp pid once the node runs; accept a parent wrapper too.
    if grep -q beam "/proc/$p/comm" 2>/dev/null; then echo "$p"; return 0; fi
    for c in $(pgrep -P "$p" 2>/dev/null); do
        if grep -q beam "/proc/$c/comm" 2>/dev/null; then echo "$c"; return 0; fi
    done
    return 1
}

do_status() {
    if beam_pid >/dev/null && $SUDO rabbitmqctl -q ping >/dev/null 2>&1 ; then
        echo "running pid $(beam_pid) stream 127.0.0.1:${STREAM_PORT}"
        return 0
    fi
    echo "stopped"
    return 1
}

do_start() {
    do_install
    if do_status >/dev/null 2>&1; then log "already running"; do_status; return 0; fi
    $SUDO mkdir -p /var/run/rabbitmq /var/log/rabbitmq
    $SUDO chown rabbitmq:rabbitmq /var/run/rabbitmq /var/log/rabbitmq
    $SUDO rm -f "$PIDFILE"
    log "starting rabbitmq-server (loopback only)"
    $SUDO env RABBITMQ_PID_FILE="$PIDFILE" ERL_EPMD_ADDRESS=127.0.0.1 HOME=/var/lib/rabbitmq \
        start-stop-daemon --chuid rabbitmq --start --background \
        --exec /usr/lib/rabbitmq/bin/rabbitmq-server --pidfile "$PIDFILE"
    if ! $SUDO rabbitmqctl -q wait --timeout 120 "$PIDFILE" >/dev/null; then
        log "node did not come up; last log lines:"
        $SUDO tail -n 30 /var/log/rabbitmq/*.log >&2 || true
        return 1
    fi
    # The stream listener comes up with the plugin; wait for the port.
    for _ in $(seq 1 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/${STREAM_PORT}") 2>/dev/null; then break; fi
        sleep 0.2
    done
    do_status
}

do_stop() {
    if [ -r "$PIDFILE" ] && [ -d "/proc/$(cat "$PIDFILE" 2>/dev/null || echo 0)" ]; then
        log "stopping rabbitmq-server"
        $SUDO rabbitmqctl -q stop "$PIDFILE" >/dev/null 2>&1 || true
    fi
    # Whatever happened above, make sure no node of ours is left.
    if p=$(beam_pid); then
        $SUDO kill "$p" 2>/dev/null || true
        for _ in $(seq 1 50); do [ -d "/proc/$p" ] || break; sleep 0.2; done
    fi
    $SUDO rm -f "$PIDFILE"
    epmd -kill >/dev/null 2>&1 || true
    echo "stopped"
}

case "${1:-}" in
    install) do_install ;;
    start) do_start ;;
    stop) do_stop ;;
    status) do_status ;;
    pid) beam_pid ;;
    *) echo "usage: $0 install|start|stop|status|pid" >&2; exit 2 ;;
esac
