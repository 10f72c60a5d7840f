import random

import httpx
import pytest

from prm.client.retry import RetryPolicy, Verdict, exception_class


def _status_error(code: int) -> httpx.HTTPStatusError:
    req = httpx.Request("POST", "http://x/generate")
    return httpx.HTTPStatusError("bad", request=req, response=httpx.Response(code, request=req))


def test_classify_by_status_and_exception():
    p = RetryPolicy()
    assert p.classify(_status_error(500)) is Verdict.RETRY
    assert p.classify(_status_error(503)) is Verdict.FAILOVER
    assert p.classify(_status_error(400)) is Verdict.FATAL
    assert p.classify(httpx.ConnectError("refused")) is Verdict.FAILOVER
    assert p.classify(httpx.ReadTimeout("slow")) is Verdict.RETRY
    assert p.classify(ValueError("not http")) is Verdict.FATAL


def test_backoff_grows_and_is_capped():
    p = RetryPolicy(backoff_s=0.5, backoff_multiplier=2.0, backoff_max_s=3.0, jitter=0.0)
    assert [p.delay(i) for i in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    jittered = RetryPolicy(backoff_s=1.0, jitter=0.25)
    rng = random.Random(0)
    assert all(0.75 <= jittered.delay(1, rng) <= 1.25 for _ in range(100))


def test_from_config_resolves_exception_names_and_rejects_unknown_keys():
    p = RetryPolicy.from_config(
        {
            "attempts": 2,
            "retry_status": [500],
            "retry_exceptions": ["ReadTimeout", "httpx.ConnectError"],
            "failover_exceptions": ["TimeoutError"],
        }
    )
    assert p.attempts == 2 and p.retry_status == frozenset({500})
    assert p.retry_exceptions == (httpx.ReadTimeout, httpx.ConnectError)
    assert p.classify(TimeoutError()) is Verdict.FAILOVER
    with pytest.raises(ValueError, match="unknown retry option"):
        RetryPolicy.from_config({"atempts": 3})
    with pytest.raises(ValueError, match="unknown exception class"):
        exception_class("NoSuchError")
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)
