"""NextState environments: `envs.make(name, **kwargs)`, `envs.register(...)`, and `gymnasium.make("nextstate/<name>")`."""

from envs.base import (
    ERROR,
    PARSE_ERROR,
    PROGRESS,
    WRONG,
    AgentEnv,
    NoDemonstration,
    Transition,
    class_or_instance,
    hook,
    implements,
)
from envs.checker import EnvCheckError, check_agent_env
from envs.registry import (
    PluginLoadError,
    UnknownEnvError,
    env_class,
    make,
    names,
    register,
    spec,
    task_set,
)
from envs.taskfile import TaskFileError, load_tasks

__all__ = [
    "AgentEnv",
    "NoDemonstration",
    "Transition",
    "class_or_instance",
    "implements",
    "hook",
    "check_agent_env",
    "EnvCheckError",
    "ERROR",
    "PARSE_ERROR",
    "PROGRESS",
    "WRONG",
    "make",
    "register",
    "names",
    "spec",
    "env_class",
    "task_set",
    "load_tasks",
    "TaskFileError",
    "UnknownEnvError",
    "PluginLoadError",
]
