"""The Kafka listener with a users file (SASL PLAIN: a client that does not authenticate is served
nothing, a wrong password is refused and closed) and with --tls-cert (the port speaks TLS: SSL and
SASL_SSL), with real clients."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from procs import ServerProcess  # noqa: E402
from test_tls import Pki  # noqa: E402

from riverbed.shells.auth import add_user  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture(scope="module")
def users(tmp_path_factory):
    path = tmp_path_factory.mktemp("users") / "users.toml"
    add_user(str(path), "alice", "wonderland")
    add_user(str(path), "reader", "books", configure="", write="", read="^pub-")
    return str(path)


def roundtrip(conf, topic, n=50):
    from confluent_kafka import Consumer, Producer, TopicPartition
    p = Producer(dict(conf, acks="all"))
    for i in range(n):
        p.produce(topic, value=b"%d" % i)
    left = p.flush(20)
    c = Consumer(dict(conf, **{"group.id": "sec-" + topic, "enable.auto.commit": False}))
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    for _ in range(100):
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            got.append(m.value())
        if len(got) == n:
            break
    c.close()
    return left, got


def test_sasl_plain_with_the_users_file(tmp_path, users):
    from confluent_kafka.admin import AdminClient
    srv = ServerProcess(tmp_path / "data", "--kafka-port", "0", "--users", users).start()
    try:
        bs = f"127.0.0.1:{srv.ports['kafka']}"
        sasl = {"bootstrap.servers": bs, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
                "sasl.username": "alice", "sasl.password": "wonderland"}
        left, got = roundtrip(sasl, "secured")
        assert left == 0 and got == [b"%d" % i for i in range(50)]
        # kafka-python and aiokafka authenticate the same way
        from kafka import KafkaConsumer
        kc = KafkaConsumer(bootstrap_servers=bs, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                           sasl_plain_username="alice", sasl_plain_password="wonderland")
        assert "secured" in kc.topics()
        kc.close()
        # without SASL nothing is served; a wrong password is refused
        for conf in ({"bootstrap.servers": bs},
                     dict(sasl, **{"sasl.password": "wrong"})):
            admin = AdminClient(dict(conf, **{"socket.timeout.ms": 3000}))
            with pytest.raises(Exception):
                admin.list_topics(timeout=3)
        # a user without write permission on the topic cannot produce to it
        from confluent_kafka import KafkaError, Producer
        p = Producer(dict(sasl, **{"sasl.username": "reader", "sasl.password": "books", "acks": "all",
                                   "message.timeout.ms": 3000}))
        errors = []
        p.produce("secured", value=b"x", on_delivery=lambda err, msg: errors.append(err))
        p.flush(10)
        assert errors and errors[0] is not None and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors
    finally:
        assert srv.stop() == 0, srv.log()


def test_tls_and_sasl_ssl(tmp_path, pki, users):
    srv = ServerProcess(tmp_path / "data", "--kafka-port", "0", "--tls-cert", pki.server_cert, "--tls-key",
                        pki.server_key, "--users", users).start()
    try:
        bs = f"127.0.0.1:{srv.ports['kafka']}"
        conf = {"bootstrap.servers": bs, "security.protocol": "SASL_SSL", "ssl.ca.location": pki.ca,
                "sasl.mechanisms": "PLAIN", "sasl.username": "alice", "sasl.password": "wonderland"}
        left, got = roundtrip(conf, "tls-topic")
        assert left == 0 and len(got) == 50
        from kafka import KafkaProducer
        kp = KafkaProducer(bootstrap_servers=bs, security_protocol="SASL_SSL", ssl_cafile=pki.ca,
                           sasl_mechanism="PLAIN", sasl_plain_username="alice", sasl_plain_password="wonderland",
                           acks="all")
        assert kp.send("tls-topic", b"kafka-python").get(10).offset == 50
        kp.close()
    finally:
        assert srv.stop() == 0, srv.log()


def test_tls_without_users(tmp_path, pki):
    srv = ServerProcess(tmp_path / "data", "--kafka-port", "0", "--tls-cert", pki.server_cert, "--tls-key",
                        pki.server_key).start()
    try:
        bs = f"127.0.0.1:{srv.ports['kafka']}"
        left, got = roundtrip({"bootstrap.servers": bs, "security.protocol": "SSL", "ssl.ca.location": pki.ca},
                              "plain-tls")
        assert left == 0 and len(got) == 50
    finally:
        assert srv.stop() == 0, srv.log()
