"""The broker layer every protocol shell stands on (see :mod:`riverbed.shells.broker.core`).

``Broker`` (streams, super streams, publishing, offsets, sessions), ``Tail`` (tailing subscriptions
with credit or byte-window flow control) and ``TcpListener`` (transport glue and server lifecycle).
"""

from riverbed.shells.broker.core import CONFIGURE, READ, WRITE, Broker  # noqa: F401
from riverbed.shells.broker.listener import SessionProtocol, TcpListener  # noqa: F401
from riverbed.shells.broker.tail import MODE_CREDIT, MODE_WINDOW, Tail  # noqa: F401
