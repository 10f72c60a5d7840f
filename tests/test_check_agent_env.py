"""envs.check_agent_env: passes the real envs, and names what is wrong with a broken one."""

from __future__ import annotations

import pytest

import envs
from envs.base import PARSE_ERROR, AgentEnv, Transition
from fixture_envs import CountEnv


class Letters(AgentEnv):
    """Send "a" then "b"; anything else is a parse error. The demonstration's recorded observations are `seen`."""

    seen = ("got a", "got b")

    @classmethod
    def tasks(cls, split="train"):
        return [{"id": f"{split}-0"}]

    def begin(self, task):
        return Transition("send a, then b", role="user")

    def act(self, action):
        if action not in ("a", "b"):
            return Transition("say a or b", signals={PARSE_ERROR: True})
        return Transition(f"got {action}", outcome=1.0 if action == "b" else None)

    def verify(self):
        return 0.0

    @classmethod
    def demonstration(cls, task):
        return [{"role": "user", "content": "send a, then b"}, {"role": "assistant", "content": "a"},
                {"role": "tool", "content": cls.seen[0]}, {"role": "assistant", "content": "b"}]


def test_the_bundled_and_fixture_envs_pass():
    envs.check_agent_env(Letters())
    envs.check_agent_env(CountEnv())
    envs.check_agent_env(envs.make("toolcall"))


def test_a_malformed_action_that_raises_is_reported():
    class Raises(Letters):
        def act(self, action):
            if action not in ("a", "b"):
                raise ValueError("bad action")
            return super().act(action)

    with pytest.raises(envs.EnvCheckError, match="raised ValueError: bad action; a malformed action must be"):
        envs.check_agent_env(Raises())


def test_a_demonstration_whose_replay_differs_is_reported():
    class Drifting(Letters):
        seen = ("got A", "got b")

    with pytest.raises(envs.EnvCheckError, match="demonstration turn 1: the replay observed 'got a'"):
        envs.check_agent_env(Drifting())
    envs.check_agent_env(Drifting(), compare_observations=False)


def test_a_demonstration_that_does_not_succeed_is_reported():
    class Fails(Letters):
        def act(self, action):
            tr = super().act(action)
            if tr.outcome is not None:
                tr.outcome = -1.0
            return tr

    with pytest.raises(envs.EnvCheckError, match="ended with outcome -1.0, not a success"):
        envs.check_agent_env(Fails())


def test_empty_task_sets_are_reported():
    class NoEval(Letters):
        @classmethod
        def tasks(cls, split="train"):
            return [{"id": "t"}] if split == "train" else []

    with pytest.raises(envs.EnvCheckError, match=r"tasks\('eval'\) is empty"):
        envs.check_agent_env(NoEval())
