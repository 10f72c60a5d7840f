"""AgentEnv: a gymnasium.Env whose actions are text and whose observations are the next state the agent sees.

Subclasses implement `begin(task)` (the first message of an episode), `act(action)` (one step), `tasks(split)` (the bundled
task set) and, when the episode can end by truncation, `verify()` (the outcome of the state as it is). The base class keeps
the bookkeeping every family shares: task lookup, the step limit, observation truncation, the `info` keys the rest of
NextState reads (`next_state`, `signals`, `outcome`), and the rejection of actions no family can use (not text, longer
than `max_action_chars`, not encodable as UTF-8), which become parse-error steps before `act` sees them.

Optional hooks, declared here with their signatures and defaults (see "Optional hooks" below): `validate_task`,
`load_task_file`, `demonstration`, `demonstration_labels`, and the class attributes `task_options` and `config_class`.
The launcher asks `implements(cls, name)` whether an env class provides one; a plain class with only reset / step /
close / tasks is a valid plugin too and gets the defaults (`hook(cls, name)`). `envs.check_agent_env(env)` checks a
plugin against all of this.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from envs.action_text import not_utf8, printable_text
from envs.spaces import FreeText, message_space, truncate_middle
from envs.taskfile import Task, load_tasks

#: Signal keys with a meaning shared by every family (the RuleJudge reads these).
PARSE_ERROR = "parse_error"  # the action could not be parsed; nothing was executed
ERROR = "error"  # the action ran and failed (tool exception, non-zero exit, timeout)
PROGRESS = "progress"  # the env knows for sure that this step moved the task forward
WRONG = "wrong"  # the env knows for sure that this step went wrong (a wrong value, an extra call), though it ran
TRUNCATED_OUTPUT = "output_truncated"
#: A demonstration message with this key carries the signals of a hint (e.g. {"expected", "shown"}); the warm start
#: appends the rule judge's hint from them to that message, as the teacher of directive signals sees it
#: (rollout/policy/build.py), so a policy can learn to read a hint in its context.
HINT_SIGNALS = "hint_signals"


Message = dict[str, Any]  # {"role": "system"|"user"|"assistant"|"tool", "content": str, ...}


class NoDemonstration(LookupError):
    """`demonstration(task)` of a task that has no reference conversation (e.g. an OSWorld task, which comes without a
    scripted solution): the warm start leaves the task out and goes on with the others."""


class class_or_instance:  # noqa: N801 (used as a decorator, like classmethod)
    """A method callable on an env instance (it runs on that env) or on the env class, where it runs on a temporary env
    built with the default configuration and closed afterwards: `TerminalEnv.demonstration(task)` and
    `env.demonstration(task)` both work. The one class-or-instance mechanism of the env families."""

    def __init__(self, func: Callable[..., Any]):
        self.func = func
        functools.update_wrapper(self, func)

    def __get__(self, obj: Any, cls: type) -> Callable[..., Any]:
        if obj is not None:
            return functools.partial(self.func, obj)

        @functools.wraps(self.func)
        def on_a_fresh_env(*args: Any, **kwargs: Any) -> Any:
            env = cls()
            try:
                return self.func(env, *args, **kwargs)
            finally:
                env.close()

        return on_a_fresh_env


@dataclass
class Transition:
    """What one step produced, before the base class turns it into gymnasium's 5-tuple."""

    content: str
    role: str = "tool"
    signals: dict[str, Any] = field(default_factory=dict)
    outcome: float | None = None  # set when the step ends the episode (terminated)
    image: np.ndarray | None = None
    extra_info: dict[str, Any] = field(default_factory=dict)


def unusable_action(action: Any, max_chars: int | None) -> str | None:
    """Why no family could use `action`, or None: it is not text, is longer than the action space allows, or cannot be
    encoded as UTF-8 (a lone surrogate: no process, file or socket can receive it)."""
    if not isinstance(action, str):
        return f"expected text, got {type(action).__name__}"
    if max_chars is not None and len(action) > max_chars:
        return f"the action is {len(action)} characters long; the limit is {max_chars}: send a shorter one"
    problem = not_utf8(action)
    return f"the action {problem}" if problem else None


class AgentEnv(gym.Env):
    """Base class of every NextState env (see docs/architecture.md, "Contracts")."""

    #: Family name: selects the judge template and rule set. Plugins may keep "generic".
    family: ClassVar[str] = "generic"
    #: Constructor options that also select the bundled task set: the launcher passes them to `tasks(split, **options)`
    #: (e.g. toolcall's `task_set`).
    task_options: ClassVar[tuple[str, ...]] = ()
    #: A dataclass of further keyword options the constructor takes as **kwargs (e.g. the GUI env's GUIConfig), so the
    #: launcher knows their defaults; None when every option is a named constructor parameter.
    config_class: ClassVar[type | None] = None
    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(
        self,
        *,
        max_steps: int = 10,
        tasks: str | Path | Sequence[Task] | None = None,
        split: str = "train",
        max_observation_chars: int = 16_000,
        max_action_chars: int = 16_000,
    ):
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.max_steps = max_steps
        self.split = split
        self.max_observation_chars = max_observation_chars
        self._task_source = tasks
        self._task_pool: list[Task] | None = None
        self._task_index: dict[str, Task] | None = None
        self.action_space = FreeText(max_action_chars)
        self.observation_space = message_space(max_observation_chars)
        self.task: Task | None = None
        self.step_index = 0
        self.done = False

    # ----- what subclasses implement -----
    @classmethod
    def tasks(cls, split: str = "train", **options: Any) -> Sequence[Task]:
        """The bundled task set for `split` ("train" or "eval"); each task a dict with at least "id". `options`: the
        constructor options named in `task_options` that pick the set (the launcher passes the run's values)."""
        raise NotImplementedError(f"{cls.__name__} bundles no tasks: pass tasks=<file.json|.jsonl> or a list of dicts")

    @classmethod
    def validate_task(cls, task: Task) -> Task:
        """Check (and normalize) one task dict; raise ValueError naming what is wrong."""
        if "id" not in task:
            raise ValueError(f"task has no 'id' field (fields: {sorted(task)})")
        return task

    def begin(self, task: Task) -> Transition:
        """Set up the episode for `task`; return the first message (role "user")."""
        raise NotImplementedError

    def act(self, action: str) -> Transition:
        """Run one action; return its next state. Malformed actions return a Transition with signals[PARSE_ERROR]."""
        raise NotImplementedError

    def verify(self) -> float:
        """The outcome of the episode's current state (called when it is truncated by the step limit)."""
        raise NotImplementedError

    def parse_error(self, reason: str) -> Transition:
        """The step of an action rejected before `act` (see `unusable_action`): nothing ran. Families whose observations
        carry more (the GUI's screenshot, the tool-call env's full signal set) override it."""
        return Transition(f"could not parse the action: {reason}", role="user",
                          signals={PARSE_ERROR: True, "parse_message": reason})

    # ----- optional hooks (the defaults below mean "not provided"; see `implements`) -----
    @classmethod
    def load_task_file(cls, path: str | Path, fmt: str) -> list[Task]:
        """Tasks from a file in one of this env's named formats (`env.tasks_format=<fmt>`, e.g. toolcall's dapo_math);
        the generic JSON / JSONL / parquet reader needs no hook."""
        raise ValueError(f"{cls.__name__} reads no named task formats (tasks_format={fmt!r}); drop the option")

    @class_or_instance
    def demonstration(self, task: Task, **options: Any) -> list[Message]:
        """A reference conversation for `task` (system, user, then assistant / observation turns the env really gives),
        for the local policy's SFT warm start; `options` are the env's own (e.g. toolcall's `noise`). On the class it
        runs on a temporary default env. Without it, `policy=local` starts from an untrained model. A task without one
        raises NoDemonstration."""
        raise NotImplementedError(f"{type(self).__name__} has no demonstration(task)")

    @classmethod
    def demonstration_labels(cls, task: Task, messages: Sequence[Mapping[str, Any]]) -> list[str] | None:
        """What each assistant turn of a demonstration was (reported by the warm start); None: no labels."""
        return None

    # ----- the gymnasium API -----
    def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None):
        super().reset(seed=seed)
        self.task = self._pick_task((options or {}).get("task"))
        self.step_index = 0
        self.done = False
        first = self.begin(self.task)
        obs, info = self._observe(first)
        info["task_id"] = str(self.task["id"])
        info["family"] = self.family
        return obs, info

    def step(self, action: str):
        if self.task is None:
            raise RuntimeError(f"{type(self).__name__}.step() called before reset()")
        if self.done:
            raise RuntimeError(f"{type(self).__name__}.step() called after the episode ended; call reset()")
        self.step_index += 1
        problem = unusable_action(action, getattr(self.action_space, "max_length", None))  # a plugin's own space
        tr = self.parse_error(problem) if problem else self.act(action)
        terminated = tr.outcome is not None
        truncated = not terminated and self.step_index >= self.max_steps
        outcome = tr.outcome
        if truncated:
            outcome = float(self.verify())
            tr.content += f"\n[step limit of {self.max_steps} reached: the episode is over]"
        self.done = terminated or truncated
        obs, info = self._observe(tr)
        info["outcome"] = outcome
        reward = float(outcome) if outcome is not None else 0.0
        return obs, reward, terminated, truncated, info

    @contextmanager
    def step_limit_lifted(self, steps: int) -> Iterator[None]:
        """Let a reference conversation of `steps` actions play to its end. Demonstrations are not bound by the step
        limit: `max_steps` is a rollout budget, and a solution longer than it is still the task's reference (the
        policy that learns from it is truncated at `max_steps` in its own episodes as usual)."""
        saved = self.max_steps
        self.max_steps = max(saved, int(steps))
        try:
            yield
        finally:
            self.max_steps = saved

    @contextmanager
    def replaying_demonstration(self) -> Iterator[None]:
        """Within it the env replays its own reference conversation (its `demonstration`, or `envs.check_agent_env`
        stepping through one): an env whose reference needs files no agent may see (a task directory's oracle) gives
        them only here, by this state, never because an action's text matches. The default does nothing."""
        yield

    # ----- helpers -----
    def _observe(self, tr: Transition) -> tuple[dict[str, Any], dict[str, Any]]:
        content, cut = truncate_middle(printable_text(tr.content), self.max_observation_chars)
        signals = dict(tr.signals)
        if cut:
            signals[TRUNCATED_OUTPUT] = True
        obs: dict[str, Any] = {"role": tr.role, "content": content}
        if tr.image is not None:
            obs["image"] = tr.image
        info = {"next_state": {"role": tr.role, "content": content}, "signals": signals, "outcome": None}
        info.update(tr.extra_info)
        return obs, info

    def task_pool(self) -> list[Task]:
        """The tasks this env draws from: the `tasks` argument (file or list) or the bundled set for `split`."""
        if self._task_pool is None:
            src = self._task_source
            if src is None:
                pool = [self.validate_task(dict(t)) for t in type(self).tasks(self.split)]
            elif isinstance(src, (str, Path)):
                pool = load_tasks(src, self.validate_task)
            else:
                pool = [self.validate_task(dict(t)) for t in src]
            if not pool:
                raise ValueError(f"{type(self).__name__}: the task set is empty")
            self._task_pool = pool
        return self._task_pool

    def _pick_task(self, choice: Task | str | int | None) -> Task:
        if isinstance(choice, Mapping):
            return self.validate_task(dict(choice))
        pool = self.task_pool()
        if choice is None:
            return pool[int(self.np_random.integers(len(pool)))]
        if self._task_index is None:
            self._task_index = {str(t["id"]): t for t in pool}
        key = str(choice)
        if key not in self._task_index:
            close = difflib.get_close_matches(key, list(self._task_index), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise KeyError(f"no task {key!r} among the {len(pool)} tasks of {type(self).__name__}{hint}")
        return self._task_index[key]


#: The optional hooks an env class may provide (AgentEnv declares each with its default).
OPTIONAL_HOOKS = ("validate_task", "load_task_file", "demonstration", "demonstration_labels")


def implements(env_cls: type, name: str) -> bool:
    """Whether `env_cls` provides optional hook `name` itself (not AgentEnv's default). A plain plugin class (not an
    AgentEnv) provides what it defines."""
    if name not in OPTIONAL_HOOKS:
        raise ValueError(f"{name!r} is not an optional env hook; hooks: {', '.join(OPTIONAL_HOOKS)}")
    owner = next((k for k in env_cls.__mro__ if name in vars(k)), None)
    return owner is not None and owner is not AgentEnv


def hook(env_cls: type, name: str) -> Callable[..., Any]:
    """`env_cls`'s hook `name`, or AgentEnv's default for a plain plugin class that does not define it."""
    owner = env_cls if implements(env_cls, name) or issubclass(env_cls, AgentEnv) else AgentEnv
    return getattr(owner, name)
