"""Admin, binder and query frames of a BSON/TCP connection (a mixin of BsonSession): PING, channel and
binder listing and creation, CREATEPROJECTION, FINDBYID, QUERY/QUERYACK. Loop-thread only."""

import logging

import bson
from bson.raw_bson import RawBSONDocument

from riverbed.engine.errors import InvalidArgument
from riverbed.engine.predicate import from_mongo
from riverbed.shells.bson_tcp import codec as c
from riverbed.shells.bson_tcp.projections import RESERVED_PREFIX, normalize_definition
from riverbed.shells.bson_tcp.queries import QueryRun
from riverbed.shells.broker import CONFIGURE, READ

log = logging.getLogger("riverbed.bson")


class AdminCommands:
    """The frames that read or shape binders and channels (mixed into BsonSession, which provides
    ``broker``, ``shell``, ``queries``, ``_reply``, ``_later``, ``_can``, ``_send_many``)."""

    # -------------------------------------------------------------------------------------- admin

    def _on_ping(self, f):
        seq = f.get("sequence")
        if not c.is_int(seq):
            seq = 0
        if f.get("type", c.PING_REQUEST) == c.PING_REQUEST:
            self._reply(c.encode_ping((seq + 1) & 0x7FFFFFFF))

    def _on_listchannels(self, f):
        self._reply(c.response(f.get("rID"), True, channels=self.broker.list_streams()))

    def _on_createchannel(self, f):
        rid, name = f.get("rID"), f.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidArgument("CREATECHANNEL needs a string 'name'")
        if not self._can(CONFIGURE, name):
            self._reply(c.response(rid, False, c.ERR_NOT_AUTHORISED, f"no configure permission on {name!r}"))
            return
        if self.broker.has_stream(name):
            self._reply(c.response(rid, True, exists=True))
            return

        def created(exc):
            if exc is None:
                self._reply(c.response(rid, True, exists=False))
            else:
                self._reply(c.response(rid, False, c.ERR_COMMAND_NOT_PROCESSED, str(exc)))
        self.shell.ensure_channel(name, self._later(created))

    def _binders(self):
        return [n for n in self.shell.docs.list_collections() if not n.startswith(RESERVED_PREFIX)]

    def _on_listbinders(self, f):
        self._reply(c.response(f.get("rID"), True, binders=self._binders()))

    def _on_createbinder(self, f):
        rid, name = f.get("rID"), f.get("name")
        if not isinstance(name, str) or not name or name.startswith(RESERVED_PREFIX):
            raise InvalidArgument("CREATEBINDER needs a string 'name' (not starting with _riverbed)")
        if not self._can(CONFIGURE, name):
            self._reply(c.response(rid, False, c.ERR_NOT_AUTHORISED, f"no configure permission on {name!r}"))
            return
        if self.shell.docs.collection_info(name) is not None:
            self._reply(c.response(rid, True, exists=True))
            return

        def created(res, exc):
            if exc is None:
                self._reply(c.response(rid, True, exists=not res))
            else:
                self._reply(c.response(rid, False, c.ERR_COMMAND_NOT_PROCESSED, str(exc)))
        self.broker.then(self.shell.docs.create_collection(name), self._later(created))

    def _on_createprojection(self, f):
        rid = f.get("rID")
        d = normalize_definition(f)
        if not self._can(CONFIGURE, d["channel"]):
            self._reply(c.response(rid, False, c.ERR_NOT_AUTHORISED, f"no configure permission on {d['channel']!r}"))
            return

        def done(exc):
            if exc is None:
                self._reply(c.response(rid, True))
            else:
                self._reply(c.response(rid, False, c.ERR_COMMAND_NOT_PROCESSED, str(exc)))
        done = self._later(done)

        def channel_ready(exc):
            if exc is not None:
                done(exc)
            else:
                self.shell.projections.create(d, done)
        self.shell.ensure_channel(d["channel"], channel_ready)

    # ------------------------------------------------------------------------------------ queries

    def _on_findbyid(self, f):
        rid, binder = f.get("rID"), f.get("binder")
        doc_id = f["docID"] if "docID" in f else f.get("dodID")
        if not isinstance(binder, str) or not binder:
            raise InvalidArgument("FINDBYID needs a string 'binder'")
        if not self._can(READ, binder):
            self._reply(c.response(rid, False, c.ERR_NOT_AUTHORISED, f"no read permission on {binder!r}"))
            return
        docs = self.shell.docs
        if docs.collection_info(binder) is None:
            self._reply(c.response(rid, False, c.ERR_NO_SUCH_BINDER, f"no binder {binder!r}"))
            return
        raw = docs.get_raw(binder, doc_id) if _valid_id(doc_id) else None
        if raw is None:
            self._reply(c.response(rid, True))
        else:
            self._reply(c.response(rid, True, doc=RawBSONDocument(raw)))

    def _on_query(self, f):
        qid = f.get("queryID")
        binder = f.get("binder")

        def fail(code, msg):
            self._reply(c.encode_query_result(qid, None, True, ok=False, errCode=code, errMsg=msg))
        if not c.is_int(qid):
            return fail(c.ERR_COMMAND_NOT_PROCESSED, "QUERY needs an integer queryID")
        if qid in self.queries:
            return fail(c.ERR_COMMAND_NOT_PROCESSED, f"query {qid} is already running")
        if not isinstance(binder, str) or not binder:
            return fail(c.ERR_COMMAND_NOT_PROCESSED, "QUERY needs a string 'binder'")
        if not self._can(READ, binder):
            return fail(c.ERR_NOT_AUTHORISED, f"no read permission on {binder!r}")
        docs = self.shell.docs
        if docs.collection_info(binder) is None:
            return fail(c.ERR_NO_SUCH_BINDER, f"no binder {binder!r}")
        if "docID" in f:
            doc_id = f["docID"]
            raw = docs.get_raw(binder, doc_id) if _valid_id(doc_id) else None
            results = [] if raw is None else [raw]
            self._start_query(qid, results)
            return
        matcher = f.get("matcher") or {}
        if not isinstance(matcher, dict):
            return fail(c.ERR_COMMAND_NOT_PROCESSED, "matcher must be a document")
        try:
            node = from_mongo(matcher)
        except (InvalidArgument, ValueError) as e:
            return fail(c.ERR_COMMAND_NOT_PROCESSED, f"bad matcher: {e}")
        self.queries[qid] = None          # reserved while the store is read off the loop

        def found(results, exc):
            if self.queries.get(qid, 0) is not None:
                return
            if exc is not None:
                del self.queries[qid]
                log.warning("%s: query %d on %r failed: %s", self.peer, qid, binder, exc)
                return fail(c.ERR_SERVER_ERROR, f"query failed: {exc}")
            self._start_query(qid, results)
        # a matcher may read a whole binder: run it on the shell's reader threads, not the loop
        self.broker.then(self.shell.read_async(lambda: [_encode_doc(d) for _, d in docs.find(binder, node)]),
                         self._later(found))

    def _start_query(self, qid, results):
        q = QueryRun(self, qid, results)
        self.queries[qid] = q
        q.pump()

    def _query_done(self, q):
        if self.queries.get(q.query_id) is q:
            del self.queries[q.query_id]

    def _on_queryack(self, f):
        q = self.queries.get(f.get("queryID"))     # None also while a query is being read
        n = f.get("bytes")
        if q is not None and c.is_int(n) and n > 0:
            q.ack(n)


def _valid_id(v):
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return -(1 << 63) <= v < (1 << 63)
    return isinstance(v, str) and 0 < len(v.encode("utf-8", "surrogatepass")) <= 255


def _encode_doc(d):
    return bson.encode(d)
