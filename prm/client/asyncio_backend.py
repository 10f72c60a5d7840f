"""httpcore's network backend on asyncio's own streams, for the clients of our model servers (`ClientShards`).

httpcore reaches asyncio through anyio by default: every read and write of a request enters and leaves anyio cancel
scopes and checkpoints, and every idle connection is polled with select() before reuse. For a client that sends
hundreds of small requests a second (a policy turn, a judge vote per step) that wrapping is most of the client's CPU
(benchmarks/rollout_side.py measures it). This backend does the same work on `asyncio.open_connection` streams, with
`asyncio.timeout` for the timeouts, and raises httpcore's exceptions (httpx maps them to its own as usual, so
`RetryPolicy` sees the same ConnectError / ReadTimeout / ... as with the default backend).
"""

from __future__ import annotations

import asyncio
import select
import socket
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx


def _readable(sock: Any) -> bool:
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):  # closed under us
        return True


class AsyncioStream(httpcore.AsyncNetworkStream):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader, self._writer = reader, writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc) or "read timed out") from exc
        except OSError as exc:
            raise httpcore.ReadError(f"{type(exc).__name__}: {exc}") from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            async with asyncio.timeout(timeout):
                await self._writer.drain()
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(str(exc) or "write timed out") from exc
        except OSError as exc:
            raise httpcore.WriteError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass  # the peer went first: closed either way

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> AsyncioStream:
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(str(exc) or "TLS handshake timed out") from exc
        except (OSError, ssl.SSLError) as exc:
            raise httpcore.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        return self

    def get_extra_info(self, info: str) -> Any:
        transport = self._writer.transport
        if info == "is_readable":
            # an idle keep-alive connection is "readable" when the server closed it: asyncio saw the EOF already, or
            # it is waiting on the socket (the event loop may not have run since the server went away)
            if self._reader.at_eof() or transport.is_closing():
                return True
            sock = transport.get_extra_info("socket")
            return sock is not None and _readable(sock)
        if info == "ssl_object":
            return transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return transport.get_extra_info("sockname")
        if info == "server_addr":
            return transport.get_extra_info("peername")
        if info == "socket":
            return transport.get_extra_info("socket")
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> AsyncioStream:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, local_addr=(local_address, 0) if local_address else None, limit=1 << 20)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(str(exc) or f"connecting to {host}:{port} timed out") from exc
        except OSError as exc:
            raise httpcore.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        sock = writer.transport.get_extra_info("socket")
        if sock is not None:
            # small requests and answers: without it, a request written in two parts waits for a delayed ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for option in socket_options or ():
                sock.setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> AsyncioStream:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_unix_connection(path, limit=1 << 20)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(str(exc) or f"connecting to {path} timed out") from exc
        except OSError as exc:
            raise httpcore.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class AsyncioTransport(httpx.AsyncHTTPTransport):
    """httpx's HTTP/1.1 transport with its connection pool on `AsyncioBackend` (httpx takes no network backend, so the
    pool it built is replaced by the same pool on ours: the one place that reaches into httpx)."""

    def __init__(self, *, verify: ssl.SSLContext, limits: httpx.Limits):
        super().__init__(verify=verify, limits=limits)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=verify,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=AsyncioBackend(),
        )
