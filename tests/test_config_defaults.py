"""Defaults are declared once: each config group's options and defaults are its dataclass's (the schemas rollout.build
registers); a YAML file under configs/ sets only what differs from them, and says why on the same line.

- A key equal to its default restates it: remove it (the schema still makes it a key of the group).
- A key that differs carries a `# comment` on its line (values taken from another key, `${...}`, name their source).
- A key that is no option of the group is an error (Hydra would add it silently while merging files).
Experiment files are held to the same rule against the groups they choose. And the launcher's defaults are the
library's: the default command builds exactly the dataclasses' defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from prm.factory import JudgeConfig
from rollout.build import (
    CONFIG_DIR,
    compose_launch_config,
    group_schemas,
    plan_run,
    plan_trainer,
)
from rollout.farm.core import FarmConfig
from rollout.loop import LoopConfig
from rollout.policy.base import SamplingParams
from rollout.policy.local_config import LocalPolicyOptions
from train.batch import RewardConfig
from train.config import MegatronTrainerConfig, TorchTrainerConfig

COMPONENT_SECTIONS = ("run", "env", "policy", "judge", "trainer", "reward", "farm", "loop", "sampling")
GROUPS = ("env", "policy", "judge", "trainer", "reward", "farm")
# launch.yaml keys outside any component: Hydra's own settings and the log level (the edge, no dataclass)
LAUNCH_EDGE_KEYS = ("hydra", "log_level")


def leaves(text: str) -> list[tuple[str, Any, str]]:
    """(dotted key, value, the key's source line) of every leaf of a YAML mapping; flow mappings ({a: 1}) and lists
    are leaves (free-form values), block mappings are walked."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        lines = text.splitlines()
        out: list[tuple[str, Any, str]] = []

        def walk(node: yaml.MappingNode, prefix: str) -> None:
            for key_node, value_node in node.value:
                key = f"{prefix}{key_node.value}"
                if isinstance(value_node, yaml.MappingNode) and not value_node.flow_style and value_node.value:
                    walk(value_node, key + ".")
                else:
                    out.append((key, loader.construct_object(value_node, deep=True), lines[key_node.start_mark.line]))

        if root is not None:
            walk(root, "")
        return out
    finally:
        loader.dispose()


def lookup(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def problems(path: Path, defaults: dict[str, Any], skip: tuple[str, ...] = ()) -> list[str]:
    found = []
    for key, value, line in leaves(path.read_text()):
        if key == "defaults" or key.split(".")[0] in skip:
            continue
        where = f"{path.relative_to(CONFIG_DIR.parent)}: {key}"
        try:
            default = lookup(defaults, key)
        except KeyError:
            found.append(f"{where} is not an option of this group")
            continue
        if isinstance(value, str) and "${" in value:
            continue  # taken from another key: it names its source
        if value == default:
            found.append(f"{where}: {value!r} restates the default (remove the line)")
        elif " #" not in line:
            found.append(f"{where}: {value!r} differs from the default {default!r} without a comment saying why")
    return found


def group_files() -> list[tuple[str, Path]]:
    return [(g, p) for g in GROUPS for p in sorted((CONFIG_DIR / g).glob("*.yaml"))]


@pytest.mark.parametrize("group,path", group_files(), ids=lambda x: str(x.name) if isinstance(x, Path) else x)
def test_a_group_file_sets_only_what_differs_from_its_schema_and_says_why(group, path):
    data = yaml.safe_load(path.read_text()) or {}
    extends = [d for d in data.get("defaults", []) if isinstance(d, str) and d.endswith("_defaults")]
    assert len(extends) == 1, f"{path} must extend exactly one schema (defaults: [<name>_defaults, _self_])"
    schema = group_schemas()[(group, extends[0])]
    assert problems(path, schema) == []


def test_launch_yaml_sets_only_what_differs():
    schema = group_schemas()[("", "launch_defaults")]
    assert problems(CONFIG_DIR / "launch.yaml", schema, skip=LAUNCH_EDGE_KEYS) == []


@pytest.mark.parametrize("path", sorted((CONFIG_DIR / "experiment").glob("*.yaml")), ids=lambda p: p.stem)
def test_an_experiment_sets_only_what_differs_from_the_groups_it_chooses(path):
    data = yaml.safe_load(path.read_text())
    choices = [f"{k.removeprefix('override /')}={v}" for d in data["defaults"] if isinstance(d, dict)
               for k, v in d.items()]
    base = compose_launch_config(choices)
    from omegaconf import OmegaConf

    composed = OmegaConf.to_container(base, resolve=False)
    add_family_defaults(composed, data)
    skip = tuple(k for k in data if k not in COMPONENT_SECTIONS)  # the experiment's own sections (experiment, table4)
    assert problems(path, composed, skip=skip) == []


def add_family_defaults(composed: dict[str, Any], data: dict[str, Any]) -> None:
    """env=mix: what each family entry of the experiment starts from (its weight, name and sampling defaults, and its
    env's composed group config, as rollout.build.family_env_config merges it) and each family's farm (FarmConfig)."""
    from rollout.build import family_env_config
    from rollout.config import defaults_node
    from rollout.farm.core import FarmConfig
    from rollout.policy.base import SamplingParams

    families = (data.get("env") or {}).get("families") or {}
    if composed.get("env", {}).get("name") != "mix":
        return
    for fam, entry in families.items():
        name = (entry or {}).get("name", fam) if isinstance(entry, dict) else fam
        base = composed["env"]["families"].get(fam) or {}
        composed["env"]["families"][fam] = {"weight": base.get("weight"), "name": fam,
                                            "sampling": defaults_node(SamplingParams), **family_env_config(name, {}, fam, resolve=False)}
    farm = composed.setdefault("farm", {})
    farm["families"] = {f: defaults_node(FarmConfig) for f in ((data.get("farm") or {}).get("families") or {})}


def test_the_checker_catches_restated_and_unexplained_values(tmp_path):
    p = CONFIG_DIR / "farm" / "_probe.yaml"
    try:
        p.write_text("defaults:\n  - farm_defaults\n  - _self_\nnum_envs: 32\nmax_starting: 4\nstep_timeout_s: 9  # why\n"
                     "colour: red  # no such option\n")
        found = problems(p, group_schemas()[("farm", "farm_defaults")])
    finally:
        p.unlink()
    assert [f.split(": ", 1)[1] for f in found] == [
        "num_envs: 32 restates the default (remove the line)",
        "max_starting: 4 differs from the default 16 without a comment saying why",
        "colour is not an option of this group",
    ]


def test_the_default_command_builds_the_library_defaults():
    """`python -m rollout.launch` with no overrides trains like a library user who builds the dataclasses themselves."""
    plan = plan_run(compose_launch_config(["run.name=x"]))
    assert plan.farm == FarmConfig() and plan.reward == RewardConfig() and plan.sampling == SamplingParams()
    assert plan.loop == LoopConfig()
    assert plan.trainer.config == TorchTrainerConfig() and plan.judge == JudgeConfig()
    assert plan.policy.config == LocalPolicyOptions()
    megatron = plan_trainer(compose_launch_config(["trainer=megatron"]).trainer, 1.0)
    assert megatron.config == MegatronTrainerConfig()
    # the three that disagreed before (README, "Configuration"): one value each, the launcher's
    assert FarmConfig().num_envs == 32 and SamplingParams().max_new_tokens == 96
    assert TorchTrainerConfig().lr == MegatronTrainerConfig().lr == 2e-4


def test_every_option_is_a_key_on_the_command_line():
    """Keys no YAML file lists are still options (the schema has them), with the dataclass default."""
    cfg = compose_launch_config(["farm=ray", "farm.hang_grace_s=3", "policy.warm_start.sft.warmup_steps=2",
                                 "trainer.eps=1e-7", "env=gui", "env.settle_min_s=0.1", "loop.eval_judge=true"])
    assert cfg.farm.hang_grace_s == 3 and cfg.policy.warm_start.sft.warmup_steps == 2 and cfg.trainer.eps == 1e-7
    assert cfg.env.settle_min_s == 0.1 and cfg.loop.eval_judge is True
    with pytest.raises(Exception, match="seed"):  # set by the launcher from run.seed: not an option of the group
        compose_launch_config(["policy.seed=3"])
