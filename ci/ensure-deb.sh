#!/usr/bin/env bash
# ensure-deb.sh NAME PROGRAM PACKAGE WHAT: install Debian's PACKAGE when PROGRAM (a command name, or an
# absolute path that must be executable) is missing, for the tests WHAT names ("the cluster tests").
# Quiet and idempotent, and never fails: without apt-get, sudo or the package, it says so and the tests
# that need PROGRAM skip. NAME prefixes its messages. The ensure-*.sh scripts of optional test tools call it.
set -euo pipefail
name=$1 program=$2 package=$3 what=$4
if [ "${program#/}" != "$program" ]; then
    [ -x "$program" ] && exit 0
elif command -v "$program" >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "$name: $program is missing and there is no apt-get; $what will skip" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "$name: $program is missing; install Debian's $package ($what will skip)" >&2
        exit 0
    fi
    SUDO="sudo -n"
fi
echo "$name: installing Debian's $package" >&2
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$package" >/dev/null; }; then
    echo "$name: could not install $package; $what will skip" >&2
fi
exit 0
