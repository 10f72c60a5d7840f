"""Retry policy as data: which failures are retried, which move the request to another server, and how long to wait.

One frozen dataclass says it all, so a config file (or a test) can change the behaviour without touching code; the
request loop in `prm.client.router` is the only place that acts on it.
"""

from __future__ import annotations

import builtins
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

import httpx

from envs.options import check_known


class Verdict(str, Enum):
    RETRY = "retry"  # try again (another server first, if there is one)
    FAILOVER = "failover"  # the server looks down: mark it unhealthy, then retry elsewhere
    FATAL = "fatal"  # give up now (a 4xx, a bad payload ...)


def _default_retry_exceptions() -> tuple[type[BaseException], ...]:
    # TransportError covers timeouts, connection failures and broken responses; bad statuses are handled by code.
    return (httpx.TransportError,)


def _default_failover_exceptions() -> tuple[type[BaseException], ...]:
    # Nothing listens (refused), the connection could not be opened in time, or the server hung up mid-response.
    return (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError)


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4  # total tries per request, the first included
    backoff_s: float = 0.25  # wait before the 2nd try; then multiplied by `backoff_multiplier` per try
    backoff_multiplier: float = 2.0
    backoff_max_s: float = 8.0
    jitter: float = 0.25  # +- this fraction of each wait, so that many clients do not retry in lockstep
    timeout_s: float = 120.0  # per try (connect, read and write each)
    retry_status: frozenset[int] = frozenset({408, 425, 429, 500, 502, 503, 504})
    failover_status: frozenset[int] = frozenset({502, 503})  # the server itself says it cannot serve now
    retry_exceptions: tuple[type[BaseException], ...] = field(default_factory=_default_retry_exceptions)
    failover_exceptions: tuple[type[BaseException], ...] = field(default_factory=_default_failover_exceptions)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"retry.attempts must be >= 1, got {self.attempts}")
        if self.backoff_s < 0 or self.backoff_max_s < 0 or self.timeout_s <= 0:
            raise ValueError("retry.backoff_s / backoff_max_s must be >= 0 and retry.timeout_s > 0")
        object.__setattr__(self, "retry_status", frozenset(self.retry_status))
        object.__setattr__(self, "failover_status", frozenset(self.failover_status))

    def classify(self, error: BaseException) -> Verdict:
        """What to do after `error` (an exception raised by the request, HTTPStatusError for a bad status)."""
        if isinstance(error, httpx.HTTPStatusError):
            code = error.response.status_code
            if code in self.failover_status:
                return Verdict.FAILOVER
            return Verdict.RETRY if code in self.retry_status else Verdict.FATAL
        if isinstance(error, self.failover_exceptions):
            return Verdict.FAILOVER
        if isinstance(error, self.retry_exceptions):
            return Verdict.RETRY
        return Verdict.FATAL

    def delay(self, retry_number: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number `retry_number` (1 = the second try)."""
        base = min(self.backoff_s * self.backoff_multiplier ** max(retry_number - 1, 0), self.backoff_max_s)
        if self.jitter <= 0 or base <= 0:
            return base
        r = (rng or random).uniform(-self.jitter, self.jitter)
        return max(base * (1.0 + r), 0.0)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | RetryPolicy | None) -> RetryPolicy:
        """Build from a config mapping; exception classes may be given by name ("ConnectError", "httpx.ReadTimeout")."""
        if cfg is None:
            return cls()
        if isinstance(cfg, RetryPolicy):
            return cfg
        check_known((f.name for f in fields(cls)), cfg, "retry")
        kwargs: dict[str, Any] = {}
        for key, value in cfg.items():
            if key in ("retry_exceptions", "failover_exceptions"):
                kwargs[key] = tuple(exception_class(v) for v in value)
            elif key in ("retry_status", "failover_status"):
                kwargs[key] = frozenset(int(v) for v in value)
            else:
                kwargs[key] = value
        return cls(**kwargs)


def exception_class(name: str | type[BaseException]) -> type[BaseException]:
    """Resolve "ConnectError" / "httpx.ConnectError" / "TimeoutError" (a builtin) to the class."""
    if isinstance(name, type) and issubclass(name, BaseException):
        return name
    short = str(name).removeprefix("httpx.")
    obj = getattr(httpx, short, None) or getattr(builtins, short, None)
    if not (isinstance(obj, type) and issubclass(obj, BaseException)):
        raise ValueError(
            f"unknown exception class {name!r}: use an httpx exception name (e.g. 'ReadTimeout') or a builtin"
        )
    return obj


class RequestFailed(RuntimeError):
    """A request failed for good (retries used up, a fatal error, no server up); `errors`: (url, error) per try."""

    def __init__(self, what: str, errors: Iterable[tuple[str, str]]):
        self.errors = list(errors)
        lines = "; ".join(f"{url}: {err}" for url, err in self.errors)
        super().__init__(f"{what} failed after {len(self.errors)} tries: {lines or 'no server to try'}")
