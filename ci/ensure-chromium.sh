#!/usr/bin/env bash
# The dashboard test drives Debian's chromium through Playwright (Playwright's own browser downloads
# cannot be fetched here). Install the package when /usr/bin/chromium is missing; quiet and idempotent.
exec "$(dirname "$0")/ensure-deb.sh" ensure-chromium /usr/bin/chromium chromium "the dashboard test"
