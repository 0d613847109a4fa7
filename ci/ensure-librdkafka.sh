#!/usr/bin/env bash
# The native Kafka bench rows (bench/kafka_native.c, built by bench._kafka_native) compile against
# librdkafka's header: install Debian's librdkafka-dev when it is missing; quiet and idempotent. The
# program links the librdkafka that the confluent-kafka wheel ships when there is one, else Debian's.
[ -f /usr/include/librdkafka/rdkafka.h ] && exit 0
exec "$(dirname "$0")/ensure-deb.sh" ensure-librdkafka /usr/include/librdkafka/rdkafka.h librdkafka-dev \
    "the native Kafka bench rows"
