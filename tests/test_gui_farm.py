"""GUI episodes through the farm and the runner (local threads and Ray workers): demonstrations replayed by a scripted
policy reach outcome 1, and the judge gets the screenshots before and after every action with the env's signals."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from envs.gui.env import GUIEnv
from prm.judge import RuleJudge
from rollout.episodes.runner import EpisodeRequest, RunnerConfig, run_episode
from rollout.farm.core import FarmConfig, make_farm
from tests.gui_support import require_desktop_tools
from tests.doubles import ScriptedPolicy
from train.records import EpisodeStatus

pytestmark = pytest.mark.integration

TASKS = ["ns-form-name-alice", "ns-settings-dark-mode"]


class RecordingJudge(RuleJudge):
    def __init__(self):
        super().__init__()
        self.contexts = []

    async def score(self, ctx):
        self.contexts.append(ctx)
        return self.score_now(ctx)


@pytest.fixture
def ray_address(request):
    """Local farms need nothing; Ray farms get a private one-node cluster (never another user's Ray on this machine)."""
    if request.param == "local":
        yield None
        return
    import ray
    from ray.cluster_utils import Cluster

    from rollout.farm.core import init_ray

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.wait_for_nodes()
    init_ray(cluster.address)
    yield cluster.address
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.parametrize("ray_address", ["local", "ray"], indirect=True)
def test_gui_episodes_through_the_farm(ray_address, tmp_path, monkeypatch):
    require_desktop_tools()
    backend = "local" if ray_address is None else "ray"
    monkeypatch.setenv("NEXTSTATE_CACHE", str(tmp_path))
    tasks = {t["id"]: t for t in GUIEnv.tasks("train") if t["id"] in TASKS}
    demos = {tid: GUIEnv.demonstration(t) for tid, t in tasks.items()}
    # the runner's first user message is the reset observation, exactly as recorded in the demonstration
    script = {d[1]["content"]: [m["content"] for m in d if m["role"] == "assistant"] for d in demos.values()}
    policy, judge = ScriptedPolicy(script, default="DONE"), RecordingJudge()

    async def main():
        farm = make_farm("gui", {}, FarmConfig(backend=backend, num_envs=2, envs_per_worker=2, ray_address=ray_address))
        await farm.start()
        try:
            reqs = [EpisodeRequest(f"e{i}", f"g{i}", tasks[tid]) for i, tid in enumerate(TASKS)]
            cfg = RunnerConfig(run_id="gui-farm")
            return await asyncio.gather(*(run_episode(farm, policy, judge, r, cfg) for r in reqs))
        finally:
            await farm.close()

    trajs = asyncio.run(main())
    for tr in trajs:
        assert tr.status == EpisodeStatus.OK, tr.reason
        assert tr.outcome == 1.0
        assert tr.steps[-1].action == "DONE"
        assert any(s.signals.get("progress") for s in tr.steps)
    assert len(judge.contexts) == sum(len(t.steps) for t in trajs)
    for ctx in judge.contexts:
        assert ctx.family == "gui"
        assert isinstance(ctx.image_before, np.ndarray) and isinstance(ctx.image_after, np.ndarray)
        assert ctx.image_before.shape == ctx.image_after.shape == (800, 1280, 3)
    clicks = [c for c in judge.contexts if c.action.startswith("pyautogui.click")]
    assert any(not np.array_equal(c.image_before, c.image_after) for c in clicks)
