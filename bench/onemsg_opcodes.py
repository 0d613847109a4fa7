"""Python opcodes per one-message Publish (issue 26), by function: what CPython runs of the session, broker
and engine for one message per frame, counted with ``sys.settrace`` opcode events (deterministic, unlike
any timing on a shared machine; callgrind's counts are C functions, and in CPython 3.11 nearly all of the
Python work is one C function, the interpreter loop).

The set-up is ``bench.bench_publish``'s: the real RmqStreamSession, Broker and Engine (fsync never) on an
event loop, fed Publish frames of one 100-byte message, each confirmed before the next; the publisher
is unnamed as the load generator's, or named (``--named``) as rbfly's. The listener's transport adapter
(``SessionProtocol.data_received`` and the session's guard, two small frames) is not in it.

    .venv/bin/python -m bench.onemsg_opcodes [--named] [--messages 200]
"""

import argparse
import asyncio
import collections
import os
import shutil
import sys
import tempfile

from rstream import schema
from rstream.encoding import encode_frame, encode_publish

from bench.bench_publish import _CaptureIO, _request
from riverbed.engine import Engine
from riverbed.shells import rmq_stream as rs
from riverbed.shells.broker import Broker


async def count(named, n, warmup=200):
    loop = asyncio.get_running_loop()
    tmp = tempfile.mkdtemp(prefix="rb-onemsg-ops-")
    eng = Engine(os.path.join(tmp, "data"), fsync="never", retention_interval=0)
    broker = Broker(eng, post=loop.call_soon_threadsafe, post_local=loop.call_soon, data_dir=os.path.join(tmp, "data"))
    io = _CaptureIO(loop)
    s = rs.RmqStreamSession(rs.RmqShell(broker), io, peer="bench", local_host="127.0.0.1", peer_loopback=True)
    ops = collections.Counter()
    calls = collections.Counter()

    here = os.path.dirname(os.path.abspath(__file__))

    def tracer(frame, event, arg):
        if event == "call":
            code = frame.f_code
            if os.path.dirname(os.path.abspath(code.co_filename)) == here:
                return None     # the bench's own io (it stands for the client): not the server's work
            calls[(code.co_qualname, os.path.basename(code.co_filename))] += 1
            frame.f_trace_opcodes = True
            return tracer
        if event == "opcode":
            code = frame.f_code
            ops[(code.co_qualname, os.path.basename(code.co_filename))] += 1
        return tracer

    try:
        s.data_received(encode_frame(schema.PeerProperties(1, []), 1))
        s.data_received(encode_frame(schema.SaslHandshake(2), 1))
        s.data_received(encode_frame(schema.SaslAuthenticate(3, "PLAIN", b"\0guest\0guest"), 1))
        s.data_received(encode_frame(schema.Tune(1048576, 0), 1))
        s.data_received(encode_frame(schema.Open(4, "/"), 1))
        await _request(s, io, schema.Create(5, "bench", []))
        await _request(s, io, schema.DeclarePublisher(6, 1, "rbfly/1" if named else "", "bench"))
        body = b"x" * 100
        frames = [encode_publish(schema.Publish(1, [schema.Message(i + 1, None, body)]), 1)
                  for i in range(n + warmup)]
        for i, frame in enumerate(frames):
            fut = io.waiter = loop.create_future()
            if i >= warmup:
                sys.settrace(tracer)
            s.data_received(frame)
            sys.settrace(None)
            if not fut.done():
                # not confirmed within the read: what the loop runs until it is (asyncio's own Python
                # included) counts too
                if i >= warmup:
                    sys.settrace(tracer)
                await fut
                sys.settrace(None)
    finally:
        sys.settrace(None)
        s.connection_lost()
        broker.close()
        eng.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return ops, calls


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--named", action="store_true", help="a named publisher (deduplication on), as rbfly's")
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args(argv)
    try:
        import uvloop
        runner = uvloop.run         # as riverbed serve: the loop's own work is C, not counted
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    ops, calls = runner(count(a.named, a.messages))
    n = a.messages
    print(f"Python opcodes per one-message Publish ({'named' if a.named else 'unnamed'} publisher, {n} messages): "
          f"{sum(ops.values()) / n:,.0f} in {sum(calls.values()) / n:,.1f} Python function calls")
    print(f"{'opcodes':>8} {'calls':>6}  function")
    for key, k in ops.most_common(a.top):
        print(f"{k / n:>8.1f} {calls[key] / n:>6.2f}  {key[0]} ({key[1]})")


if __name__ == "__main__":
    main()
