#!/usr/bin/env python3
"""Make docs/dashboard.png: a ``riverbed serve`` with a few streams, publishers at varying rates, a
caught-up consumer, a lagging one and a BSON/TCP subscriber, photographed by headless Debian chromium
through Playwright once the charts have some history.

    .venv/bin/python ci/dashboard-screenshot.py [--out docs/dashboard.png] [--warmup 30]

Needs /usr/bin/chromium (ci/ensure-chromium.sh) and the test extra (playwright, rstream).
"""

import argparse
import asyncio
import json
import math
import os
import random
import sys
import tempfile
import threading
import time

import bson

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

from procs import ServerProcess  # noqa: E402
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer, Properties  # noqa: E402

from riverbed.shells.bson_tcp.client import BsonClient  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CREDS = dict(username="guest", password="guest")
ITEMS = ["book", "lamp", "kettle", "chair", "headphones", "plant"]


def order(i):
    return json.dumps({"order_id": 10_000 + i, "item": random.choice(ITEMS), "qty": random.randint(1, 4),
                       "total": round(random.uniform(5, 120), 2), "currency": "EUR"}).encode()


def reading(i):
    return bson.encode({"sensor": f"s-{i % 12:02d}", "celsius": round(20 + 3 * math.sin(i / 40), 2), "seq": i})


def payment(i):
    return AMQPMessage(body=json.dumps({"payment": i, "status": "captured"}).encode(),
                       properties=Properties(content_type="application/json"))


async def workload(srv, stop):
    streams = {"orders": order, "sensor-readings": reading, "payments": payment}
    async with Producer("127.0.0.1", srv.port, **CREDS, connection_name="shop-frontend") as p:
        for name in (*streams, "audit-log"):
            await p.create_stream(name, arguments={"max-age": "7D"})
        await p.send_batch("audit-log", [AMQPMessage(body=f"user {u} logged in".encode(),
                                                     properties=Properties(content_type="text/plain"))
                                         for u in ("ada", "grace", "linus")])
        await p.send_wait("audit-log", bytes(range(0, 48)))
        billing = Consumer("127.0.0.1", srv.port, **CREDS, connection_name="billing")
        analytics = Consumer("127.0.0.1", srv.port, **CREDS, connection_name="analytics")
        await billing.start()
        await analytics.start()

        async def ignore(msg, ctx):
            pass

        async def slowly(msg, ctx):
            await asyncio.sleep(0.004)     # falls behind a busy stream

        await billing.subscribe("orders", ignore, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        await billing.subscribe("payments", ignore, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        await analytics.subscribe("sensor-readings", slowly, initial_credit=1,
                                  offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        bc = await BsonClient.connect("127.0.0.1", srv.ports["bson"])
        sub = await bc.subscribe("orders", start_pos=0)

        async def drain():
            async for _ in sub:
                pass
        drainer = asyncio.get_running_loop().create_task(drain())
        base = {"orders": 250, "sensor-readings": 700, "payments": 60}
        n = dict.fromkeys(streams, 0)
        t0 = time.monotonic()
        while not stop.is_set():
            t = time.monotonic() - t0
            for name, make in streams.items():
                rate = base[name] * (1 + 0.6 * math.sin(t / 6 + len(name)))
                k = max(1, int(rate / 10))
                await p.send_batch(name, [make(n[name] + j) for j in range(k)], publisher_name=f"{name}-writer")
                n[name] += k
            await asyncio.sleep(0.1)
        drainer.cancel()
        await bc.close()
        await billing.close()
        await analytics.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "dashboard.png"))
    ap.add_argument("--warmup", type=float, default=30.0, help="seconds of traffic before the picture")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    random.seed(7)
    with tempfile.TemporaryDirectory() as data:
        srv = ServerProcess(data, "--http-port", "0", "--bson-port", "0").start()
        stop = threading.Event()
        worker = threading.Thread(target=lambda: asyncio.run(workload(srv, stop)))
        try:
            worker.start()
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                ctx = browser.new_context(http_credentials=CREDS, viewport={"width": 1320, "height": 1000},
                                          device_scale_factor=1)
                page = ctx.new_page()
                page.goto(f"http://127.0.0.1:{srv.ports['http']}/")
                time.sleep(args.warmup)
                page.locator('#streams tbody tr[data-stream="orders"]').click()
                page.wait_for_selector("#records .record", timeout=10_000)
                time.sleep(1.5)
                os.makedirs(os.path.dirname(args.out), exist_ok=True)
                page.screenshot(path=args.out, full_page=True)
                browser.close()
        finally:
            stop.set()
            worker.join(30)
            srv.stop()
    print(f"{args.out}: {os.path.getsize(args.out) // 1024} KiB")


if __name__ == "__main__":
    main()
