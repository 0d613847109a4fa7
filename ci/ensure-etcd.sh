#!/usr/bin/env bash
# The cluster tests start their own etcd (Debian's etcd-server, 3.4) on free loopback ports. Install the
# package when etcd is missing; quiet and idempotent. The package's systemd unit is never used: tests
# run etcd themselves in a temporary directory.
exec "$(dirname "$0")/ensure-deb.sh" ensure-etcd etcd etcd-server "the cluster tests"
