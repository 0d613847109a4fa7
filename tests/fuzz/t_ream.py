"""REAM text: the line and payload parsers (codec) and ReamSession (session).

Input: flag byte, then raw client bytes (request lines, sized payload lines). REAM has no handshake;
FLAG_PRELUDE publishes one event to stream ``sss`` and subscribes to it first.
"""

import re

from riverbed.shells import _pywire, wire
from riverbed.shells.ream_text import ReamSession, ReamShell
from riverbed.shells.ream_text import codec as C

from .harness import FLAG_PRELUDE, FakeIO, InvariantBroken, SessionTarget

PROBE = b"EVENT LIST\n"


def sized(head, payload):
    if isinstance(payload, str):
        payload = payload.encode()
    return head.encode() + b" %d\n" % len(payload) + payload + b"\n"


PRELUDE_PUBLISH = sized("EVENT PUBLISH sss", '{"a":1}')
# The network soak (bench/soak.py) sends its prelude in one write, before it can read an answer: it
# publishes and subscribes from the start of sss (a soak connection lives long; the cost is paid once).
PRELUDE = PRELUDE_PUBLISH + b"EVENT SUBSCRIBE sss 0\n"


class ReamTarget(SessionTarget):
    name = "ream"
    codec_errors = (C.ReamError,)

    def make_shell(self):
        return ReamShell(self.rig.broker)

    def codec(self, body):
        body = bytes(body)
        # the publish-run splitter at every request start: the twins agree, and each taken request is
        # exactly the plain form (what the per-request path would have read there)
        at = 0
        while at < len(body):
            run = wire.ream_publish_run(body, at, 1 << 20, 1 << 30)
            if wire.COMPILED and run != _pywire.ream_publish_run(body, at, 1 << 20, 1 << 30):
                raise InvariantBroken(f"ream_publish_run at {at}: the twins disagree")
            name, payloads, ends = run
            for payload, end in zip(payloads, ends):
                # the per-request parser reads the same request there: its words, size and payload line
                nl = body.index(b"\n", at)
                words = C.split_words(body[at:nl].decode("utf-8"))
                if (words[:3] != ["EVENT", "PUBLISH", name.decode("ascii")] or len(words) != 4
                        or C.parse_size(words[3]) != len(payload) or body[nl + 1:end] != payload + b"\n"
                        or b"\n" in payload):
                    raise InvariantBroken(f"ream_publish_run at {at}: took {body[at:end]!r}")
                at = end
            if ends:
                continue
            nl = body.find(b"\n", at)
            at = len(body) if nl < 0 else nl + 1
        for raw in bytes(body).split(b"\n")[:64]:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
            words = text.split()
            for w in words[:8]:
                for parse in (C.parse_size, C.parse_id, C.check_name):
                    try:
                        parse(w)
                    except C.ReamError:
                        pass
            try:
                C.parse_json_object(raw)
            except C.ReamError:
                pass

    def open_session(self):
        io = FakeIO()
        self.rig.ios = [io]
        return ReamSession(self.shell, io, peer="fuzz", local=("127.0.0.1", 7461), remote=("127.0.0.1", 5555),
                           peer_loopback=True)

    def prelude(self, s):
        # Subscribe from the event just published, not from id 1: stream sss lives until the next engine
        # reset (RESET_EVERY inputs), and replaying all of it to every prelude input made each input
        # cost more than the one before (11 inputs/s late in a 5,000-input generation).
        s.data_received(PRELUDE_PUBLISH)
        self.rig.settle()
        m = re.search(rb"EVENT PUBLISHED sss (\d+)\n", s.io.out)
        s.data_received(b"EVENT SUBSCRIBE sss %s\n" % (m.group(1) if m else b"1"))
        self.rig.settle()
        s.io.out.clear()

    def feed(self, s, piece):
        s.data_received(piece)

    def probe(self, s):
        if s.io.closed or s.state != C.ST_OPEN or s._stop_reading or s.req is not None or s.buf or not s.io.reading:
            return None
        mark = len(s.io.out)
        s.data_received(PROBE)
        self.rig.settle()
        return len(s.io.out) > mark or s.io.closed

    def seeds(self):
        p = bytes([FLAG_PRELUDE])
        return [
            b"\x00" + sized("EVENT PUBLISH abc", '{"x":1,"y":"z"}') + b"EVENT LIST\nPING\n",
            p + sized("EVENT PUBLISH sss", '{"b":[1,2]}') + b"EVENT UNSUBSCRIBE sss\n",
            b"\x00" + b"EVENT SUBSCRIBE abc 0\r\n" + sized("EVENT PUBLISH abc", '{"q":null}') + b"EVENT REMOVE abc\n",
            b"\x00" + sized("AGGREGATE SET agg 1", '{"k":"v"}') + b"AGGREGATE GET agg 1\nAGGREGATE LIST\n"
            + b"AGGREGATE REMOVE agg 1\n",
            b"\x00" + b"PROJECTION CREATE prj 2 name age\n" + sized("PROJECTION SET prj", '{"name":"a","age":3}')
            + sized("PROJECTION SELECT prj", '{"where":"age > 1"}') + b"PROJECTION DROP prj\n",
            b"\x00" + b"PROJECTION CREATE prj 1 n\n" + b"PROJECTION UPDATE prj 9 7\n" + b'{"n":"a"}\n{"n":2}\n'
            + sized("PROJECTION DELETE prj", '{"n":"a"}'),
            b"\x00" + b"EVENT PUBLISH abc 5\n123456789\nPONG\nNONSENSE\n\n",
            b"\x00" + b"AGGREGATE GET agg 01234567-89ab-cdef-0123-456789abcdef\n",
        ]
