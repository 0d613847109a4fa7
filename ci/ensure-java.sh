#!/usr/bin/env bash
# The Spark tests need a Java runtime (pyspark 4 supports 17 and 21). Install Debian's when none is on
# PATH, so a fresh machine needs nothing done by hand.
set -euo pipefail
if command -v java >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-java: no java on PATH; install a Java 17 runtime (the Spark tests need one)" >&2
    exit 1
fi
echo "ensure-java: installing openjdk-17-jre-headless" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
