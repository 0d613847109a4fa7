"""The mc0 listener: a pyzmq ROUTER on the asyncio loop, around a sans-I/O :class:`McShell` whose
sessions (one per routing identity) run on the session kernel; this module is their transport adapter.

The ROUTER's file descriptor is registered with the loop (``add_reader``). ZeroMQ signals it
edge-triggered, so after every receive batch and after every send from outside the reader the socket's
``EVENTS`` is checked again (``_kick``); a reader turn takes at most ``RECV_BUDGET`` messages so one busy
client cannot starve the loop.

Sending uses ``ROUTER_MANDATORY``: a send to a peer whose pipe is at the high-water mark fails with
EAGAIN instead of being dropped silently (the session pauses that subscriber and retries), and a send to
a peer that is gone fails with EHOSTUNREACH (the session forgets it). ``ROUTER_HANDOVER`` lets a client
that reconnects with the same IDENTITY take its state over.

Access: a ZAP handler (``inproc://zeromq.zap.01``, in the listener's own context) answers every
connection. Without CURVE only loopback peers are admitted. With ``curve_secret`` the ROUTER is a CURVE
server (plaintext peers are refused by ZeroMQ itself); with ``curve_clients`` only listed keys get 200.
"""

import asyncio
import errno
import logging

import zmq
import zmq.backend

from riverbed.shells import auth as _auth
from riverbed.shells.broker import limits as _limits
from riverbed.shells.broker.session import drain
from riverbed.shells.broker.stats import ERR_REFUSED
from riverbed.shells.zmq_mc0 import keys as _keys
from riverbed.shells.zmq_mc0.session import BLOCKED, GONE, SENT, TICK, McShell
from riverbed.shells.protocols import ZMQ

log = logging.getLogger("riverbed.zmq")

_send = zmq.backend.Socket.send
_MORE = int(zmq.SNDMORE) | int(zmq.NOBLOCK)
_LAST = int(zmq.NOBLOCK)

DEFAULT_PORT = 61616
DEFAULT_HWM = 1000            # messages queued per peer and direction inside ZeroMQ
DEFAULT_MAX_REQUEST = 64 << 20  # bytes of one request (all frames); ZeroMQ drops peers sending bigger frames
RECV_BUDGET = 256             # messages per reader turn
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"riverbed"
SHUTDOWN_LINGER_MS = 1000
MAX_PEERS = 100_000           # identities remembered from ZAP (address, key name) for connection_info


class McServer:
    """One ROUTER listener over the shared broker. Create it with :func:`serve`. ``port`` is the bound
    port; ``shell`` the :class:`McShell` with every client. Loop-thread only."""

    name = ZMQ

    def __init__(self, broker, *, host="127.0.0.1", port=DEFAULT_PORT, curve_secret=None, curve_clients=None,
                 hwm=DEFAULT_HWM, max_request=DEFAULT_MAX_REQUEST):
        self.broker = broker
        self.host = host
        self.port = port
        self.hwm = hwm
        self.max_request = min(max_request, broker.limits.zmq_max_message)
        max_request = self.max_request
        if curve_clients and not curve_secret:
            raise ValueError("zmq_curve_clients (the CURVE allow-list) needs zmq_curve_secret")
        self.curve = None if curve_secret is None else _keys.load_server_keys(curve_secret)
        self.allow = _keys.AllowList(curve_clients) if curve_clients else None
        if self.allow is not None and self.allow.errors:
            for e in self.allow.errors:
                log.warning("zmq: allow-list: %s", e)
        self.shell = McShell(broker, self, host=host, max_request=max_request)
        self.loop = None
        self.ctx = None
        self.sock = None
        self.zap = None
        self.endpoint = None
        self._kicked = False
        self._reading = False
        self._budget_paused = False     # reading stopped by the broker-wide in-flight budget
        self._ticker = None

    # --------------------------------------------------------------------------------- lifecycle

    async def start(self):
        """Bind and start serving. Raises OSError when the address cannot be bound."""
        self.loop = asyncio.get_running_loop()
        # metrics: ZeroMQ hides its connections; the clients the shell knows stand for the open ones
        self.stats = self.broker.stats.listener(self.name, lambda: len(self.shell.clients))
        self.ctx = zmq.Context()
        try:
            self.zap = self.ctx.socket(zmq.ROUTER)
            self.zap.linger = 0
            self.zap.bind(ZAP_ENDPOINT)
            s = self.sock = self.ctx.socket(zmq.ROUTER)
            s.setsockopt(zmq.ROUTER_MANDATORY, 1)
            s.setsockopt(zmq.ROUTER_HANDOVER, 1)
            s.setsockopt(zmq.SNDHWM, self.hwm)
            s.setsockopt(zmq.RCVHWM, self.hwm)
            s.setsockopt(zmq.MAXMSGSIZE, self.max_request)
            s.setsockopt(zmq.LINGER, SHUTDOWN_LINGER_MS)
            s.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
            if self.curve is not None:
                s.setsockopt(zmq.CURVE_SERVER, 1)
                s.setsockopt(zmq.CURVE_SECRETKEY, self.curve[1])
            host = self.host
            if ":" in host:
                s.setsockopt(zmq.IPV6, 1)
                host = f"[{host}]"
            s.bind(f"tcp://{host}:{self.port or '*'}")
        except zmq.ZMQError as e:
            self._close_sockets(0)
            raise OSError(e.errno, f"cannot bind the ZeroMQ listener on {self.host}:{self.port}: {e}") from None
        self.endpoint = s.getsockopt_string(zmq.LAST_ENDPOINT)
        self.port = self.shell.port = int(self.endpoint.rsplit(":", 1)[1])
        self.loop.add_reader(self.zap.getsockopt(zmq.FD), self._on_zap)
        self.loop.add_reader(s.getsockopt(zmq.FD), self._on_readable)
        self._reading = True
        self._ticker = self.loop.call_later(TICK, self._tick)
        self.loop.call_soon(self._on_zap)
        self._kick()
        return self

    def stop_accepting(self):
        if self.sock is not None and self.endpoint:
            try:
                self.sock.unbind(self.endpoint)
            except zmq.ZMQError:
                pass
            self.endpoint = None

    async def shutdown(self, drain_timeout=10.0):
        """Stop accepting and reading, let in-flight PUTs commit and be answered (at most
        ``drain_timeout`` s), forget every client, close (queued replies get ``SHUTDOWN_LINGER_MS``)."""
        self.stop_accepting()
        if self._reading:
            self._reading = False
            self.loop.remove_reader(self.sock.getsockopt(zmq.FD))
        self.shell.closing = True
        # the kernel's drain: each session hands its gathered PUTs on, they commit and are answered,
        # then it closes (what its blocked pipe holds goes out if it can)
        await drain(self.loop, lambda: list(self.shell.clients.values()), drain_timeout=drain_timeout)
        deadline = self.loop.time() + drain_timeout     # appends of sessions already forgotten
        while self.shell.pending_ops and self.loop.time() < deadline:
            await asyncio.sleep(0.01)
        self.shell.close()
        if self._ticker is not None:
            self._ticker.cancel()
        try:
            self.loop.remove_reader(self.zap.getsockopt(zmq.FD))
        except (zmq.ZMQError, ValueError):
            pass
        await self.loop.run_in_executor(None, self._close_sockets, SHUTDOWN_LINGER_MS)

    def _close_sockets(self, linger):
        for s in (self.sock, self.zap):
            if s is not None and not s.closed:
                s.close(linger=linger)
        if self.ctx is not None:
            self.ctx.term()

    # ----------------------------------------------------------------------------------- the io

    def send(self, identity, frames):
        """Send ``frames`` to ``identity``: SENT, BLOCKED (its pipe is full) or GONE (no such peer)."""
        sock = self.sock
        try:
            # the backend's send with int flags: pyzmq's send_multipart costs 3x more in enum arithmetic
            _send(sock, identity, _MORE)
            last = len(frames) - 1
            for i, f in enumerate(frames):
                _send(sock, f, _MORE if i < last else _LAST)
        except zmq.Again:
            return BLOCKED
        except zmq.ZMQError as e:
            if e.errno == errno.EHOSTUNREACH:
                return GONE
            log.warning("zmq: send to %s failed: %s", identity.hex(), e)
            return GONE
        finally:
            if not self._kicked:    # a send may consume the edge of the socket's fd: look again soon
                self._kick()
        return SENT

    def defer(self, fn, *args):
        self.loop.call_soon(self._guard, fn, *args)

    @staticmethod
    def _guard(fn, *args):
        try:
            fn(*args)
        except Exception:
            log.exception("zmq: internal error")

    def _kick(self):
        self._kicked = True
        self.loop.call_soon(self._on_readable)

    # --------------------------------------------------------------------------------- reading

    def _on_readable(self):
        self._kicked = False
        if not self._reading or self._budget_paused:
            return
        sock = self.sock
        handle = self.shell.handle
        for _ in range(RECV_BUDGET):
            if self.broker.hold_if_over_budget(self, self._budget_pause, self._budget_resume):
                # the ROUTER is not read until the broker's in-flight bytes are back at the low mark:
                # ZeroMQ queues up to RCVHWM per peer, then TCP pushes back on the publishers
                return
            if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                return
            try:
                msg = self._recv_bounded(sock)
            except zmq.Again:
                return
            if msg is None or len(msg) < 1:
                continue
            self.stats.reads += 1       # metrics
            try:
                handle(msg[0], msg[1:])
            except Exception:   # a bug must cost that request only, never the listener
                log.exception("zmq: internal error handling a request from %s", msg[0].hex())
        if not self._kicked:
            self._kick()

    def _budget_pause(self):
        self._budget_paused = True

    def _budget_resume(self):
        self._budget_paused = False
        if self._reading and self.loop is not None:
            self._kick()

    def _recv_bounded(self, sock):
        """One message as ``recv_multipart`` gives it, but parts past ``zmq_max_parts`` or bytes past
        ``zmq_max_message`` are not kept: they are received and dropped at once (ZeroMQ delivers a
        multipart message whole, so the rest is there to drain), the client gets an error reply and the
        refusal is counted. Returns None then. A single part over ``ZMQ_MAXMSGSIZE`` never gets here:
        ZeroMQ disconnects its peer."""
        lim = self.broker.limits
        msg = [sock.recv(zmq.NOBLOCK)]
        size = 0
        refused = None
        while sock.getsockopt(zmq.RCVMORE):
            if refused is not None:
                sock.recv(zmq.NOBLOCK, copy=False)      # drained, never copied
                continue
            # copied straight into bytes, as recv_multipart does: a zero-copy Frame and then its .bytes
            # held two copies of a big part at once, and malloc kept more of them from round to round
            part = sock.recv(zmq.NOBLOCK)
            size += len(part)
            if len(msg) > lim.zmq_max_parts:        # the identity is not a part of the client's message
                refused = (_limits.REASON_PARTS, f"message of more than {lim.zmq_max_parts} parts")
            elif size > lim.zmq_max_message:
                refused = (_limits.REASON_FRAME_SIZE, f"message of more than {lim.zmq_max_message} bytes")
            else:
                msg.append(part)
        if refused is None:
            return msg
        _limits.reject("zmq", refused[0], refused[1], msg[0].hex())
        self.stats.reads += 1       # metrics
        self.shell.refuse(msg[0], refused[1])
        return None

    def _tick(self):
        try:
            self.shell.tick()
        except Exception:
            log.exception("zmq: internal error in tick")
        self._ticker = self.loop.call_later(TICK, self._tick)

    # ------------------------------------------------------------------------------------- ZAP

    def _on_zap(self):
        zap = self.zap
        while zap is not None and not zap.closed and zap.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                msg = zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                reply = self.zap_reply(msg)
            except Exception:
                log.exception("zmq: ZAP handler error")
                continue
            # metrics: ZAP sees each connection's handshake once: accepted (200) or refused
            if reply[4] == b"200":
                self.stats.connections_total += 1
            else:
                self.stats.error(ERR_REFUSED)
            try:
                zap.send_multipart(reply, zmq.NOBLOCK)
            except zmq.ZMQError as e:
                log.warning("zmq: ZAP reply failed: %s", e)

    def zap_reply(self, msg):
        """The reply to one ZAP request (ROUTER envelope ``[peer, "", version, request_id, domain,
        address, identity, mechanism, credentials...]``)."""
        env, body = msg[:2], msg[2:]
        if len(body) < 6:
            return env + [b"1.0", body[1] if len(body) > 1 else b"", b"500", b"malformed ZAP request", b"", b""]
        version, request_id, _domain, address, identity, mechanism = body[:6]
        creds = body[6:]
        addr = address.decode("ascii", "replace")

        def answer(code, text, user=b""):
            if code == b"200" and identity:
                peers = self.shell.peers
                peers.pop(bytes(identity), None)
                peers[bytes(identity)] = (user.decode("utf-8", "replace") or None, addr)
                if len(peers) > MAX_PEERS:     # connections that never spoke: forget the oldest
                    del peers[next(iter(peers))]
            elif code != b"200":
                log.info("zmq: refused %s (%s): %s", addr, mechanism.decode("ascii", "replace"), text)
            return env + [b"1.0", request_id, code, text.encode(), user, b""]

        if version != b"1.0":
            return answer(b"400", "unsupported ZAP version")
        if mechanism == b"CURVE":
            if self.curve is None:
                return answer(b"400", "CURVE is not enabled")
            if self.allow is None:
                return answer(b"200", "OK")
            name = self.allow.lookup(creds[0]) if creds else None
            if name is None:
                return answer(b"400", "client key not allowed")
            return answer(b"200", "OK", name.encode("utf-8"))
        if mechanism == b"NULL":
            if self.curve is not None:
                return answer(b"400", "CURVE required")
            if _auth.is_loopback(addr):
                return answer(b"200", "OK")
            return answer(b"400", "only loopback peers are served without CURVE")
        return answer(b"400", "mechanism not supported")


async def serve(broker, *, host="127.0.0.1", port=DEFAULT_PORT, config=None, curve_secret=None, curve_clients=None,
                hwm=DEFAULT_HWM):
    """Start a ZeroMQ mc0 listener (ROUTER) on ``tcp://host:port`` (0 = any free port) over ``broker``.

    ``config`` (a :mod:`riverbed.shells.config` Config), when given, supplies ``zmq_curve_secret``,
    ``zmq_curve_clients`` and ``zmq_hwm``. ``curve_secret``: a file with the server's Z85 secret key
    (makes the ROUTER a CURVE server); ``curve_clients``: the allow-list directory; ``hwm``: messages
    ZeroMQ queues per peer and direction.

    Returns the started :class:`McServer`. Raises OSError when the address cannot be bound and
    ValueError for a bad key file.
    """
    if config is not None:
        curve_secret = config.values.get("zmq_curve_secret", curve_secret)
        curve_clients = config.values.get("zmq_curve_clients", curve_clients)
        hwm = config.values.get("zmq_hwm", hwm)
    if hwm is None or hwm <= 0:    # ZeroMQ reads 0 as "no limit": the one thing a slow peer must not get
        raise ValueError(f"zmq_hwm must be a positive number of messages, not {hwm!r}")
    server = McServer(broker, host=host, port=port, curve_secret=curve_secret, curve_clients=curve_clients,
                      hwm=hwm)
    return await server.start()
