"""The real rstream 1.1.1 client against ``riverbed serve``."""

import asyncio
import time

import pytest
from rstream import (
    ConsumerOffsetSpecification, Consumer, FilterConfiguration, OffsetNotFound, OffsetSpecification,
    OffsetType, Producer, RawMessage, RouteType, SuperStreamCreationOption, SuperStreamProducer,
)
from rstream.exceptions import StreamAlreadyExists, StreamDoesNotExist

import rawwire

pytestmark = pytest.mark.integration

CREDS = dict(username="guest", password="guest")


def run(coro, timeout=120):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


def body(i, size=100):
    head = b"msg-%09d|" % i
    return head + b"x" * (size - len(head))


def index_of(message):
    return int(bytes(message)[4:13])


async def publish(port, stream, ids, *, batch=1000, name=None, explicit_ids=False, **producer_kw):
    """Publish body(i) for i in ids (rstream assigns publishing ids unless explicit_ids); returns the set
    of confirmed publishing ids."""
    confirmed, failed = set(), []
    done = asyncio.Event()
    total = len(ids)

    def on_confirm(status):
        (confirmed.add(status.message_id) if status.is_confirmed else failed.append(status))
        if len(confirmed) + len(failed) >= total:
            done.set()

    async with Producer("127.0.0.1", port, **CREDS, **producer_kw) as p:
        for start in range(0, total, batch):
            chunk = ids[start:start + batch]
            msgs = [RawMessage(body(i), publishing_id=i) if explicit_ids else body(i) for i in chunk]
            await p.send_batch(stream, msgs, publisher_name=name, on_publish_confirm=on_confirm)
        await asyncio.wait_for(done.wait(), 60)
    assert not failed, failed[:5]
    return confirmed


async def publish_batches(port, stream, batches):
    """One send_batch per list in ``batches``, each confirmed before the next (so one chunk each)."""
    async with Producer("127.0.0.1", port, **CREDS) as p:
        for ids in batches:
            fut = asyncio.get_running_loop().create_future()
            left = [len(ids)]

            def cb(status, fut=fut, left=left):
                left[0] -= 1
                if left[0] == 0 and not fut.done():
                    fut.set_result(None)
            await p.send_batch(stream, [body(i) for i in ids], on_publish_confirm=cb)
            await asyncio.wait_for(fut, 20)


async def consume(port, stream, spec, expect, *, settle=0.3, timeout=30, before=None, **subscribe_kw):
    """Subscribe with ``spec`` and collect (offset, message) until ``expect`` messages arrived (plus
    ``settle`` seconds to catch extras). ``before`` is awaited after subscribing."""
    got = []
    done = asyncio.Event()

    async def on_message(msg, ctx):
        got.append((ctx.offset, bytes(msg)))
        if len(got) >= expect:
            done.set()

    async with Consumer("127.0.0.1", port, **CREDS) as c:
        await c.subscribe(stream, on_message, offset_specification=spec, **subscribe_kw)
        if before is not None:
            await before()
        await asyncio.wait_for(done.wait(), timeout)
        await asyncio.sleep(settle)
    return got


def check(got, offsets):
    """Every message is there, in order, once, with the body of its offset."""
    assert [o for o, _ in got] == list(offsets)
    for o, m in got:
        assert m == body(o), (o, m[:20])


# -------------------------------------------------------------------------------------- streams


def test_create_and_delete(server):
    async def scenario():
        async with Producer("127.0.0.1", server.port, **CREDS) as p:
            await p.create_stream("cd", arguments={"max-length-bytes": 10_000_000, "max-age": "1D"})
            assert await p.stream_exists("cd")
            with pytest.raises(StreamAlreadyExists):
                await p.create_stream("cd")
            await p.create_stream("cd", exists_ok=True)
            await p.delete_stream("cd")
            assert not await p.stream_exists("cd")
            with pytest.raises(StreamDoesNotExist):
                await p.delete_stream("cd")
    run(scenario())


def test_100k_messages_with_confirms(server):
    n = 100_000

    async def scenario():
        async with Producer("127.0.0.1", server.port, **CREDS) as p:
            await p.create_stream("big")
        t0 = time.monotonic()
        confirmed = await publish(server.port, "big", list(range(n)), batch=2000)
        elapsed = time.monotonic() - t0
        assert confirmed == set(range(1, n + 1))     # rstream numbers messages from 1
        got = await consume(server.port, "big", ConsumerOffsetSpecification(OffsetType.FIRST), n, settle=0.2)
        check(got, range(n))
        return elapsed
    elapsed = run(scenario())
    print(f"100k published and confirmed in {elapsed:.2f} s")


def test_consume_from_every_offset_type(server):
    stream = "offsets"
    batches = [list(range(k * 200, (k + 1) * 200)) for k in range(5)]

    async def scenario():
        async with Producer("127.0.0.1", server.port, **CREDS) as p:
            await p.create_stream(stream)
        await publish_batches(server.port, stream, batches[:3])
        await asyncio.sleep(0.05)
        ts = int(time.time() * 1000)
        await asyncio.sleep(0.05)
        await publish_batches(server.port, stream, batches[3:])

        check(await consume(server.port, stream, ConsumerOffsetSpecification(OffsetType.FIRST), 1000), range(1000))
        check(await consume(server.port, stream, ConsumerOffsetSpecification(OffsetType.LAST), 200),
              range(800, 1000))
        check(await consume(server.port, stream, ConsumerOffsetSpecification(OffsetType.OFFSET, 333), 667),
              range(333, 1000))
        check(await consume(server.port, stream, ConsumerOffsetSpecification(OffsetType.TIMESTAMP, ts), 400),
              range(600, 1000))

        async def more():
            await publish_batches(server.port, stream, [list(range(1000, 1050))])
        check(await consume(server.port, stream, ConsumerOffsetSpecification(OffsetType.NEXT), 50, before=more),
              range(1000, 1050))
    run(scenario())


def test_dedup_across_reconnect_with_named_publisher(server):
    stream = "dedup"

    async def scenario():
        async with Producer("127.0.0.1", server.port, **CREDS) as p:
            await p.create_stream(stream)
        # first connection: ids 1..100
        assert await publish(server.port, stream, list(range(1, 101)), name="app-1", explicit_ids=True) == \
            set(range(1, 101))
        # reconnect and resend an overlapping window 51..150: all confirmed, 51..100 dropped as duplicates
        assert await publish(server.port, stream, list(range(51, 151)), name="app-1", explicit_ids=True) == \
            set(range(51, 151))
        # a third connection continues from the stored sequence (QueryPublisherSequence = 150)
        async with Producer("127.0.0.1", server.port, **CREDS) as p:
            ids = await p.send_batch(stream, [body(151)], publisher_name="app-1")
            assert ids == [151]
            await asyncio.sleep(0.3)
        got = await consume(server.port, stream, ConsumerOffsetSpecification(OffsetType.FIRST), 151)
        assert [index_of(m) for _, m in got] == list(range(1, 152))
    run(scenario())


def test_load_balancer_mode_accepts_the_advertised_address(server):
    # with load_balancer_mode rstream reconnects until OpenResponse's advertised_host/port equal the
    # leader address from Metadata: both must name the same reachable address
    async def scenario():
        async with Producer("127.0.0.1", server.port, **CREDS, load_balancer_mode=True, max_retries=2) as p:
            await p.create_stream("lb")
            await p.send_wait("lb", b"hello")
    run(scenario())


def test_store_and_query_offset(server):
    async def scenario():
        async with Consumer("127.0.0.1", server.port, **CREDS) as c:
            await c.create_stream("tracked")
            with pytest.raises(OffsetNotFound):
                await c.query_offset("tracked", "reader-1")
            await c.store_offset("tracked", "reader-1", 42)
            assert await c.query_offset("tracked", "reader-1") == 42
            await c.store_offset("tracked", "reader-1", 43)
        async with Consumer("127.0.0.1", server.port, **CREDS) as c:
            assert await c.query_offset("tracked", "reader-1") == 43
    run(scenario())


def test_single_active_consumer_failover(server):
    stream, group = "sac", "billing"
    n = 1000

    async def scenario():
        async with Producer("127.0.0.1", server.port, **CREDS) as p:
            await p.create_stream(stream)
        await publish_batches(server.port, stream, [list(range(k * 100, (k + 1) * 100)) for k in range(10)])
        props = {"single-active-consumer": "true", "name": group}
        activations = []

        async def listener(is_active, ctx):
            activations.append((ctx.subscriber_id, is_active))
            try:
                stored = await ctx.consumer.query_offset(ctx.stream, ctx.reference)
            except OffsetNotFound:
                return OffsetSpecification(OffsetType.FIRST, 0)
            return OffsetSpecification(OffsetType.OFFSET, stored + 1)

        a_got, b_got = [], []
        a_half, b_done = asyncio.Event(), asyncio.Event()

        async def on_a(msg, ctx):
            if a_half.is_set():
                return                      # processing stopped; not acknowledged
            a_got.append(ctx.offset)
            if ctx.offset == 499:
                await ctx.consumer.store_offset(ctx.stream, group, ctx.offset)
                a_half.set()

        async def on_b(msg, ctx):
            b_got.append(ctx.offset)
            if ctx.offset == n - 1:
                b_done.set()

        a = Consumer("127.0.0.1", server.port, **CREDS)
        b = Consumer("127.0.0.1", server.port, **CREDS)
        await a.start()
        await b.start()
        try:
            await a.subscribe(stream, on_a, properties=props, subscriber_name=group, consumer_update_listener=listener)
            await asyncio.wait_for(a_half.wait(), 20)
            await b.subscribe(stream, on_b, properties=props, subscriber_name=group, consumer_update_listener=listener)
            await asyncio.sleep(0.5)
            assert b_got == []                 # inactive while A is there
            await a.close()                    # the active consumer goes away
            await asyncio.wait_for(b_done.wait(), 20)
        finally:
            await b.close()
        assert a_got == list(range(500))
        assert b_got == list(range(500, n))   # B took over right after A's stored offset
        assert len(activations) == 2 and all(active for _, active in activations)
    run(scenario())


def test_super_stream_created_through_the_protocol_with_routing(server):
    keys = ["eu", "us", "asia"]
    partitions = [f"orders-{k}" for k in keys]

    async def route_key(message):
        return bytes(message).split(b":", 1)[0].decode()

    def hash_partition(key):
        # rstream's client-side hash routing (mmh3 over UTF-16) over the Partitions reply, in order
        import mmh3
        h = int.from_bytes(mmh3.hash_bytes(bytes(key, "UTF-16"), 104729), "little", signed=False)
        return partitions[h % len(partitions)]

    async def scenario():
        confirmed = []
        # rstream 1.1.1's RouteType.Key caches the first Route reply for every key (a client bug), so the
        # producer uses hash routing; key routing is checked with Route requests below.
        async with SuperStreamProducer("127.0.0.1", server.port, **CREDS, super_stream="orders",
                                       super_stream_creation_option=SuperStreamCreationOption(
                                           n_partitions=0, binding_keys=keys),
                                       routing_extractor=route_key, routing=RouteType.Hash) as ssp:
            for i in range(90):
                await ssp.send(b"k%d:%d" % (i % 9, i), on_publish_confirm=confirmed.append)
            for _ in range(100):
                if len(confirmed) == 90:
                    break
                await asyncio.sleep(0.1)
        assert len(confirmed) == 90 and all(c.is_confirmed for c in confirmed)

        async with Producer("127.0.0.1", server.port, **CREDS) as p:
            client = await p.default_client
            for k in keys:
                assert await client.route(k, "orders") == [f"orders-{k}"]
            assert await client.route("mars", "orders") == []
            assert await client.partitions("orders") == partitions
            assert await client.partitions("no-such-super-stream") == []

        expected = {p: sorted(b"k%d:%d" % (i % 9, i) for i in range(90) if hash_partition("k%d" % (i % 9)) == p)
                    for p in partitions}
        assert sum(len(v) for v in expected.values()) == 90
        for part in partitions:
            want = expected[part]
            if not want:
                continue
            got = await consume(server.port, part, ConsumerOffsetSpecification(OffsetType.FIRST), len(want),
                                settle=0.2)
            assert sorted(m for _, m in got) == want

        async with SuperStreamProducer("127.0.0.1", server.port, **CREDS, super_stream="orders",
                                       routing_extractor=route_key) as ssp:
            await ssp.delete_super_stream("orders")
        async with Producer("127.0.0.1", server.port, **CREDS) as p:
            assert not await p.stream_exists("orders-eu")
    run(scenario())


def test_filtering(server):
    stream = "colours"

    async def colour(message):
        return bytes(message).split(b":", 1)[0].decode()

    async def scenario():
        async with Producer("127.0.0.1", server.port, **CREDS) as p:
            await p.create_stream(stream)
        async with Producer("127.0.0.1", server.port, **CREDS, filter_value_extractor=colour) as p:
            for c in ["red", "blue", "red", "green", "blue"]:
                fut = asyncio.get_running_loop().create_future()
                left = [100]

                def cb(status, fut=fut, left=left):
                    left[0] -= 1
                    if left[0] == 0:
                        fut.set_result(None)
                await p.send_batch(stream, [b"%s:%d" % (c.encode(), i) for i in range(100)], on_publish_confirm=cb)
                await asyncio.wait_for(fut, 10)
        got = await consume(server.port, stream, ConsumerOffsetSpecification(OffsetType.FIRST), 200, settle=0.5,
                            filter_input=FilterConfiguration(values_to_filter=["blue"], match_unfiltered=False))
        assert len(got) == 200 and all(m.startswith(b"blue:") for _, m in got)
        assert sorted({o // 100 for o, _ in got}) == [1, 4]         # only the two blue chunks were sent
    run(scenario())


def test_stream_stats(server):
    async def scenario():
        async with Producer("127.0.0.1", server.port, **CREDS) as p:
            await p.create_stream("stats")
        await publish_batches(server.port, "stats", [list(range(10)), list(range(10, 25))])
    run(scenario())
    raw = rawwire.RawClient(server.port)
    try:
        assert raw.handshake() == rawwire.OK
        assert raw.stream_stats("stats") == (rawwire.OK, {"first_chunk_id": 0, "committed_chunk_id": 10,
                                                           "last_chunk_id": 10})
        assert raw.stream_stats("nope")[0] == 0x02
    finally:
        raw.close()


def test_metadata_update_reaches_subscribers_of_a_deleted_stream(server):
    async def scenario():
        events = []
        async with Producer("127.0.0.1", server.port, **CREDS) as p:
            await p.create_stream("doomed")
        c = Consumer("127.0.0.1", server.port, **CREDS, on_close_handler=events.append)
        await c.start()
        try:
            async def ignore(msg, ctx):
                pass
            await c.subscribe("doomed", ignore)
            async with Producer("127.0.0.1", server.port, **CREDS) as p:
                await p.delete_stream("doomed")
            for _ in range(50):
                if events:
                    break
                await asyncio.sleep(0.1)
        finally:
            await c.close()
        assert events and events[0].reason == "Metadata Update" and events[0].streams == ["doomed"]
    run(scenario())


class _LibCodec:
    """An rstream compression codec backed by a library (rstream 1.1.1 ships only none and gzip)."""

    def __init__(self, code, compress, decompress):
        self.code, self._compress, self._decompress = code, compress, decompress
        self.buffer, self.count, self.usize = b"", 0, 0

    def compress(self, messages):
        raw = b"".join(len(bytes(m)).to_bytes(4, "big") + bytes(m) for m in messages)
        self.buffer, self.count, self.usize = self._compress(raw), len(messages), len(raw)

    def uncompress(self, compressed_data, uncompressed_data_size):
        return self._decompress(bytes(compressed_data))

    def compressed_size(self):
        return len(self.buffer)

    def uncompressed_size(self):
        return self.usize

    def messages_count(self):
        return self.count

    def compression_type(self):
        return self.code

    def data(self):
        return self.buffer


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_sub_entry_batches_with_every_codec(server, codec):
    import cramjam
    import lz4.frame
    import zstandard
    from rstream import CompressionType
    from rstream.compression import ICompressionCodec, StreamCompressionCodecs

    libs = {"snappy": (CompressionType.Snappy, lambda d: bytes(cramjam.snappy.compress(d)),
                       lambda d: bytes(cramjam.snappy.decompress(d))),
            "lz4": (CompressionType.Lz4, lz4.frame.compress, lz4.frame.decompress),
            "zstd": (CompressionType.Zstd, zstandard.ZstdCompressor().compress,
                     lambda d: zstandard.ZstdDecompressor().decompress(d, max_output_size=1 << 26))}
    ctype = {"none": CompressionType.No, "gzip": CompressionType.Gzip}.get(codec)
    if ctype is None:
        ctype, comp, decomp = libs[codec]
        cls = type(f"{codec}Codec", (_LibCodec, ICompressionCodec), {})
        StreamCompressionCodecs.register_codec(ctype, cls(ctype.value, comp, decomp))
    stream = f"sub-{codec}"

    async def scenario():
        confirmed = []
        async with Producer("127.0.0.1", server.port, **CREDS) as p:
            await p.create_stream(stream)
            for k in range(3):
                await p.send_sub_entry(stream, [body(k * 100 + i) for i in range(100)], compression_type=ctype,
                                       on_publish_confirm=confirmed.append)
            for _ in range(100):
                if len(confirmed) == 3:
                    break
                await asyncio.sleep(0.1)
        assert len(confirmed) == 3 and all(c.is_confirmed for c in confirmed), confirmed
        check(await consume(server.port, stream, ConsumerOffsetSpecification(OffsetType.FIRST), 300), range(300))
    run(scenario())
