"""The model servers' HTTP client on aiohttp: one session, one connection pool, C-parsed HTTP/1.1.

Our clients send hundreds of small requests a second (a policy turn and a judge vote per env step). Under httpx each
request runs httpcore's pure-Python HTTP/1.1 state machine and pool bookkeeping, about twice aiohttp's CPU per request
(benchmarks/rollout_side.py --baseline measures the rollout side with both). The rest of the client stack speaks
httpx (responses, `raise_for_status`, the exceptions `RetryPolicy` classifies), so this client returns an
`httpx.Response` and raises httpx's exceptions, mapped from aiohttp's by what they mean for a retry:

  could not connect (refused, DNS, TLS)             -> httpx.ConnectError     (failover)
  no connection within the timeout (pool or TCP)    -> httpx.ConnectTimeout   (failover)
  the server closed the connection without a reply  -> httpx.RemoteProtocolError (failover)
  an unparsable response                            -> httpx.RemoteProtocolError
  no answer within the timeout                      -> httpx.ReadTimeout      (retry)
  the connection broke while sending or reading     -> httpx.ReadError        (retry)
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any

import aiohttp
import httpx

from prm.client.timing import add_phases, phases


class AiohttpClient:
    """All requests of one `ClientShards` through one aiohttp session, made lazily in the event loop that uses it.

    `lean` (the default; False: as before issue #33, for benchmarks/rollout_side.py's `--baseline` arms): the
    session carries aiohttp's trace signals only once a caller asks where a request's time goes (timing.py; aiohttp
    runs every signal of every request of a session that has them, a tenth of the request path's CPU), and the
    `httpx.Request` a response and httpx's exceptions carry is made once per method and URL (parsing the URL was
    another tenth)."""

    lean: bool = True

    def __init__(self, timeout_s: float, max_connections: int, headers: dict[str, str], tls: ssl.SSLContext,
                 keepalive_s: float):
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.headers = headers
        self.tls = tls
        self.keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None
        self._traced = False  # whether the session has the trace signals
        self._loop: asyncio.AbstractEventLoop | None = None
        self._requests: dict[tuple[str, str], httpx.Request] = {}
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self._retired: list[aiohttp.ClientSession] = []  # replaced by a traced one, closed with this client

    def _session_here(self, traced: bool = True) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed or (traced and not self._traced):
            # a session without the signals is replaced by one with them at the first traced request, for good (its
            # requests in flight finish on it; it is closed with this client)
            if self._session is not None and not self._session.closed and self._loop is loop:
                self._retired.append(self._session)
            self._session = self._new_session(traced)
            self._traced = traced
            self._loop = loop
        return self._session

    def _new_session(self, traced: bool) -> aiohttp.ClientSession:
        trace_configs = []
        if traced:
            trace = aiohttp.TraceConfig()
            trace.on_connection_create_start.append(_mark("connect_start"))
            trace.on_connection_create_end.append(_mark("connected"))
            trace.on_connection_reuseconn.append(_mark("connected"))
            trace.on_request_headers_sent.append(_mark("sent"))
            trace.on_request_chunk_sent.append(_mark("sent"))
            trace.on_request_end.append(_mark("headers_end"))
            trace_configs.append(trace)
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0, ssl=self.tls,
                                           keepalive_timeout=self.keepalive_s),
            headers=self.headers, trace_configs=trace_configs, auto_decompress=True,
            skip_auto_headers=("User-Agent",))

    def _request_for(self, method: str, url: str) -> httpx.Request:
        """What httpx's exceptions and `response.request` carry (a request of ours has no body or headers to show),
        one per method and URL: the servers' few paths."""
        key = (method, url)
        request = self._requests.get(key)
        if request is None:
            if len(self._requests) >= 256:  # URLs with queries of their own: keep it bounded
                self._requests.clear()
            request = self._requests[key] = httpx.Request(method, url)
        return request

    def _timeout(self, t: float) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(t)
        if timeout is None:
            timeout = self._timeouts[t] = aiohttp.ClientTimeout(total=None, connect=t, sock_connect=t, sock_read=t)
        return timeout

    async def request(self, method: str, url: str, content: bytes | None, headers: dict[str, str],
                      timeout: float | None) -> httpx.Response:
        t = timeout or self.timeout_s
        into = phases.get()
        trace = _Trace() if into is not None else None  # the caller asked where the time goes (timing.py)
        if self.lean:
            session = self._session_here(trace is not None)
            request = self._request_for(method, url)
            client_timeout = self._timeout(t)
        else:
            session = self._session_here()
            request = httpx.Request(method, url)
            client_timeout = aiohttp.ClientTimeout(total=None, connect=t, sock_connect=t, sock_read=t)
        try:
            async with session.request(
                method, url, data=content, headers=headers, trace_request_ctx=trace, timeout=client_timeout,
            ) as r:
                body = await r.read()
                return httpx.Response(r.status, headers=list(r.raw_headers), content=body, request=request)
        except aiohttp.ConnectionTimeoutError as exc:  # before the timeout errors below: it is one of them
            raise httpx.ConnectTimeout(_text(exc, f"no connection to {url} within {t:g} s"), request=request) from exc
        except (aiohttp.ServerTimeoutError, asyncio.TimeoutError) as exc:
            raise httpx.ReadTimeout(_text(exc, f"no answer from {url} within {t:g} s"), request=request) from exc
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError(_text(exc), request=request) from exc
        except aiohttp.ServerDisconnectedError as exc:
            raise httpx.RemoteProtocolError(_text(exc, "server disconnected without sending a response"),
                                            request=request) from exc
        except aiohttp.ClientResponseError as exc:  # a response aiohttp could not parse
            raise httpx.RemoteProtocolError(_text(exc), request=request) from exc
        except aiohttp.ClientError as exc:  # the connection broke while sending or reading (ClientOSError, ...)
            raise httpx.ReadError(_text(exc), request=request) from exc
        finally:
            if trace is not None:
                trace.add_to(into, time.perf_counter())

    async def aclose(self) -> None:
        here = self._loop is asyncio.get_running_loop()
        for session in [*self._retired, self._session]:
            if session is not None and not session.closed and here:
                await session.close()
        self._session, self._retired = None, []


def _text(exc: BaseException, default: str = "") -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else (default or type(exc).__name__)


class _Trace:
    """One request's timestamps, set by aiohttp's trace signals; its phases as prm/client/timing.py names them."""

    __slots__ = ("t0", "connect_start", "connected", "sent", "headers_end")

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.connect_start = self.connected = self.sent = self.headers_end = 0.0

    def add_to(self, into: dict[str, float], end: float) -> None:
        # the request goes out once it has its connection (a new one's, or one reused from the pool)
        add_phases(into, self.t0, self.connect_start, self.connected, self.connected, self.sent, self.headers_end, end)


def _mark(name: str) -> Any:
    async def on(session: Any, ctx: Any, params: Any) -> None:
        trace = ctx.trace_request_ctx
        if trace is not None:
            setattr(trace, name, time.perf_counter())

    return on
