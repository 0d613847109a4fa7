"""The AGGREGATE and PROJECTION requests of a REAM connection (a mixin of :class:`~.session.ReamSession`),
over :mod:`.aggregates` and :mod:`.projections`. Loop-thread only.
"""

from riverbed.shells.ream_text import codec as C
from riverbed.shells.ream_text import expr as X
from riverbed.shells.ream_text.codec import AGGREGATE, KINDS, K_WRITE, ReamError, reason_of, usage_error
from riverbed.shells.ream_text.projections import NOT_FOUND, parse_fields


class DocumentRequests:
    """AGGREGATE SET/GET/REMOVE/LIST and PROJECTION CREATE/SET/SELECT/UPDATE/DELETE/DROP handlers."""

    # ---------------------------------------------------------------------------------- aggregates

    def _agg_args(self, req, nwords):
        self._need(req, nwords)
        return req.words[2], req.words[3], C.parse_id(req.words[3])

    def _on_aggregate_set(self, req, payloads):
        name, word, doc_id = self._agg_args(req, 5)
        self._allow("write", name)
        doc = C.parse_json_object(payloads[0])
        self._begin(K_WRITE)

        def done(res, exc):
            self._end(K_WRITE)
            if exc is not None:
                self._refuse(req, reason_of(exc))
            else:
                self._fill(req.slot, C.line("AGGREGATE", "SET", "DONE", name, word))
        self.shell.aggregates.set(name, doc_id, doc, done)

    def _on_aggregate_get(self, req, payloads):
        name, word, doc_id = self._agg_args(req, 4)
        self._allow("read", name)

        def done(doc, exc):
            if exc is not None:
                self._refuse(req, reason_of(exc))
            elif doc is None:
                self._refuse(req, NOT_FOUND)
            else:
                self._answer(req, C.sized(f"AGGREGATE GOT {name} {word}", C.dumps(doc)))
        self.shell.aggregates.get(name, doc_id, done)

    def _on_aggregate_remove(self, req, payloads):
        name, word, doc_id = self._agg_args(req, 4)
        self._allow("write", name)
        slot = req.slot
        self._begin(K_WRITE)

        def done(res, exc):
            self._end(K_WRITE)
            if exc is not None:
                self._fill(slot, C.non(AGGREGATE, "REMOVED", name, reason_of(exc), word))
            else:
                self._fill(slot, C.line("AGGREGATE", "REMOVED", name, word))
        self.shell.aggregates.remove(name, doc_id, done)

    def _on_aggregate_list(self, req, payloads):
        self._need(req, 2)
        names = self.shell.aggregates.list()
        self._answer(req, C.line("AGGREGATE", "LISTED", len(names), *names))

    # --------------------------------------------------------------------------------- projections

    def _async(self, req, ok):
        """A callback for a store operation: ``ok(result)`` makes the reply; errors get the NON form."""
        slot = req.slot
        kind = KINDS.get((req.noun, req.verb), K_WRITE)
        self._begin(kind)

        def done(res, exc):
            self._end(kind)
            if exc is not None:
                self._refuse(req, reason_of(exc))
            else:
                self._fill(slot, ok(res))
        return done

    def _on_projection_create(self, req, payloads):
        if len(req.words) < 4:
            raise usage_error((req.noun, req.verb))
        name = req.words[2]
        self._allow("configure", name)
        fields = parse_fields(req.words[3], req.words[4:])
        self.shell.projections.create(name, fields, self._async(req, lambda r: C.line("PROJECTION", "CREATED",
                                                                                      name)))

    def _on_projection_drop(self, req, payloads):
        self._need(req, 3)
        name = req.words[2]
        self._allow("configure", name)
        self.shell.projections.drop(name, self._async(req, lambda r: C.line("PROJECTION", "DROPPED", name)))

    def _on_projection_set(self, req, payloads):
        name = req.words[2]
        self._allow("write", name)
        row = C.parse_json_object(payloads[0])
        self.shell.projections.set(name, row, self._async(
            req, lambda pk: C.line("PROJECTION", "SET", "DONE", name, C.format_pk(pk))))

    def _expr(self, payload):
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError:
            raise ReamError("Invalid expression: not UTF-8") from None
        return text

    def _on_projection_select(self, req, payloads):
        name = req.words[2]
        self._allow("read", name)
        pred = X.compile_where(self._expr(payloads[0]))
        self.shell.projections.select(name, pred, self._async(
            req, lambda rows: C.sized(f"PROJECTION SELECTED {name}", C.dumps(rows))))

    def _on_projection_update(self, req, payloads):
        name = req.words[2]
        self._allow("write", name)
        pred = X.compile_where(self._expr(payloads[0]))
        try:
            spec = X.compile_update(self._expr(payloads[1]))
        except X.ExprError as e:
            raise ReamError(f"Invalid update: {e}") from None
        self.shell.projections.update(name, pred, spec, self._async(
            req, lambda n: C.line("PROJECTION", "UPDATED", name, n)))

    def _on_projection_delete(self, req, payloads):
        name = req.words[2]
        self._allow("write", name)
        pred = X.compile_where(self._expr(payloads[0]))
        self.shell.projections.delete(name, pred, self._async(
            req, lambda n: C.line("PROJECTION", "DELETED", name, n)))
