#!/usr/bin/env bash
# The cluster tests start their own etcd (Debian's etcd-server, 3.4) on free loopback ports. Install the
# package when /usr/bin/etcd is missing; quiet and idempotent. The package's systemd unit is never used:
# tests run etcd themselves in a temporary directory.
set -euo pipefail
if command -v etcd >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-etcd: etcd is missing and there is no apt-get; the cluster tests will skip" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "ensure-etcd: etcd is missing; install Debian's etcd-server (the cluster tests skip)" >&2
        exit 0
    fi
    SUDO="sudo -n"
fi
echo "ensure-etcd: installing Debian's etcd-server" >&2
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq etcd-server >/dev/null; }; then
    echo "ensure-etcd: could not install etcd-server; the cluster tests will skip" >&2
fi
exit 0
