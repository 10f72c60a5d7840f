"""What the shell envs' (terminal, swe) `demonstration` share: playing reference commands as ```bash actions (their
`demonstration` is callable on the class or an instance through envs.base.class_or_instance)."""

from __future__ import annotations

from typing import Any


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
