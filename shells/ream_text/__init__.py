"""REAM 1.0 text shell (issue 15): events, aggregates and projections over a line-based protocol.

``serve(broker, host=, port=, config=)`` starts the listener (:mod:`.server`); :class:`ReamSession`
is the sans-I/O connection (:mod:`.session`), :mod:`.codec` the framing, :mod:`.expr` the expression
language compiled to the engine's predicate tree.
"""

from riverbed.shells.ream_text.server import ReamServer, check_config, serve
from riverbed.shells.ream_text.session import ReamSession
from riverbed.shells.ream_text.shell import ReamShell

__all__ = ["ReamServer", "ReamSession", "ReamShell", "check_config", "serve"]
