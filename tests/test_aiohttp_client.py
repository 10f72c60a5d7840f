"""The aiohttp client raises httpx's exceptions by what each failure means for a retry (prm/client/aiohttp_client.py),
on real loopback sockets: nothing listening, a server that hangs up, a server that never answers."""

from __future__ import annotations

import asyncio
import socket
import threading

import httpx
import pytest

from prm.client.aiohttp_client import AiohttpClient
from prm.client.retry import RetryPolicy, Verdict
from prm.client.timing import phases


def _client(timeout_s: float = 5.0) -> AiohttpClient:
    import ssl

    return AiohttpClient(timeout_s, 8, {}, ssl.create_default_context(), keepalive_s=2.0)


class RawServer:
    """A loopback TCP server whose every connection is handled by `handle(conn)` on a thread."""

    def __init__(self, handle):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.handle = handle
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _request(client: AiohttpClient, url: str, timeout: float | None = None) -> httpx.Response:
    async def go():
        try:
            return await client.request("POST", url, b"{}", {"content-type": "application/json"}, timeout)
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_nothing_listening_is_a_connect_error_and_fails_over():
    with pytest.raises(httpx.ConnectError) as err:
        _request(_client(), f"http://127.0.0.1:{_free_port()}/x")
    assert RetryPolicy().classify(err.value) is Verdict.FAILOVER
    assert err.value.request.url.port is not None  # httpx's exceptions carry the request


def _hang_up(conn: socket.socket) -> None:
    conn.recv(65536)
    conn.close()


def _garble(conn: socket.socket) -> None:
    conn.recv(65536)
    conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    conn.close()


@pytest.mark.parametrize("handle", [_hang_up, _garble], ids=["hangs up without a reply", "garbled response"])
def test_a_server_that_breaks_the_protocol_is_a_protocol_error(handle):
    srv = RawServer(handle)
    try:
        with pytest.raises(httpx.RemoteProtocolError):
            _request(_client(), f"http://127.0.0.1:{srv.port}/x")
    finally:
        srv.close()


def test_a_server_that_never_answers_is_a_read_timeout_and_is_retried():
    stop = threading.Event()

    def silent(conn: socket.socket) -> None:
        conn.recv(65536)
        stop.wait(10)

    srv = RawServer(silent)
    try:
        with pytest.raises(httpx.ReadTimeout) as err:
            _request(_client(), f"http://127.0.0.1:{srv.port}/x", timeout=0.3)
        assert RetryPolicy().classify(err.value) is Verdict.RETRY
    finally:
        stop.set()
        srv.close()


def test_a_reply_comes_back_as_an_httpx_response_with_its_phases_when_asked():
    def reply(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: 4\r\n\r\nbusy")

    srv = RawServer(reply)
    into: dict[str, float] = {}

    async def go():
        client = _client()
        token = phases.set(into)
        try:
            return await client.request("GET", f"http://127.0.0.1:{srv.port}/x", None, {}, None)
        finally:
            phases.reset(token)
            await client.aclose()

    try:
        r = asyncio.run(go())
    finally:
        srv.close()
    assert r.status_code == 503 and r.text == "busy" and r.headers["content-type"] == "text/plain"
    with pytest.raises(httpx.HTTPStatusError):
        r.raise_for_status()
    assert into["requests"] == 1 and into["connect_s"] > 0 and into["server_s"] > 0
    assert set(into) >= {"pool_wait_s", "send_s", "read_s"}


def test_the_session_gets_trace_signals_only_once_a_request_is_traced():
    def reply(conn: socket.socket) -> None:
        while conn.recv(65536):  # keep-alive: one answer per request on the same connection
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    srv = RawServer(reply)
    into: dict[str, float] = {}

    async def go():
        client = _client()
        url = f"http://127.0.0.1:{srv.port}/x"
        try:
            plain = await client.request("GET", url, None, {}, None)
            untraced = client._session
            assert not untraced.trace_configs  # no signals sent for a request nobody traces
            token = phases.set(into)
            try:
                traced = await client.request("GET", url, None, {}, None)
            finally:
                phases.reset(token)
            assert client._session is not untraced and client._session.trace_configs
            again = await client.request("GET", url, None, {}, None)
            assert client._session.trace_configs  # it stays on the traced session
            assert plain.request is traced.request is again.request  # one httpx.Request per method and URL
            return untraced, client
        finally:
            await client.aclose()

    try:
        untraced, client = asyncio.run(go())
    finally:
        srv.close()
    assert untraced.closed and client._session is None  # the replaced session was closed with the client
    assert into["requests"] == 1 and into["server_s"] > 0
