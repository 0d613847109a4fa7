#!/usr/bin/env bash
# The dashboard test drives Debian's chromium through Playwright (Playwright's own browser downloads
# cannot be fetched here). Install the package when /usr/bin/chromium is missing; quiet and idempotent.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-chromium: /usr/bin/chromium is missing and there is no apt-get; the dashboard test will skip" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "ensure-chromium: /usr/bin/chromium is missing; install Debian's chromium (the dashboard test skips)" >&2
        exit 0
    fi
    SUDO="sudo -n"
fi
echo "ensure-chromium: installing Debian's chromium" >&2
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null; }; then
    echo "ensure-chromium: could not install chromium; the dashboard test will skip" >&2
fi
exit 0
