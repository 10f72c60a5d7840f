"""loop.gc_threshold: the collector is paced while episodes run and restored after (rollout/episodes/gc_pacing.py)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from rollout.episodes.gc_pacing import paced_gc
from rollout.loop import LoopConfig


@pytest.fixture(autouse=True)
def python_thresholds():
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_raised_inside_and_restored_after():
    with paced_gc(50_000):
        assert gc.get_threshold() == (50_000, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)


def test_zero_leaves_the_collector_alone():
    with paced_gc(0):
        assert gc.get_threshold() == (700, 10, 10)


def test_never_lowers_a_higher_setting():
    gc.set_threshold(100_000, 10, 10)
    with paced_gc(50_000):
        assert gc.get_threshold() == (100_000, 10, 10)
    assert gc.get_threshold() == (100_000, 10, 10)


def test_overlapping_episodes_restore_only_when_the_last_one_ends():
    async def episode(started: asyncio.Event, release: asyncio.Event) -> None:
        with paced_gc(50_000):
            started.set()
            await release.wait()

    async def main() -> list[tuple[int, int, int]]:
        seen = []
        releases = [asyncio.Event() for _ in range(3)]
        starts = [asyncio.Event() for _ in range(3)]
        tasks = [asyncio.create_task(episode(s, r)) for s, r in zip(starts, releases)]
        await asyncio.gather(*(s.wait() for s in starts))
        for r, t in zip(releases, tasks):
            seen.append(gc.get_threshold())
            r.set()
            await t
        seen.append(gc.get_threshold())
        return seen

    assert asyncio.run(main()) == [(50_000, 10, 10)] * 3 + [(700, 10, 10)]


def test_restored_when_an_episode_raises():
    with pytest.raises(RuntimeError):
        with paced_gc(50_000):
            raise RuntimeError("env died")
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "50000"])
def test_loop_config_refuses_a_bad_threshold(bad):
    with pytest.raises(ValueError, match="loop.gc_threshold"):
        LoopConfig(gc_threshold=bad)
