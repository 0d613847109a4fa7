"""The fuzz targets by name, and their corpora (tests/fuzz/corpus/<name>/, one input per file).

Each target has ``run(data: bytes)`` (raises on a finding, see harness.py), ``seeds()`` (valid inputs
built with the protocol's own framing) and ``close()``.
"""

import hashlib
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"

# name -> ("module:Class", the riverbed modules whose coverage guides it). Imported lazily, so atheris
# instruments the code under test as it is first imported; instrumenting only these keeps the engine's
# writer and the broker (run by every input, guiding nothing) at full speed.
TARGETS = {
    "rmq": ("t_rmq:RmqTarget", ["riverbed.shells.rmq_stream"]),
    "bson": ("t_bson:BsonTarget", ["riverbed.shells.bson_tcp"]),
    "zmq": ("t_zmq:ZmqTarget", ["riverbed.shells.zmq_mc0"]),
    "ws": ("t_ws:WsTarget", ["riverbed.shells.ws_json"]),
    "ream": ("t_ream:ReamTarget", ["riverbed.shells.ream_text"]),
    "kafka": ("t_kafka:KafkaTarget", ["riverbed.shells.kafka"]),
    "replication": ("t_replication:ReplicationTarget", ["riverbed.shells.cluster.wire",
                                                        "riverbed.shells.cluster.forward_wire",
                                                        "riverbed.shells.cluster.read_wire",
                                                        "riverbed.shells.cluster.sac_wire"]),
    "record": ("t_engine:RecordTarget", ["riverbed.engine.record", "riverbed.engine._pyrecord",
                                         "riverbed.shells.http.api", "riverbed.shells.zmq_mc0.codec"]),
    "chunk": ("t_engine:ChunkTarget", ["riverbed.engine._pycore", "riverbed.engine.format",
                                       "riverbed.shells._pywire"]),
}


def target_class(name):
    import importlib

    module, cls = TARGETS[name][0].split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), cls)


def make_target(name, root=None):
    return target_class(name)(root)


def corpus_dir(name):
    return CORPUS / name


def corpus_inputs(name):
    """``[(file name, bytes)]`` of a target's corpus, in a stable order."""
    d = corpus_dir(name)
    if not d.is_dir():
        return []
    return [(p.name, p.read_bytes()) for p in sorted(d.iterdir()) if p.is_file()]


def save_input(directory, data):
    """Store ``data`` under its SHA-1 (libFuzzer's naming); returns the path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / hashlib.sha1(data).hexdigest()
    path.write_bytes(data)
    return path
