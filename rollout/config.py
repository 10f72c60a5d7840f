"""Config nodes -> plain dicts and dataclasses (Hydra stays at the edge: everything inside takes dataclasses)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

import envs
from envs.options import from_options

#: Options whose value is a free-form mapping (resources, runtime fields, request extras, demonstration options). Hydra
#: refuses a new key in any dict of a composed config ("Key 'docker' is not in struct"), so `key={docker: 1}` on the
#: command line would work only as `++key=...`; `open_dict_overrides` writes it so for these keys, and only these: a
#: misspelt key elsewhere still fails.
OPEN_DICT_OPTIONS = frozenset({
    "farm.worker_resources", "env.runtime_options", "policy.chat_template_kwargs", "policy.extra_body",
    "policy.warm_start.demonstrations", "judge.extra_body",
})


#: Free-form mappings keyed by family (`env=mix`): `<prefix><family>.<key>=value` sets one option of one family,
#: creating the family's entry when needed (Hydra's `++`); the planner checks each family's keys against its env
#: (the warm start's shares: rollout.policy.build.stage_shares).
FAMILY_MAPPINGS = ("env.families", "farm.families", "policy.warm_start.families")


def open_dict_overrides(overrides: list[str]) -> list[str]:
    """Hydra overrides with the documented forms of free-form options made to work as written (idempotent):
    - `key={...}` of an OPEN_DICT_OPTIONS key -> `++key={...}` (merged into the default mapping, new keys added);
    - `env.families={toolcall: 0.4, gui: 0.6}` (the weight map) -> one `++env.families=...` that gives each listed
      family its weight and takes every other registered env out of the mix (null), so the map says which families
      run; `env.families.<f>=0.2` -> `++env.families.<f>.weight=0.2`;
    - `env.families.<f>.<key>=v` and `farm.families.<f>...=v` -> `++...` (a family's own options)."""
    out = []
    for o in overrides:
        key, sep, value = o.partition("=")
        if not sep or key.startswith(("+", "~")):
            out.append(o)
        elif key in OPEN_DICT_OPTIONS and value.lstrip().startswith("{"):
            out.append(f"++{o}")
        elif key == "env.families" and value.lstrip().startswith("{"):
            out.append(f"++env.families={hydra_value(weight_map(parse_override_value(o)))}")
        elif key.startswith("env.families.") and key.count(".") == 2 and _is_number(value):
            out.append(f"++{key}.weight={value}")
        elif any(key == m or key.startswith(m + ".") for m in FAMILY_MAPPINGS):
            out.append(f"++{o}")
        else:
            out.append(o)
    return out


def resume_logs_in_place(overrides: list[str]) -> list[str]:
    """Overrides that send a resumed start's log (Hydra's launch.log) to the run it resumes: `run.resume=<dir>` of an
    existing directory, with no `run.out_dir` or `hydra.run.dir` given, adds `hydra.run.dir=<dir>`. Without it Hydra
    opens a new `outputs/<now>/launch.log` for the resume and the run's own launch.log misses it."""
    given = {override_key(o): o.partition("=")[2] for o in overrides}
    resume = given.get("run.resume", "")
    if resume in ("", "null") or given.keys() & {"run.out_dir", "hydra.run.dir"} or not Path(resume).is_dir():
        return overrides
    return [*overrides, f"hydra.run.dir={resume}"]


def parse_override_value(override: str) -> Any:
    """The value of one Hydra override as Python data (Hydra's own grammar)."""
    return OverridesParser.create().parse_override(override).value()


def weight_map(families: Any) -> dict[str, Any]:
    """`env.families={...}` as written -> the mapping that replaces the mix's families: a number is that family's
    weight, a mapping its options (with its `weight`), null drops it; registered envs not named are dropped too."""
    if not isinstance(families, Mapping):
        raise ValueError(f"env.families must be a mapping of family -> weight (or -> options), got {families!r}")
    out: dict[str, Any] = {str(fam): {"weight": entry} if _is_number(entry) else entry for fam, entry in families.items()}
    out.update({name: None for name in envs.names() if name not in out})
    return out


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    try:
        float(str(value))
        return True
    except ValueError:
        return False


def hydra_value(value: Any) -> str:
    """Python data written in Hydra's override grammar (strings quoted, so paths and interpolations survive)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(hydra_value(v) for v in value) + "]"
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"
def override_key(override: str) -> str:
    """The config key a command-line override sets ("+a.b=1" -> "a.b", "reward=outcome_only" -> "reward")."""
    return override.split("=", 1)[0].lstrip("+~")


def merge_overrides(*lists: list[str]) -> list[str]:
    """Later lists win; each key appears once, at the place of its last setting."""
    last: dict[str, str] = {}
    for lst in lists:
        for o in lst:
            key = override_key(o)
            last.pop(key, None)
            last[key] = o
    return list(last.values())


def plain(node: Any) -> dict[str, Any]:
    """A resolved plain dict from a config node (or a mapping / None)."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})


def dataclass_from(cls: type, node: Any, **extra: Any) -> Any:
    """Build dataclass `cls` from a config node, rejecting unknown keys with a message that lists the known ones."""
    return from_options(cls, plain(node), **extra)


def plain_value(value: Any) -> Any:
    """A default value as a config file would write it: dataclasses as mappings of their fields, tuples as lists,
    sets sorted, enums by value, classes (a retry policy's exception classes) by name."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_value(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, (set, frozenset)):
        return sorted(plain_value(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    if isinstance(value, Mapping):
        return {k: plain_value(v) for k, v in value.items()}
    return value


def defaults_node(cls: type, exclude: Iterable[str] = ()) -> dict[str, Any]:
    """Every field of dataclass `cls` with its default, as a plain config mapping: the schema a config group extends
    (rollout.build registers one per group option). `exclude`: dotted field names the launcher sets itself (e.g.
    `seed`, from run.seed), left out so that setting them is an error."""
    skip = set(exclude)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name in skip:
            continue
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            raise TypeError(f"{cls.__name__}.{f.name} has no default: every option of a config group needs one")
        node = plain_value(value)
        inner = {e.split(".", 1)[1] for e in skip if e.startswith(f.name + ".")}
        for path in inner:  # nested exclusions (e.g. warm_start.sft.seed)
            *parents, leaf = path.split(".")
            target = node
            for p in parents:
                target = target[p]
            target.pop(leaf, None)
        out[f.name] = node
    return out
