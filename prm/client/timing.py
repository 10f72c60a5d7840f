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
        """The request's phases into `into` (the request ended at `end`)."""
        add_phases(into, self.t0, self.connect_start, self.connect_end, self.headers_start, self.sent, self.headers_end,
                   end)


def add_phases(into: dict[str, float], t0: float, connect_start: float, connect_end: float, send_start: float,
               sent: float, headers_end: float, end: float) -> None:
    """One request's phases from its timestamps (0: the event did not happen, e.g. no new connection) into `into`."""
    add(into, "pool_wait_s", (connect_start or send_start or end) - t0)
    if connect_start and connect_end:
        add(into, "connect_s", connect_end - connect_start)
    if send_start and sent:
        add(into, "send_s", sent - send_start)
    if sent and headers_end:
        add(into, "server_s", headers_end - sent)
    if headers_end:
        add(into, "read_s", end - headers_end)
    add(into, "requests", 1.0)
