"""GET /healthz and GET /readyz against ``riverbed serve`` run in this process (``cli.run_server``), so
that a test can reach the engine and the listeners: the writer thread is made to die of a fatal error,
listeners stop accepting, and the probes must say so."""

import asyncio
import contextlib
import json
import types

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from riverbed.engine import Engine
from riverbed.engine.errors import RiverbedError
from riverbed.shells import cli
from riverbed.shells import config as _config
from riverbed.shells.broker import Broker
from riverbed.shells.http import health
from riverbed.shells.http.server import BROKER, serve

ALL_OFF = {"stream_port": "off", "bson_port": "off", "zmq_port": "off", "ws_port": "off", "text_port": "off",
           "kafka_port": "off", "http_port": "0"}


def run(coro, timeout=60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


@contextlib.asynccontextmanager
async def running(tmp_path, **flags):
    """``riverbed serve`` in this loop with every listener off but HTTP and those in ``flags`` (port 0);
    yields the broker once every listener is up, and stops the server (exit status 0) afterwards."""
    cfg = _config.load({"data_dir": str(tmp_path / "data"), **ALL_OFF, **flags}, env={})
    stop = asyncio.Event()
    started = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(cli.run_server(cfg, stop, started=started.set_result))
    await asyncio.wait({task, started}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
    if not started.done():
        task.cancel()
        raise AssertionError(f"server did not start: {task.exception() if task.done() else 'timeout'}")
    try:
        yield started.result()
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0


def http_port(broker):
    return dict(broker.listeners)["http"].port


async def get(broker, path, **kw):
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{http_port(broker)}{path}", **kw) as r:
            return r.status, r.headers.get("Content-Type", ""), await r.text()


async def get_json(broker, path):
    status, ctype, text = await get(broker, path)
    assert ctype.startswith("application/json"), ctype
    return status, json.loads(text)


class _WriterKiller(BaseException):
    """Not an Exception: it passes every per-operation guard of the writer thread, as an unexpected
    fatal failure would, and takes the thread down through its one fatal-error path."""


async def kill_writer(engine):
    def boom(ctx):
        raise _WriterKiller("test: fatal error in the writer thread")
    with pytest.raises(RiverbedError, match="engine stopped"):
        await asyncio.wrap_future(engine.transact(boom))
    engine._writer.join(10)
    assert not engine._writer.is_alive()


def test_healthy_and_ready_server_lists_every_listener(tmp_path):
    async def scenario(broker):
        status, body = await get_json(broker, "/healthz")
        assert status == 200, body
        disk = body.pop("disk")
        assert body == {"status": "ok", "reasons": [], "writer": "running",
                        "listeners": {"stream": "accepting", "zmq": "accepting", "ws": "accepting",
                                      "http": "accepting"}}
        assert disk["alarm"] is False and disk["free_limit_bytes"] == 50 << 20 and disk["max_disk_bytes"] is None
        assert disk["free_bytes"] > disk["free_limit_bytes"] and disk["data_bytes"] > 0
        assert await get_json(broker, "/readyz") == (200, {"status": "ready"})
        status, _, text = await get(broker, "/healthz", headers={"Authorization": "Basic bm9wZTpub3Bl"})
        assert status == 200        # probes ignore credentials, even wrong ones

    async def main():
        async with running(tmp_path, stream_port="0", zmq_port="0", ws_port="0") as broker:
            await scenario(broker)
    run(main())


def test_healthz_503_when_the_writer_thread_dies(tmp_path):
    async def main():
        async with running(tmp_path, stream_port="0") as broker:
            assert (await get_json(broker, "/healthz"))[0] == 200
            await kill_writer(broker.engine)
            status, body = await get_json(broker, "/healthz")
            assert status == 503, body
            assert body["status"] == "failing" and body["writer"] == "stopped"
            assert any("writer thread has stopped" in r for r in body["reasons"]), body
            assert body["listeners"] == {"stream": "accepting", "http": "accepting"}
            # the metrics say it too, and still answer (they need no writer)
            status, _, text = await get(broker, "/metrics")
            assert status == 200
            fams = {f.name: f for f in text_string_to_metric_families(text)}
            assert fams["riverbed_engine_writer_up"].samples[0].value == 0
            # readiness is about serving: a server that cannot write is unhealthy, and still "ready"
            assert (await get_json(broker, "/readyz"))[0] == 200
    run(main())


def test_healthz_503_names_each_listener_that_stopped_accepting(tmp_path):
    async def main():
        async with running(tmp_path, stream_port="0", zmq_port="0", ws_port="0") as broker:
            servers = dict(broker.listeners)
            servers["zmq"].stop_accepting()
            status, body = await get_json(broker, "/healthz")
            assert status == 503, body
            assert body["listeners"]["zmq"] == "closed" and body["listeners"]["ws"] == "accepting"
            assert body["reasons"] == ["listener zmq is not accepting connections"]
            servers["stream"].stop_accepting()
            servers["ws"].stop_accepting()
            status, body = await get_json(broker, "/healthz")
            assert status == 503
            assert sorted(body["reasons"]) == sorted(f"listener {n} is not accepting connections"
                                                     for n in ("stream", "ws", "zmq"))
            assert body["writer"] == "running"
            status, _, text = await get(broker, "/metrics")
            up = {s.labels["listener"]: s.value for f in text_string_to_metric_families(text)
                  if f.name == "riverbed_listener_up" for s in f.samples}
            assert up == {"stream": 0, "zmq": 0, "ws": 0, "http": 1}
    run(main())


def test_readyz_is_503_before_every_listener_is_up_and_once_stopping(tmp_path):
    async def main():
        # an HTTP listener on a broker that `riverbed serve` has not declared ready: starting
        engine = Engine(str(tmp_path / "alone"))
        try:
            broker = Broker(engine, post=asyncio.get_running_loop().call_soon_threadsafe)
            srv = await serve(broker, host="127.0.0.1", port=0)
            try:
                async with aiohttp.ClientSession() as s:
                    async with s.get(f"http://127.0.0.1:{srv.port}/readyz") as r:
                        assert r.status == 503
                        assert await r.json() == {"status": "not ready", "reason": "starting"}
            finally:
                srv.stop_accepting()
                await srv.shutdown()
        finally:
            engine.close()

        # a real server: ready while it runs; once asked to stop it is not (its listeners close at
        # once, so the handler is called directly at that moment)
        seen = {}
        async with running(tmp_path, stream_port="0") as broker:
            assert await get_json(broker, "/readyz") == (200, {"status": "ready"})
            seen["broker"] = broker
        resp = await health.readyz(types.SimpleNamespace(app={BROKER: seen["broker"]}))
        assert resp.status == 503
        assert resp.text == '{"status": "not ready", "reason": "stopping"}'
    run(main())
