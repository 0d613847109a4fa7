"""The broker layer every protocol shell stands on (see :mod:`riverbed.shells.broker.core`).

``Broker`` (streams, super streams, publishing, offsets, sessions, record reads), ``Tail`` (tailing
subscriptions of records or chunks with credit or byte-window flow control), ``Subscription`` (what
every protocol's subscription keeps over its Tail; subscription.py), ``RecordBatch`` and the one
timestamp rule (records.py), ``SessionKernel`` (the one shape of a protocol connection: states,
dispatch table, io contract, lifecycle; :mod:`riverbed.shells.broker.session`) and ``TcpListener`` (the
TCP adapter of its io contract, and server lifecycle).
"""

from riverbed.shells.broker.core import CONFIGURE, READ, WRITE, Broker  # noqa: F401
from riverbed.shells.broker.listener import SessionProtocol, TcpListener  # noqa: F401
from riverbed.shells.broker.session import Command, SessionKernel, State  # noqa: F401
from riverbed.shells.broker.tail import MODE_CREDIT, MODE_WINDOW, Tail  # noqa: F401
from riverbed.shells.broker.records import RecordBatch, record_timestamp  # noqa: F401
from riverbed.shells.broker.subscription import Subscription  # noqa: F401
