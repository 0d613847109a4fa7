"""The one name of each protocol, defined here once.

A protocol's name is what a user sees of it everywhere: its port flag ``--<name>-port`` (and its other
settings ``--<name>-...``; environment ``RIVERBED_<NAME>_...``, TOML ``<name>_...``), the log line
``listening <name> HOST:PORT``, the ``listener`` label of ``riverbed_rejected_total`` and of the other
per-listener metrics, the key of ``GET /healthz``'s ``listeners``, and the ``protocol`` of a connection
or consumer in the management API and ``riverbed consumers``. Each protocol package uses the constant
below (its sessions as ``LISTENER``/``PROTOCOL``, its listener as ``name``); nothing spells the string
again. The Python package that implements a protocol keeps its descriptive name (``rmq_stream``,
``ream_text``, ...); :data:`LISTENERS` maps one to the other.

RabbitMQ Stream is ``stream``, as RabbitMQ itself names the protocol (its management API's
``"protocol": "stream"``, its ``stream.listeners.tcp`` setting), so that tools written for RabbitMQ
see the same word; its TLS listener is ``stream-tls`` (flag ``--stream-tls-port``).

Importing this module imports nothing else (``riverbed serve --help`` and the settings need it before
any protocol is loaded).
"""

STREAM = "stream"           # RabbitMQ Stream (package rmq_stream)
STREAM_TLS = "stream-tls"   # its TLS listener, beside the plain one
BSON = "bson"               # BSON/TCP, mewbase (package bson_tcp)
ZMQ = "zmq"                 # ZeroMQ mc0 (package zmq_mc0)
WS = "ws"                   # Streamr JSON over WebSocket, and its REST API (package ws_json)
REAM = "ream"               # REAM text (package ream_text)
KAFKA = "kafka"             # Kafka (package kafka)
HTTP = "http"               # metrics, health, dashboard, JSON and management API (package http)

# (name, package), in the order ``riverbed serve`` starts them
LISTENERS = (
    (STREAM, "riverbed.shells.rmq_stream"),
    (BSON, "riverbed.shells.bson_tcp"),
    (ZMQ, "riverbed.shells.zmq_mc0"),
    (WS, "riverbed.shells.ws_json"),
    (REAM, "riverbed.shells.ream_text"),
    (KAFKA, "riverbed.shells.kafka"),
    (HTTP, "riverbed.shells.http"),
)

# settings named after a protocol's old name: still accepted (flag, environment, TOML key), with a
# warning in the log, until they are removed; old name -> new name
DEPRECATED_SETTINGS = {
    "text_port": "ream_port",
    "text_user": "ream_user",
    "text_keepalive": "ream_keepalive",
    "text_max_payload": "ream_max_payload",
    "text_max_line": "ream_max_line",
}


def port_setting(name):
    """The setting that holds listener ``name``'s port: ``"ream"`` -> ``"ream_port"`` (flag
    ``--ream-port``), ``"stream-tls"`` -> ``"stream_tls_port"``."""
    return name.replace("-", "_") + "_port"
