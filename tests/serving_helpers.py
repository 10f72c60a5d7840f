"""Real loopback servers for the serving and judge tests (a tiny real model, or recorded responses)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra (fastapi, uvicorn) is not installed")

from tiny_hf import tiny_backend, tiny_tokenizer  # noqa: E402

from rollout.server_backends import ReplayBackend  # noqa: E402
from rollout.server import FaultConfig, ServerThread, create_app  # noqa: E402


@contextlib.contextmanager
def model_server(seed: int = 0, faults: FaultConfig | None = None) -> Iterator[ServerThread]:
    with ServerThread(create_app(tiny_backend(seed), faults=faults)) as srv:
        yield srv


@contextlib.contextmanager
def replay_server(
    responses: Sequence[str] = (), *, pick: Callable[[str, int], str] | None = None, faults: FaultConfig | None = None
) -> Iterator[ServerThread]:
    """A real HTTP server whose 'model' answers with recorded texts (tokenized by the real tokenizer)."""
    backend = ReplayBackend(tiny_tokenizer(), responses, pick=pick)
    with ServerThread(create_app(backend, faults=faults)) as srv:
        yield srv


def stats(srv: ServerThread) -> dict:
    return dict(srv.app.state.stats)


def backend(srv: ServerThread):
    return srv.app.state.backend
