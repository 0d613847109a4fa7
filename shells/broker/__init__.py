"""The broker layer every protocol shell stands on (see :mod:`riverbed.shells.broker.core`).

``Broker`` (streams, super streams, publishing, offsets, sessions), ``Tail`` (tailing subscriptions
with credit or byte-window flow control), ``SessionKernel`` (the one shape of a protocol connection:
states, dispatch table, io contract, lifecycle; :mod:`riverbed.shells.broker.session`) and
``TcpListener`` (the TCP adapter of its io contract, and server lifecycle).
"""

from riverbed.shells.broker.core import CONFIGURE, READ, WRITE, Broker  # noqa: F401
from riverbed.shells.broker.listener import SessionProtocol, TcpListener  # noqa: F401
from riverbed.shells.broker.session import Command, SessionKernel, State  # noqa: F401
from riverbed.shells.broker.tail import MODE_CREDIT, MODE_WINDOW, Tail  # noqa: F401
