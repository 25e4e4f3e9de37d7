"""A TCP proxy on 127.0.0.1 for the tests of a dropped network (issue 22, Faults).

``TcpProxy(port)`` listens on a free port of its own and forwards every connection to
``127.0.0.1:port``, in a thread. ``freeze()`` stops forwarding in both directions while keeping
every socket open (and accepting new connections, which get nothing): what a daemon sees when
the network between it and its server drops -- no reset, no FIN, its bytes accepted by the
kernel and never answered -- which keepalives and TCP timeouts cannot tell from a slow server
(the proxy's kernel acknowledges and answers them). ``thaw()`` forwards again what waited.
``round_trips`` counts the times a client sent again after its server answered: each is a wait
for the server, whatever the protocol sends in between.
"""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Iterator
from typing import Final

import pytest
from pg_cluster import PgCluster

CHUNK: Final = 65536
TICK: Final = 0.05
"""Seconds the proxy's loop waits for a socket before looking at its flags again."""


class TcpProxy:
    def __init__(self, target_port: int) -> None:
        self._target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._frozen = threading.Event()
        self._stopped = threading.Event()
        self._peers: dict[socket.socket, socket.socket] = {}
        self._answered: dict[socket.socket, bool] = {}  # by client socket: the server spoke last
        self.round_trips = 0
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self._thread.start()

    def url_through(self, url: str, real_port: int) -> str:
        """``url`` with the server's port replaced by the proxy's."""
        return url.replace(f":{real_port}/", f":{self.port}/")

    def freeze(self) -> None:
        self._frozen.set()

    def thaw(self) -> None:
        self._frozen.clear()

    def close(self) -> None:
        self._stopped.set()
        self._thread.join()
        for sock in [self._listener, *self._peers]:
            sock.close()
        self._selector.close()

    def _run(self) -> None:
        while not self._stopped.is_set():
            if self._frozen.is_set():
                self._stopped.wait(TICK)
                continue
            for key, _ in self._selector.select(TICK):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    self._accept()
                elif sock in self._peers:
                    self._forward(sock)

    def _accept(self) -> None:
        client, _ = self._listener.accept()
        try:
            upstream = socket.create_connection(self._target)
        except OSError:
            client.close()
            return
        self._peers[client], self._peers[upstream] = upstream, client
        self._answered[client] = True
        for sock in (client, upstream):
            self._selector.register(sock, selectors.EVENT_READ)

    def _forward(self, sock: socket.socket) -> None:
        other = self._peers[sock]
        try:
            data = sock.recv(CHUNK)
            if data:
                client = sock if sock in self._answered else other
                if sock is client and self._answered[client]:
                    self.round_trips += 1
                self._answered[client] = sock is not client
                other.sendall(data)
                return
        except OSError:
            pass
        for each in (sock, other):
            self._selector.unregister(each)
            del self._peers[each]
            self._answered.pop(each, None)
            each.close()


@pytest.fixture
def pg_proxy(pg_cluster: PgCluster) -> Iterator[TcpProxy]:
    """A proxy to the session's cluster, for one test (closed after)."""
    made = TcpProxy(pg_cluster.port)
    yield made
    made.close()
