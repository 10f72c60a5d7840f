"""ServerPool: several inference servers behind one async HTTP client, with session-sticky routing and failover.

- A request with a `session` key (an episode id) goes to the server that served that session before, so the server's
  prefix cache holds the conversation; new sessions go to the least-busy healthy server.
- Failures are handled as `RetryPolicy` says: retried with backoff (another server first, when there is one), or the
  server is marked down and the request fails over; a down server is tried again after `recheck_s` (or by
  `check_health()`), and sessions on it move to a healthy one.
- A server that missed a weight update is `stale` and gets no traffic until an update reaches it.
"""

from __future__ import annotations

import asyncio
import itertools
import json as jsonlib
import logging
import os
import random
import re
import ssl
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from prm.client.aiohttp_client import AiohttpClient
from prm.client.asyncio_backend import AsyncioTransport
from prm.client.retry import RequestFailed, RetryPolicy, Verdict
from prm.client.timing import RequestTrace, phases

log = logging.getLogger(__name__)


@dataclass
class ServerState:
    url: str  # base URL; request paths are appended to it
    healthy: bool = True
    down_since: float = 0.0  # time.monotonic() when it was marked down
    stale: bool = False  # missed a weight update: no traffic until one reaches it
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    sessions: int = 0  # sessions currently routed here
    last_error: str = ""


def describe(error: BaseException) -> str:
    if isinstance(error, httpx.HTTPStatusError):
        body = error.response.text[:200].replace("\n", " ")
        return f"HTTP {error.response.status_code}: {body}"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def origin(url: str) -> str:
    u = httpx.URL(url)
    return f"{u.scheme}://{u.netloc.decode('ascii')}"


def join_url(base: str, path: str) -> str:
    return base.rstrip("/") + "/" + path.lstrip("/")


KEEPALIVE_S = 2.0


class ClientShards:
    """The HTTP client of one ServerPool: by default one aiohttp session (`backend = "aiohttp"`,
    prm/client/aiohttp_client.py: half the CPU per request of httpx's); with `backend = "httpx"` (and whenever a proxy
    is set in the environment: httpx routes by it) several small httpx clients instead of one big one.

    httpcore's connection pool rescans every connection (and polls idle sockets) each time a request starts or ends, a
    cost that grows with the square of the pool size: one client with 64+ connections spends milliseconds of CPU per
    request. Pools of `per_client` connections keep that cost small. A shard is added (up to `max_connections` in all)
    only when every shard is full; a request goes to the least busy shard. The shards share one TLS context.
    """

    #: "aiohttp" or "httpx" (the clients before aiohttp: benchmarks/rollout_side.py's `--baseline` arms)
    backend: str = "aiohttp"
    #: with backend "httpx": the transport of each client; None: httpx's own (anyio under httpcore)
    transport: type | None = AsyncioTransport
    #: False: the request path as it was before issue #33 (benchmarks/rollout_side.py's `--baseline` arms): the
    #: environment's proxy variables read on every request, request bodies written by the json module
    lean: bool = True

    def __init__(self, timeout_s: float, max_connections: int, headers: dict[str, str], per_client: int = 8):
        self.timeout_s = timeout_s
        self.headers = headers
        self.per_client = max(1, min(per_client, max_connections))
        self.max_clients = max(1, -(-max_connections // self.per_client))
        self._tls: ssl.SSLContext | None = None
        self._clients: list[httpx.AsyncClient] = []
        self._transports: list[httpx.AsyncBaseTransport | None] = []  # each client's, when it has our own
        self._busy: list[int] = []
        self.max_connections = max_connections
        self._aio: AiohttpClient | None = None
        self._proxies: bool | None = None  # a proxy in the environment, as read at the first request

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context(cafile=_ca_file())
        return self._tls

    def _new_client(self) -> None:
        self._tls_context()
        size = self.per_client
        # idle connections are dropped well before the servers' own keep-alive timeout (uvicorn's, SGLang's: 5 s), so a
        # request never goes out on a connection the server is closing at that moment (a broken pipe)
        limits = httpx.Limits(max_connections=size, max_keepalive_connections=size, keepalive_expiry=KEEPALIVE_S)
        # asyncio's streams under httpcore instead of anyio's: ~20% less client CPU per request
        # (prm/client/asyncio_backend.py)
        transport = self.transport(verify=self._tls, limits=limits) if self.transport else None
        self._clients.append(
            httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s),
                verify=self._tls,
                headers=self.headers,
                limits=limits,
                transport=transport,
            )
        )
        self._transports.append(transport)
        self._busy.append(0)

    async def request(self, method: str, url: str, *, json: Any = None, timeout: float | None = None) -> httpx.Response:
        if self.lean:
            # read once, as httpx's own client reads them once when it is made: six environment lookups per request
            # were a tenth of the request path's CPU
            proxies = self._proxies if self._proxies is not None else self._read_proxies()
        else:
            proxies = _env_proxies()
        if self.backend == "aiohttp" and not proxies:
            if self._aio is None:
                # idle connections dropped before the servers' own keep-alive timeout, as below
                self._aio = AiohttpClient(self.timeout_s, self.max_connections, self.headers, self._tls_context(),
                                          KEEPALIVE_S)
            headers, content = _body(json, self.lean)
            return await self._aio.request(method, url, content, headers, timeout)
        if not self._clients or (min(self._busy) >= self.per_client and len(self._clients) < self.max_clients):
            self._new_client()
        i = min(range(len(self._clients)), key=self._busy.__getitem__)
        self._busy[i] += 1
        try:
            transport = self._transports[i]
            if transport is not None and not proxies:
                return await self._send(transport, method, url, json, timeout)
            return await self._clients[i].request(method, url, json=json, **({"timeout": timeout} if timeout else {}))
        finally:
            self._busy[i] -= 1

    async def _send(self, transport: httpx.AsyncBaseTransport, method: str, url: str, payload: Any,
                    timeout: float | None) -> httpx.Response:
        """The request straight to the client's transport: what `client.request` does for our requests (the client's
        headers, a JSON body, the timeout, the body read), without its per-request layers (auth and redirect flows,
        cookies, event hooks, URL merging), a quarter of a request's CPU. httpx's exceptions as usual: the transport
        maps httpcore's."""
        t = timeout or self.timeout_s
        extra, content = _body(payload, self.lean)
        headers = {**self.headers, **extra}
        extensions: dict[str, Any] = {"timeout": {"connect": t, "read": t, "write": t, "pool": t}}
        into = phases.get()
        trace = None
        if into is not None:  # the caller asked where this request's time goes (prm/client/timing.py)
            trace = extensions["trace"] = RequestTrace()
        request = httpx.Request(method, url, headers=headers, content=content, extensions=extensions)
        try:
            response = await transport.handle_async_request(request)
            try:
                await response.aread()
            finally:
                await response.aclose()
        finally:
            if trace is not None:
                trace.add_to(into, time.perf_counter())
        response.request = request
        return response

    def _read_proxies(self) -> bool:
        self._proxies = _env_proxies()
        return self._proxies

    async def aclose(self) -> None:
        if self._aio is not None:
            await self._aio.aclose()
            self._aio = None
        for c in self._clients:
            await c.aclose()  # closes its transport too
        self._clients, self._transports, self._busy = [], [], []


def _body(payload: Any, fast: bool = True) -> tuple[dict[str, str], bytes | None]:
    """A request's JSON body and its content-type header (none without a payload).

    `fast`: written by orjson, a tenth of the json module's time on a policy turn's thousands of token ids. Whatever
    orjson would write otherwise than the json module (a NaN or an infinity: orjson writes null; keys that are not
    strings, subclasses of plain types, dataclasses, dates, integers of more than 64 bits) goes to the json module,
    which writes it or raises as before: a body holding `null` is written again by it, orjson's errors fall back."""
    if payload is None:
        return {}, None
    if fast:
        try:
            content = orjson.dumps(payload, option=_ORJSON_PLAIN, default=_refuse)
        except orjson.JSONEncodeError:
            content = None
        if content is not None and b"null" not in content:
            return {"content-type": "application/json"}, content
    content = jsonlib.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    return {"content-type": "application/json"}, content


# only the types the json module writes the same way go through orjson; the rest reach `_refuse`
_ORJSON_PLAIN = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS


def _refuse(value: Any) -> Any:
    raise TypeError(type(value).__name__)  # orjson raises JSONEncodeError: the json module takes the payload


def loads(content: bytes) -> Any:
    """A JSON body: by orjson (strict RFC 8259), else by the json module, which also reads what orjson refuses (NaN
    and Infinity literals, a BOM, lone surrogates) or reads otherwise (an integer past 64 bits, which orjson makes a
    float: any run of 20 digits goes to the json module): the same values as before, faster."""
    if _LONG_NUMBER.search(content) is None:
        try:
            return orjson.loads(content)
        except orjson.JSONDecodeError:
            pass
    return jsonlib.loads(content)


_LONG_NUMBER = re.compile(rb"\d{20}")


def _env_proxies() -> bool:
    """A proxy set in the environment (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY): requests then go through httpx's client,
    which routes them by it."""
    return any(os.environ.get(k) for k in PROXY_VARIABLES)


PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def _ca_file() -> str | None:
    try:
        import certifi  # what httpx itself uses

        return certifi.where()
    except ImportError:
        return None


class ServerPool:
    def __init__(
        self,
        urls: Sequence[str],
        *,
        retry: RetryPolicy | None = None,
        health_path: str = "health",
        recheck_s: float = 5.0,
        max_sessions: int = 4096,
        max_connections: int = 1024,
        headers: Mapping[str, str] | None = None,
        name: str = "server",
    ):
        if isinstance(urls, str):
            urls = [urls]
        clean = [str(u).rstrip("/") for u in urls if u]
        if not clean:
            raise ValueError(f"{name}: no server URL given (set urls: [http://host:port, ...])")
        for u in clean:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"{name}: server URL {u!r} must start with http:// or https://")
        self.name = name
        self.retry = retry or RetryPolicy()
        self.health_path = health_path
        self.recheck_s = recheck_s
        self.max_sessions = max_sessions
        self.servers = [ServerState(u) for u in dict.fromkeys(clean)]
        self._sessions: OrderedDict[str, ServerState] = OrderedDict()
        self._turn = itertools.count()
        self._rng = random.Random()
        self._clients = ClientShards(self.retry.timeout_s, max_connections, dict(headers or {}))

    # ----- routing -----
    def _usable(self, s: ServerState, now: float) -> bool:
        return not s.stale and (s.healthy or now - s.down_since >= self.recheck_s)

    def pick(self, session: str | None = None, exclude: frozenset[str] | set[str] = frozenset()) -> ServerState | None:
        """The server for the next try: the session's own if usable, else the least busy usable one (ties rotate)."""
        now = time.monotonic()
        usable = [s for s in self.servers if self._usable(s, now)]
        if not usable:
            # everything is down: probe the one that went down longest ago rather than fail without trying
            fresh = [s for s in self.servers if not s.stale]
            usable = [min(fresh, key=lambda s: s.down_since)] if fresh else []
        candidates = [s for s in usable if s.url not in exclude]
        own = self._sessions.get(session) if session is not None else None
        if own is not None and own in candidates:
            self._sessions.move_to_end(session)
            return own
        if not candidates:
            return None
        k = next(self._turn) % len(candidates)
        rotated = candidates[k:] + candidates[:k]
        best = min(rotated, key=lambda s: (s.in_flight, s.sessions if session is not None else 0))
        # a session moves only when its server is unusable; a retry that merely avoids it keeps the mapping
        if session is not None and (own is None or not self._usable(own, now)):
            self._assign(session, best)
        return best

    def _assign(self, session: str, server: ServerState) -> None:
        old = self._sessions.pop(session, None)
        if old is not None:
            old.sessions -= 1
        self._sessions[session] = server
        server.sessions += 1
        while len(self._sessions) > self.max_sessions:
            _, evicted = self._sessions.popitem(last=False)
            evicted.sessions -= 1

    def end_session(self, session: str) -> None:
        server = self._sessions.pop(session, None)
        if server is not None:
            server.sessions -= 1

    def session_server(self, session: str) -> str | None:
        s = self._sessions.get(session)
        return s.url if s is not None else None

    def mark_down(self, server: ServerState, reason: str) -> None:
        if server.healthy:
            log.warning("%s %s marked down: %s", self.name, server.url, reason)
        server.healthy = False
        server.down_since = time.monotonic()
        server.last_error = reason

    def mark_up(self, server: ServerState) -> None:
        if not server.healthy:
            log.info("%s %s is back up", self.name, server.url)
        server.healthy = True

    # ----- requests -----
    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        session: str | None = None,
        what: str | None = None,
    ) -> httpx.Response:
        """Send with retries and failover; a 2xx response or RequestFailed (never a raw httpx error)."""
        what = what or f"{method} {path}"
        errors: list[tuple[str, str]] = []
        tried: set[str] = set()
        for attempt in range(self.retry.attempts):
            if attempt:
                await asyncio.sleep(self.retry.delay(attempt, self._rng))
            server = self.pick(session, tried) or self.pick(session)
            if server is None:
                errors.append(("-", f"no {self.name} available (all stale)"))
                break
            server.in_flight += 1
            server.requests += 1
            try:
                resp = await self._clients.request(method, join_url(server.url, path), json=json)
                resp.raise_for_status()
            except (httpx.HTTPError, OSError) as exc:
                text = describe(exc)
                errors.append((server.url, text))
                server.failures += 1
                verdict = self.retry.classify(exc)
                log.debug("%s on %s failed (try %d, %s): %s", what, server.url, attempt + 1, verdict.value, text)
                if verdict is Verdict.FATAL:
                    raise RequestFailed(what, errors) from exc
                if verdict is Verdict.FAILOVER:
                    self.mark_down(server, text)
                tried.add(server.url)
                continue
            finally:
                server.in_flight -= 1
            self.mark_up(server)
            return resp
        raise RequestFailed(what, errors)

    async def post_json(self, path: str, payload: Any, *, session: str | None = None, what: str | None = None) -> Any:
        return (await self.post_json_served(path, payload, session=session, what=what))[0]

    async def post_json_served(self, path: str, payload: Any, *, session: str | None = None,
                               what: str | None = None) -> tuple[Any, str]:
        """`post_json`, and the base URL of the server that answered (a policy stamps the answer with the weight
        version that server serves)."""
        resp = await self.request("POST", path, json=payload, session=session, what=what)
        try:
            # JSON is UTF-8 (RFC 8259): no charset lookup in the headers
            data = loads(resp.content) if self._clients.lean else jsonlib.loads(resp.content)
        except ValueError as exc:
            raise RequestFailed(
                what or f"POST {path}", [(str(resp.request.url), f"invalid JSON: {resp.text[:200]!r}")]
            ) from exc
        url = str(resp.request.url)
        return data, next((s.url for s in self.servers if url.startswith(s.url + "/")), url)

    async def call(self, url: str, method: str, path: str, *, json: Any = None, timeout: float | None = None,
                   what: str | None = None) -> Any:
        """One request to the server `url` (one of this pool's), no retry, no routing: the steps of an operation
        that must reach every server in order (a weight sync). The parsed JSON answer (None for an empty body), or
        RequestFailed naming the server and the HTTP error."""
        target = join_url(url, path)
        try:
            resp = await self._clients.request(method, target, json=json, timeout=timeout)
            resp.raise_for_status()
        except (httpx.HTTPError, OSError) as exc:
            raise RequestFailed(what or f"{method} {path}", [(url, describe(exc))]) from exc
        return loads(resp.content) if resp.content else None

    async def broadcast(self, path: str, payload: Any, *, root: bool = False) -> dict[str, Any]:
        """POST to every server (stale and down ones included), once each; url -> parsed JSON or the exception.

        `root`: the path is relative to the server's origin (scheme://host:port), not its base URL (e.g. .../v1).
        """

        async def one(server: ServerState) -> Any:
            base = origin(server.url) if root else server.url
            try:
                resp = await self._clients.request("POST", join_url(base, path), json=payload)
                resp.raise_for_status()
                return resp.json()
            except Exception as exc:  # reported per server to the caller, who decides
                return exc

        results = await asyncio.gather(*(one(s) for s in self.servers))
        return {s.url: r for s, r in zip(self.servers, results)}

    def set_stale(self, url: str, stale: bool) -> None:
        for s in self.servers:
            if s.url == url:
                s.stale = stale

    async def check_health(self, timeout_s: float = 5.0) -> dict[str, bool]:
        """GET the health path of every server now; marks each up or down. url -> healthy."""

        async def probe(server: ServerState) -> bool:
            try:
                resp = await self._clients.request("GET", join_url(server.url, self.health_path), timeout=timeout_s)
                resp.raise_for_status()
            except Exception as exc:
                self.mark_down(server, describe(exc))
                return False
            self.mark_up(server)
            return True

        results = await asyncio.gather(*(probe(s) for s in self.servers))
        return {s.url: ok for s, ok in zip(self.servers, results)}

    def stats(self) -> list[dict[str, Any]]:
        return [
            {
                "url": s.url,
                "healthy": s.healthy,
                "stale": s.stale,
                "in_flight": s.in_flight,
                "requests": s.requests,
                "failures": s.failures,
                "sessions": s.sessions,
            }
            for s in self.servers
        ]

    async def aclose(self) -> None:
        await self._clients.aclose()
