"""Real loopback servers for the serving and judge tests (a tiny real model, or recorded responses)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import fastapi  # noqa: F401 (the serve extra, always installed: a broken one fails)
import uvicorn  # noqa: F401 (the serve extra, always installed: a broken one fails)

from tiny_hf import tiny_backend, tiny_tokenizer

from rollout.server.app import FaultConfig, ServerThread, create_app
from rollout.server.backends import ReplayBackend


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
