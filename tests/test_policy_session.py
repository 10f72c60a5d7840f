"""The optional `session` of Policy.generate: passed by the runner to policies that take it, never to older ones."""

import asyncio

from rollout.episodes.runner import EpisodeRequest, RunnerConfig, run_episode
from rollout.farm.core import FarmConfig, make_farm
from rollout.policy.base import Completion, generate
from doubles import ScriptedPolicy


class SessionPolicy(ScriptedPolicy):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.sessions: list[str | None] = []
        self.ended: list[str] = []

    async def generate(self, messages, sampling, session: str | None = None) -> Completion:
        self.sessions.append(session)
        return await super().generate(messages, sampling)

    def end_session(self, session: str) -> None:
        self.ended.append(session)


def test_generate_passes_session_only_to_policies_that_take_it():
    old, new = ScriptedPolicy(["inc"]), SessionPolicy(["inc"])
    msgs = [{"role": "user", "content": "reach 1"}]
    asyncio.run(generate(old, msgs, None, session="ep"))  # no TypeError: the old signature is left alone
    asyncio.run(generate(new, msgs, None, session="ep"))
    asyncio.run(generate(new, msgs, None))
    assert old.calls == 1 and new.sessions == ["ep", None]


def test_runner_keys_every_turn_of_an_episode_by_its_id_and_ends_the_session():
    async def go():
        farm = make_farm("test-count", {"max_steps": 4}, FarmConfig(backend="local", num_envs=2))
        await farm.start()
        try:
            pol = SessionPolicy(["dec", "inc", "inc", "inc"])
            tr = await run_episode(farm, pol, None, EpisodeRequest("ep-9", "g", {"id": "t", "target": 2}),
                                   RunnerConfig(run_id="r"))
            return tr, pol
        finally:
            await farm.close()

    tr, pol = asyncio.run(go())
    assert len(tr.steps) == 4 and pol.sessions == ["ep-9"] * 4 and pol.ended == ["ep-9"]
