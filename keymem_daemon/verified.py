"""HTTP transports that talk only to a daemon that has proven itself, on every connection.

``daemon.json`` says where the daemon listens, but the port may since have been taken by
another program (the daemon died or stopped) while a shim keeps its old address. So the
shim and the CLI never send a request on a connection that has not passed the check: each
new TCP connection first carries ``GET /health?nonce=...`` -- no token, no content -- and
is used only if the answer holds ``proof.health_proof`` for that nonce under the token,
pid and start time of the ``daemon.json`` the client trusts. Anything else fails the
connection with ``httpcore.ConnectError`` (``httpx.ConnectError`` for the caller): to the
client the daemon is gone, which it knows how to handle (restart, re-read ``daemon.json``).

The check runs inside httpcore's network backend, so it covers every reconnect -- after a
kept-alive connection was closed, on a retry, after a daemon restart -- and the request
that follows goes over the very connection that was checked.

Imported only by clients (``runtime.request_shutdown``, the CLI, the shim): httpcore is
heavy for a daemon that never makes a request.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final

import httpcore
import httpx

from keymem_daemon.proof import new_nonce, proof_matches

if TYPE_CHECKING:
    from keymem_daemon.runtime import DaemonInfo

Expected = Callable[[int], "DaemonInfo | None"]
"""Which daemon a client expects on a port (None: none it trusts)."""

MAX_HEALTH_BYTES: Final = 64 * 1024
"""A ``/health`` answer is a few hundred bytes; more is not keymem."""
READ_CHUNK: Final = 4096
HANDSHAKE_TIMEOUT: Final = 2.0
"""The check's own request, when the caller gave no connect timeout (loopback: milliseconds)."""


class NotTheDaemon(httpcore.ConnectError):
    """Whatever answers on the port did not prove it is the daemon ``daemon.json`` names."""


class _Check:
    """One check of one connection: the request to send, then the answer as it arrives."""

    def __init__(self, info: DaemonInfo) -> None:
        self.info = info
        self.nonce = new_nonce()
        self.request = (
            f"GET /health?nonce={self.nonce} HTTP/1.1\r\nHost: 127.0.0.1:{info.port}\r\n"
            "Accept: application/json\r\nConnection: keep-alive\r\n\r\n"
        ).encode("ascii")
        self.data = b""

    def feed(self, chunk: bytes) -> bool:
        """Add ``chunk``; True once the whole answer is in and proves the daemon (else raises)."""
        if not chunk:
            raise NotTheDaemon("the connection closed before it answered /health")
        self.data += chunk
        if len(self.data) > MAX_HEALTH_BYTES:
            raise NotTheDaemon("it answered /health with more than keymem ever sends")
        head, sep, body = self.data.partition(b"\r\n\r\n")
        if not sep or len(body) < _content_length(head):
            return False
        status = head.split(b"\r\n", 1)[0].split(b" ")
        try:
            parsed = json.loads(body[: _content_length(head)])
        except ValueError:
            parsed = None
        if len(status) < 2 or status[1] != b"200" or not proof_matches(self.info, self.nonce, parsed):
            raise NotTheDaemon(
                f"whatever listens on 127.0.0.1:{self.info.port} is not the keymemd of daemon.json "
                f"(pid {self.info.pid}): its /health does not prove it holds the token"
            )
        return True


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return int(value.strip())
    raise NotTheDaemon("it answered /health without a Content-Length")


def _expected_on(expected: Expected, port: int) -> DaemonInfo:
    info = expected(port)
    if info is None or info.port != port:
        raise NotTheDaemon(f"no keymemd is expected on 127.0.0.1:{port}")
    return info


class _SyncBackend(httpcore.NetworkBackend):
    def __init__(self, expected: Expected) -> None:
        self._expected = expected
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        info = _expected_on(self._expected, port)
        stream = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        check, wait = _Check(info), timeout or HANDSHAKE_TIMEOUT
        try:
            stream.write(check.request, wait)
            while not check.feed(stream.read(READ_CHUNK, wait)):
                pass
        except BaseException:
            stream.close()
            raise
        return stream


class _AsyncBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, expected: Expected) -> None:
        self._expected = expected
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        info = _expected_on(self._expected, port)
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        check, wait = _Check(info), timeout or HANDSHAKE_TIMEOUT
        try:
            await stream.write(check.request, wait)
            while not check.feed(await stream.read(READ_CHUNK, wait)):
                pass
        except BaseException:
            await stream.aclose()
            raise
        return stream

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise NotTheDaemon("keymemd listens on TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


_LIMITS: Final = httpx.Limits()
"""httpx's own pool limits, which its transports would have used."""


def verified_transport(info: DaemonInfo) -> httpx.HTTPTransport:
    """A blocking transport whose every connection must prove it reaches ``info``'s daemon."""
    transport = httpx.HTTPTransport(trust_env=False)
    # httpx takes no network backend: its pool (``_pool``) is rebuilt around ours.
    transport._pool = httpcore.ConnectionPool(
        max_connections=_LIMITS.max_connections,
        max_keepalive_connections=_LIMITS.max_keepalive_connections,
        keepalive_expiry=_LIMITS.keepalive_expiry,
        network_backend=_SyncBackend(lambda port: info),
    )
    return transport


def verified_async_transport(expected: Expected) -> httpx.AsyncHTTPTransport:
    """An async transport whose every connection must prove it reaches ``expected(port)``."""
    transport = httpx.AsyncHTTPTransport(trust_env=False)
    transport._pool = httpcore.AsyncConnectionPool(
        max_connections=_LIMITS.max_connections,
        max_keepalive_connections=_LIMITS.max_keepalive_connections,
        keepalive_expiry=_LIMITS.keepalive_expiry,
        network_backend=_AsyncBackend(expected),
    )
    return transport
