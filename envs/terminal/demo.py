"""What the shell envs' (terminal, swe) `demonstration` share: callable on an env class (a default-configured env is
built, used and closed) or on an instance, and playing reference commands as ```bash actions."""

from __future__ import annotations

import functools
from typing import Any


class class_or_instance:
    def __init__(self, func):
        self.func = func
        functools.update_wrapper(self, func)

    def __get__(self, obj: Any, cls: type):
        if obj is not None:
            return functools.partial(self.func, obj)

        @functools.wraps(self.func)
        def on_a_fresh_env(*args: Any, **kwargs: Any):
            env = cls()
            try:
                return self.func(env, *args, **kwargs)
            finally:
                env.close()

        return on_a_fresh_env


def play_bash_commands(
    env: Any, obs: dict[str, Any], info: dict[str, Any], commands: list[str]
) -> tuple[list[dict[str, str]], float, bool]:
    """Play `commands` as ```bash actions on `env`, from the (obs, info) its reset returned. Returns the conversation
    (system, first observation, then action / observation pairs), the last reward and whether the episode ended.
    The step limit does not cut them short (`AgentEnv.step_limit_lifted`)."""
    messages = [
        {"role": "system", "content": info["system_prompt"]},
        {"role": obs["role"], "content": obs["content"]},
    ]
    reward, done = 0.0, False
    with env.step_limit_lifted(len(commands)):
        for cmd in commands:
            action = f"```bash\n{cmd}\n```"
            obs, reward, terminated, truncated, _ = env.step(action)
            messages += [{"role": "assistant", "content": action}, {"role": obs["role"], "content": obs["content"]}]
            done = terminated or truncated
            if done:
                break
    return messages, reward, done
