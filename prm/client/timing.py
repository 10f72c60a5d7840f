"""Where a request's wall time goes, for a caller that asks: the phases of each HTTP request it makes, added up in a
context-local dict.

The caller sets `phases` to a dict around the awaits it wants explained (rollout's runner does, per policy turn and
per judgement, when `RunnerConfig.trace_requests` is on); `ClientShards` then passes httpcore's `trace` extension
with each request and adds its phases to that dict. With `phases` unset (the default) nothing is traced and a request
costs nothing extra.

Phases, in seconds, summed over the requests made while the dict was set:
  pool_wait_s  from the request's start to its connection (a free one from the pool, or a new one's TCP connect)
  connect_s    opening a new connection (0 when an idle one was reused)
  send_s       writing the request's headers and body
  server_s     from the request sent to the response's headers: the server's own time plus the wire, plus any lag of
               this process's event loop in noticing the answer
  read_s       reading the response body and closing it
  requests     how many requests (retries count)
and, from the LLM judge, slot_wait_s: waiting for one of its `max_concurrency` request slots, before any request.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Any

phases: ContextVar[dict[str, float] | None] = ContextVar("nextstate_request_phases", default=None)

PHASES = ("pool_wait_s", "connect_s", "send_s", "server_s", "read_s")


def add(into: dict[str, float], name: str, seconds: float) -> None:
    into[name] = into.get(name, 0.0) + seconds


class RequestTrace:
    """httpcore's trace callback for one request: timestamps of the events that bound its phases."""

    __slots__ = ("t0", "connect_start", "connect_end", "headers_start", "sent", "headers_end")

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.connect_start = self.connect_end = self.headers_start = self.sent = self.headers_end = 0.0

    async def __call__(self, event: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if event == "connection.connect_tcp.started":
            self.connect_start = now
        elif event == "connection.connect_tcp.complete":
            self.connect_end = now
        elif event == "http11.send_request_headers.started":
            self.headers_start = now
        elif event == "http11.receive_response_headers.started":
            self.sent = now
        elif event == "http11.receive_response_headers.complete":
            self.headers_end = now

    def add_to(self, into: dict[str, float], end: float) -> None:
        """The request's phases into `into` (the request ended at `end`); events that did not happen count as 0."""
        first = self.connect_start or self.headers_start or end
        add(into, "pool_wait_s", first - self.t0)
        if self.connect_start and self.connect_end:
            add(into, "connect_s", self.connect_end - self.connect_start)
        if self.headers_start and self.sent:
            add(into, "send_s", self.sent - self.headers_start)
        if self.sent and self.headers_end:
            add(into, "server_s", self.headers_end - self.sent)
        if self.headers_end:
            add(into, "read_s", end - self.headers_end)
        add(into, "requests", 1.0)
