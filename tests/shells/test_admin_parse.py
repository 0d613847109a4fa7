"""The admin CLI's pure parsing: --uri/--http-uri, sizes, stream arguments, partitions, --from."""

from datetime import datetime, timezone

import pytest

from riverbed.shells import cli
from riverbed.shells.admin.client import EXIT_USAGE, AdminError, parse_uri
from riverbed.shells.admin.streams import parse_size, partition_names, stream_arguments
from riverbed.shells.admin.tail import parse_from


def test_uri_defaults_are_guest_on_local_5552_and_http_asked_of_the_server():
    t = parse_uri("rabbitmq-stream://localhost")
    assert (t.host, t.port, t.username, t.password, t.vhost) == ("localhost", 5552, "guest", "guest", "/")
    assert t.http is None and t.ssl is None      # the HTTP port comes from PeerProperties (http_base)


def test_tls_uri_defaults_to_5551_and_checks_the_certificate(tmp_path):
    import ssl
    t = parse_uri("rabbitmq-stream+tls://u:p@broker.example")
    assert (t.host, t.port) == ("broker.example", 5551)
    assert isinstance(t.ssl, ssl.SSLContext) and t.ssl.verify_mode == ssl.CERT_REQUIRED and t.ssl.check_hostname
    assert parse_uri("rabbitmq-stream+tls://h:6551").port == 6551
    assert parse_uri("rabbitmq-stream://h", tls_ca=None).ssl is None


def test_bad_tls_ca_is_a_usage_error(tmp_path):
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    for path in (str(bad), str(tmp_path / "missing.pem")):
        with pytest.raises(AdminError) as e:
            parse_uri("rabbitmq-stream+tls://h", tls_ca=path)
        assert e.value.code == EXIT_USAGE and "--tls-ca" in str(e.value)


def test_uri_user_password_port_vhost_percent_decoded():
    t = parse_uri("rabbitmq-stream://al%40ice:p%3Ass@10.0.0.2:6000/%2Fprod")
    assert (t.host, t.port, t.username, t.password, t.vhost) == ("10.0.0.2", 6000, "al@ice", "p:ss", "/prod")
    assert parse_uri("rabbitmq-stream://bob@h").password == ""


def test_uri_ipv6_host_is_bracketed_in_the_http_url():
    from riverbed.shells.admin import client
    assert parse_uri("rabbitmq-stream://[::1]:5552").host == "::1"
    assert client._url_host("::1") == "[::1]"       # how http_base writes the discovered URL's host


def test_http_uri_overrides_and_drops_credentials_and_trailing_slash():
    t = parse_uri("rabbitmq-stream://u:p@h:1", "http://x:p@127.0.0.1:8080/")
    assert t.http == "http://127.0.0.1:8080"
    assert (t.username, t.password) == ("u", "p")


@pytest.mark.parametrize("uri", ["http://h:5552", "rabbitmq-stream://", "rabbitmq-stream://h:notaport",
                                 "rabbitmq-stream://h:99999", "rabbitmq-stream://h?x=1", "localhost:5552"])
def test_bad_uri_is_a_usage_error(uri):
    with pytest.raises(AdminError) as e:
        parse_uri(uri)
    assert e.value.code == EXIT_USAGE and "--uri" in str(e.value)


@pytest.mark.parametrize("http_uri", ["ftp://h:1", "h:1", "http://h:port"])
def test_bad_http_uri_is_a_usage_error(http_uri):
    with pytest.raises(AdminError) as e:
        parse_uri("rabbitmq-stream://h", http_uri)
    assert e.value.code == EXIT_USAGE and "--http-uri" in str(e.value)


@pytest.mark.parametrize("text, n", [
    ("1000", 1000), ("20GB", 20 * 10**9), ("20gb", 20 * 10**9), ("512MiB", 512 << 20), ("1kB", 1000),
    ("3KiB", 3072), ("2TB", 2 * 10**12), ("1 GiB", 1 << 30), ("7B", 7), ("5G", 5 * 10**9), ("5Gi", 5 << 30),
])
def test_sizes_in_rabbitmq_units(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "GB", "-1GB", "1.5GB", "20XB", "0", "0GB", "ten"])
def test_bad_sizes_are_usage_errors(text):
    with pytest.raises(AdminError) as e:
        parse_size(text)
    assert e.value.code == EXIT_USAGE


def test_stream_arguments_are_the_rabbitmq_names_checked_like_the_server():
    assert stream_arguments("7D", "20GB") == {"x-max-age": "7D", "x-max-length-bytes": "20000000000"}
    assert stream_arguments() == {}
    with pytest.raises(AdminError) as e:
        stream_arguments(max_age="7X")
    assert e.value.code == EXIT_USAGE and "max-age" in str(e.value)


def test_partitions_are_name_dash_index_with_index_binding_keys():
    assert partition_names("orders", 3) == (["orders-0", "orders-1", "orders-2"], ["0", "1", "2"])
    for bad in (0, -1, 100_000):
        with pytest.raises(AdminError):
            partition_names("orders", bad)


def test_from_keywords_and_offsets():
    assert parse_from("first") == ("first", None)
    assert parse_from("last") == ("last", None)
    assert parse_from("next") == ("next", None)
    assert parse_from("42") == ("offset", 42)


def test_from_relative_and_iso_times_are_epoch_ms():
    now = 1_700_000_000_000
    assert parse_from("-10m", now) == ("timestamp", now - 600_000)
    assert parse_from("-2h", now) == ("timestamp", now - 7_200_000)
    assert parse_from("-1.5s", now) == ("timestamp", now - 1500)
    assert parse_from("-1d", now) == ("timestamp", now - 86_400_000)
    ms = int(datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc).timestamp() * 1000)
    assert parse_from("2026-01-02T03:04:05Z") == ("timestamp", ms)
    assert parse_from("2026-01-02T05:04:05+02:00") == ("timestamp", ms)


@pytest.mark.parametrize("text", ["", "-10", "-10x", "yesterday", "1e3", "2026-13-01", "-m"])
def test_bad_from_is_a_usage_error(text):
    with pytest.raises(AdminError) as e:
        parse_from(text)
    assert e.value.code == EXIT_USAGE and "--from" in str(e.value)


def test_cli_parser_has_the_admin_commands_with_uri_after_the_subcommand():
    p = cli.build_parser()
    a = p.parse_args(["streams", "create", "s", "--max-age", "7D", "--partitions", "3",
                      "--uri", "rabbitmq-stream://u:p@h:1"])
    assert (a.command, a.action, a.stream, a.max_age, a.partitions, a.uri) == (
        "streams", "create", "s", "7D", 3, "rabbitmq-stream://u:p@h:1")
    a = p.parse_args(["tail", "s", "--from=-10m", "--follow", "--format", "raw"])
    assert (a.start, a.follow, a.format) == ("-10m", True, "raw")
    assert p.parse_args(["consumers", "s"]).uri == "rabbitmq-stream://localhost:5552"
    assert p.parse_args(["streams", "ls", "--data-dir", "d"]).data_dir == "d"


def test_cli_usage_errors_exit_2(capsys):
    assert cli.main(["streams", "create", "s", "--max-length-bytes", "lots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("riverbed streams create: bad size 'lots'") and err.count("\n") == 1
    assert cli.main(["tail", "s", "--uri", "amqp://h"]) == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["tail", "s", "--format", "xml"])
    assert e.value.code == 2


def test_data_dir_that_is_not_one_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["streams", "ls", "--data-dir", str(tmp_path)]) == 2
    assert "not a Riverbed data directory" in capsys.readouterr().err
