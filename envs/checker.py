"""`envs.check_agent_env(env)`: check an env the way the launcher, the farm and the judge use it (for plugin authors).

Beyond gymnasium's `check_env` (spaces, reset / step types, seeding), it checks the NextState contract
(docs/architecture.md, "Contracts"):
- `tasks("train")` and `tasks("eval")` are non-empty lists of dicts with an `id`, and `reset(options={"task": t})` plays t;
- the first observation and every next one are `{"role", "content"}` messages; `info` carries `next_state`,
  `signals` (a dict) and `outcome` (None before the end);
- a malformed action is not an exception but a step with `signals["parse_error"] = True`;
- the episode ends (terminated or truncated by the step limit) with a float `info["outcome"]` equal to the reward,
  and a reward of 0.0 on every step before;
- when the env has a `demonstration(task)`, its assistant turns replayed as actions (inside the env's
  `replaying_demonstration()`) are parsed, give the demonstration's own observations, and end the episode with an
  outcome > 0.
Raises EnvCheckError naming the first thing that is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any

from envs.base import PARSE_ERROR, AgentEnv, implements

MAX_CHECK_STEPS = 1000  # a step limit the check itself keeps when an env never ends an episode


class EnvCheckError(AssertionError):
    """The env breaks the NextState env contract; the message says where."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise EnvCheckError(message)


def _check_message(obs: Any, where: str) -> None:
    _require(isinstance(obs, Mapping), f"{where}: the observation must be a mapping, got {type(obs).__name__}")
    _require(isinstance(obs.get("role"), str) and isinstance(obs.get("content"), str),
             f"{where}: the observation needs a str 'role' and 'content' (got keys {sorted(obs)})")


def _check_step(result: Any, where: str) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
    _require(isinstance(result, tuple) and len(result) == 5, f"{where}: step() must return a 5-tuple")
    obs, reward, terminated, truncated, info = result
    _check_message(obs, where)
    _require(isinstance(info, Mapping), f"{where}: info must be a mapping")
    for key in ("next_state", "signals", "outcome"):
        _require(key in info, f"{where}: info lacks {key!r} (info keys: {sorted(info)})")
    _require(isinstance(info["signals"], Mapping), f"{where}: info['signals'] must be a mapping")
    ns = info["next_state"]
    _require(isinstance(ns, Mapping) and "role" in ns and "content" in ns,
             f"{where}: info['next_state'] must be a {{role, content}} message")
    done = bool(terminated or truncated)
    if done:
        _require(isinstance(info["outcome"], (int, float)) and not isinstance(info["outcome"], bool),
                 f"{where}: the last step's info['outcome'] must be a number, got {info['outcome']!r}")
        _require(float(reward) == float(info["outcome"]),
                 f"{where}: the last step's reward {reward!r} must equal info['outcome'] {info['outcome']!r}")
    else:
        _require(info["outcome"] is None, f"{where}: info['outcome'] must be None before the end")
        _require(float(reward) == 0.0, f"{where}: the reward before the end must be 0.0, got {reward!r}")
    return dict(obs), float(reward), done, dict(info)


def _tasks(env_cls: type, split: str) -> list[dict[str, Any]]:
    tasks = list(env_cls.tasks(split))
    _require(bool(tasks), f"{env_cls.__name__}.tasks({split!r}) is empty")
    for t in tasks:
        _require(isinstance(t, Mapping) and "id" in t, f"{env_cls.__name__}.tasks({split!r}): every task is a dict "
                 f"with an 'id' (got {t!r:.80})")
    return [dict(t) for t in tasks]


def _reset(env: Any, task: dict[str, Any], where: str) -> dict[str, Any]:
    result = env.reset(seed=0, options={"task": task})
    _require(isinstance(result, tuple) and len(result) == 2, f"{where}: reset() must return (obs, info)")
    obs, info = result
    _check_message(obs, where)
    _require(isinstance(info, Mapping), f"{where}: reset's info must be a mapping")
    return dict(obs)


def check_agent_env(env: Any, *, task: Mapping[str, Any] | None = None, malformed_action: str = "",
                    check_demonstration: bool = True, compare_observations: bool = True) -> None:
    """Check `env` (an instance) against the env contract; raise EnvCheckError on the first problem.

    `task`: the task to play (default: the first of `tasks("train")`); `malformed_action`: an action this env cannot
    parse (default: the empty string); `compare_observations`: require a demonstration's replay to give exactly its
    recorded observations (turn it off for envs whose observations carry timing)."""
    import gymnasium

    cls = type(env)
    train = _tasks(cls, "train")
    _tasks(cls, "eval")
    chosen = dict(task) if task is not None else train[0]

    # a malformed action, then malformed actions until the episode ends
    _reset(env, chosen, "reset")
    try:
        result = env.step(malformed_action)
    except Exception as exc:
        raise EnvCheckError(f"step({malformed_action!r}) raised {type(exc).__name__}: {exc}; a malformed action must be "
                            "a step with signals['parse_error'] = True") from exc
    obs, _, done, info = _check_step(result, f"step({malformed_action!r})")
    _require(info["signals"].get(PARSE_ERROR) is True,
             f"step({malformed_action!r}) must be a parse-error step (signals['parse_error'] = True), got signals "
             f"{info['signals']}")
    _require(bool(obs["content"].strip()), f"step({malformed_action!r}) must say what could not be parsed")
    steps = 1
    while not done:
        steps += 1
        _require(steps <= MAX_CHECK_STEPS, f"the episode did not end within {MAX_CHECK_STEPS} steps (no step limit?)")
        _, _, done, _ = _check_step(env.step(malformed_action), f"step {steps}")

    if check_demonstration and implements(cls, "demonstration"):
        _check_demonstration(env, chosen, compare_observations)
    if isinstance(env, gymnasium.Env):  # last: it steps with random text, which our checks above name better
        from gymnasium.utils.env_checker import check_env

        check_env(env, skip_render_check=True)


def _check_demonstration(env: Any, task: dict[str, Any], compare: bool) -> None:
    messages = env.demonstration(task)
    _require(isinstance(messages, list) and messages, "demonstration(task) must return a non-empty list of messages")
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    _require(bool(turns), "demonstration(task) has no assistant turn")
    replay = env.replaying_demonstration() if isinstance(env, AgentEnv) else nullcontext()
    lifted = env.step_limit_lifted(len(turns)) if isinstance(env, AgentEnv) else nullcontext()
    with replay, lifted:  # the env's own reference, replayed; not bound by max_steps
        _reset(env, task, "reset before replaying the demonstration")
        for n, i in enumerate(turns):
            where = f"demonstration turn {n + 1}"
            obs, reward, done, info = _check_step(env.step(messages[i]["content"]), where)
            _require(not info["signals"].get(PARSE_ERROR), f"{where}: the env could not parse it: {obs['content']:.200}")
            nxt = messages[i + 1] if i + 1 < len(messages) else None
            if compare and nxt is not None and nxt.get("role") != "assistant":
                _require(obs["content"] == nxt.get("content"),
                         f"{where}: the replay observed {obs['content']!r:.200}, the demonstration records "
                         f"{nxt.get('content')!r:.200}")
            if done:
                _require(n == len(turns) - 1, f"{where}: the episode ended before the demonstration's last turn")
                _require(reward > 0, f"the demonstration's episode ended with outcome {reward}, not a success")
                return
    raise EnvCheckError("the demonstration's last turn did not end the episode")


__all__ = ["EnvCheckError", "check_agent_env"]
