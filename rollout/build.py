"""Every component of a run, built from the launcher's config by one function each: `python -m rollout.launch`, its
dry run (`run.dry_run=true`) and experiments all call these, so a dry run checks exactly what a run builds.

Two halves:
- plan: `plan_run(cfg) -> RunPlan`, every component's config as its dataclass (the env with its task sets loaded, the
  farm, policy, judge, trainer, reward, loop and sampling settings). Each group's choice (`policy.type`,
  `trainer.backend`, `judge.type`, ...) is dispatched here and nowhere else. Nothing is started, no weights are read.
- build: `build_policy_and_trainer(plan)`, `make_judge(plan.judge)`, `make_farm(...)`: the objects. The dry run builds
  what needs no model weights (an env, the server clients, the judge) and reports the rest of the plan.

The defaults of every group are those of its dataclass (the tables below name them); `register_schemas()` stores them
in Hydra's ConfigStore, and each configs/<group>/<option>.yaml extends its schema and sets only what differs.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

import envs
from envs.options import check_known, from_options
from envs.tasks import bundled_tasks, holdout_split, load_task_source
from prm.factory import JUDGE_TYPES, LLM_TYPES, TYPE_KEYS, JudgeConfig, judge_config, make_judge
from prm.llm_judge import LLMJudgeConfig
from rollout.config import defaults_node, open_dict_overrides, plain
from rollout.episodes.pool import RunnerPool, RunnerSpec, farm_factory, runner_farm_config
from rollout.event_loop import event_loop_factory
from rollout.farm.core import EnvFarm, FarmConfig, MixFarm, make_farm
from rollout.loggers import WandbOptions, check_loggers
from rollout.loop import LoopConfig
from rollout.mix import LoopFamily, slot_quotas
from rollout.policy.base import Policy, SamplingParams
from rollout.policy.build import build_local_policy
from rollout.policy.local_config import LocalPolicyOptions
from rollout.policy.openai import OpenAIConfig, OpenAIPolicy
from rollout.policy.sglang import SGLangConfig, SGLangPolicy
from rollout.policy.vllm import VLLMConfig, VLLMPolicy, start_policy_servers, stop_servers
from rollout.policy.vllm_server import VLLMServer, VLLMServerOptions
from rollout.state.checkpoint import CheckpointConfig
from rollout.trainer_group import ModelSource, TrainerGroup, TrainerPlacement, check_placement
from train.backends import Trainer
from train.batch import RewardConfig
from train.config import MegatronTrainerConfig, TorchTrainerConfig
from train.hf_models import load_model, load_tokenizer, read_config

log = logging.getLogger("nextstate")

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


# ----- run and env settings -----
@dataclass
class RunSettings:
    """`run.*`: where a run writes, its seed, its checkpoints and loggers. (launch.yaml names each run after its start
    time.)"""

    name: str = "run"  # the run directory's name under outputs/
    out_dir: str = "outputs/run"
    seed: int = 0
    dry_run: bool = False  # build and check everything (configs, task files, paths, clients) but the model; no run
    event_loop: str = "auto"  # the driver's asyncio loop: auto (uvloop where installed) | uvloop | asyncio
    resume: str | None = None  # a run directory to continue (after a crash or kill): docs/long_runs.md
    checkpoint_every: int = 1  # trainer checkpoint (resume point) after every k-th iteration and the last; 0: the last
    keep_checkpoints: int = 1  # checkpoints kept in <run>/checkpoints/ (the newest)
    loggers: list[str] = field(default_factory=list)  # also log metrics rows to: tensorboard, wandb
    wandb: WandbOptions = field(default_factory=WandbOptions)  # run.loggers=[wandb]: project, entity, mode, ...

    def __post_init__(self) -> None:
        self.loggers = check_loggers(self.loggers)
        CheckpointConfig(self.checkpoint_every, self.keep_checkpoints)  # the same checks the run applies
        event_loop_factory(self.event_loop)  # a clear error for an unknown loop or a missing uvloop, before the run


@dataclass
class TaskSources:
    """The env group's keys the launcher reads; every other key goes to the env's constructor."""

    name: str = "toolcall"  # the registered env (envs.make)
    tasks: str | None = None  # a task file for training; None: the env's bundled train split
    eval_tasks: str | None = None  # a task file for evaluation; None: the bundled eval split
    tasks_format: str | None = None  # None: task JSON / JSONL / parquet; else one of the env's named formats
    eval_tasks_format: str | None = None
    holdout_fraction: float | None = None  # e.g. 0.3: split `tasks` by id hash into train and held-out eval
    holdout_seed: int = 0


ENV_LAUNCH_KEYS = tuple(f.name for f in dataclasses.fields(TaskSources))


@dataclass
class EnvSetup:
    """One env family of a run: its env, options, task sets, and (in a mix) its weight and sampling overrides."""

    name: str  # the registered env
    kwargs: dict[str, Any]  # the env's constructor options
    train_tasks: list[dict[str, Any]]
    eval_tasks: list[dict[str, Any]]
    sources: TaskSources
    family: str = ""  # its name in the run (its key in env.families); "": the env's name
    weight: float = 1.0  # share of the task groups per iteration (env=mix; 0: evaluated, not trained on)
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams overrides for its episodes

    def __post_init__(self) -> None:
        self.family = self.family or self.name

    @property
    def families(self) -> list[EnvSetup]:
        return [self]

    def describe(self) -> str:
        s = self.sources
        held = f"a held-out {s.holdout_fraction:g} of those" if s.holdout_fraction else (s.eval_tasks or "bundled")
        label = self.name if self.family == self.name else f"{self.family} ({self.name})"
        weight = f", weight {self.weight:g}" if self.family != self.name or self.weight != 1.0 else ""
        return (f"{label}: {len(self.train_tasks)} train / {len(self.eval_tasks)} eval tasks "
                f"(train {s.tasks or 'bundled'}, eval {held}{weight})")


MIX = "mix"
BUILTIN_FAMILIES = ("toolcall", "terminal", "gui", "swe")
#: the keys of an env.families entry that are not the family env's own options
FAMILY_KEYS = ("weight", "name", "sampling")


@dataclass
class MixSources:
    """`env=mix`: several env families in one run with one policy (docs/envs/mix.md). Each entry of `families` is
    `family -> {weight, [name], [sampling], <that env's options>}`: `weight` its share of the task groups per
    iteration (0: evaluated and warm-started on, not trained on), `name` the registered env (default: the key, so one
    env can be two families), `sampling` SamplingParams overrides for its episodes (e.g. max_new_tokens), and every
    option of `env=<name>` (its configs/env/<name>.yaml applies first), tasks and eval_tasks included. null drops it."""

    name: str = MIX
    families: dict[str, Any] = field(default_factory=lambda: {f: {"weight": 0.25} for f in BUILTIN_FAMILIES})


@dataclass
class MixSetup:
    """The families of an `env=mix` run, in the order given."""

    families: list[EnvSetup]
    name: str = MIX

    def describe(self) -> str:
        return f"mix of {len(self.families)}: " + "; ".join(f.describe() for f in self.families)


def family_env_config(name: str, options: dict[str, Any], where: str, resolve: bool = True) -> dict[str, Any]:
    """The env config of one family as `env=<name> <options>` would compose it: the env's schema, then its
    configs/env/<name>.yaml (when there is one), then `options`; an option the env does not take is an error.
    `resolve=False` keeps interpolations as written (e.g. swe's `eval_tasks: ${.instances}`)."""
    schema = env_schema(name)
    check_known(schema, options, where)
    layers = [OmegaConf.create(schema)]
    group_file = CONFIG_DIR / "env" / f"{name}.yaml"
    if group_file.exists():
        own = OmegaConf.load(group_file)
        own.pop("defaults", None)
        layers.append(own)
    layers.append(OmegaConf.create(options))
    return OmegaConf.to_container(OmegaConf.merge(*layers), resolve=resolve)  # type: ignore[return-value]


def plan_mix(data: dict[str, Any]) -> MixSetup:
    """`env=mix`: each family's env, options, task sets, weight and sampling overrides (see MixSources)."""
    spec = from_options(MixSources, data, "env (mix)")
    families = []
    for fam, entry in (spec.families or {}).items():
        where = f"env.families.{fam}"
        if entry is None:
            continue  # dropped from the mix
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: a weight or a mapping of options, got {entry!r}")
        entry = dict(entry)
        if "weight" not in entry:
            raise ValueError(f"{where} sets {', '.join(sorted(entry)) or 'nothing'} but has no weight (it is not in the "
                             f"mix): give it one ({where}.weight=0.25) or leave its options out")
        weight = float(entry.pop("weight"))
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"{where}.weight must be a number >= 0, got {weight}")
        name = str(entry.pop("name", fam))
        if name == MIX:
            raise ValueError(f"{where}.name=mix: a family is one env, not another mix")
        sampling = dict(entry.pop("sampling", None) or {})
        from_options(SamplingParams, sampling, f"{where}.sampling")  # an unknown key fails here, not mid-run
        try:
            envs.env_class(name)
        except envs.UnknownEnvError as exc:
            raise envs.UnknownEnvError(f"{where}: {exc.args[0]}") from None
        setup = plan_env({**family_env_config(name, entry, f"{where} ({name} env)"), "name": name})
        families.append(dataclasses.replace(setup, family=str(fam), weight=weight, sampling=sampling))
    if not families:
        raise ValueError("env=mix has no families: set env.families, e.g. env.families={toolcall: 0.5, terminal: 0.5}")
    if not any(f.weight > 0 for f in families):
        raise ValueError("every family of env=mix has weight 0: nothing to train on")
    return MixSetup(families)


def plan_env(env_cfg: Any) -> EnvSetup | MixSetup:
    """The env's name, constructor options and task sets (files loaded and validated, bundled splits otherwise);
    for env=mix, those of every family."""
    data = plain(env_cfg)
    if data.get("name") == MIX:
        return plan_mix(data)
    if "families" in data:
        raise ValueError(f"env.families is an option of env=mix, not of env={data.get('name')}")
    sources = from_options(TaskSources, {k: v for k, v in data.items() if k in ENV_LAUNCH_KEYS}, "env")
    kwargs = {k: v for k, v in data.items() if k not in ENV_LAUNCH_KEYS}
    cls = envs.env_class(sources.name)
    train = (load_task_source(cls, sources.tasks, sources.tasks_format, kwargs) if sources.tasks
             else bundled_tasks(cls, "train", kwargs))
    evals = (load_task_source(cls, sources.eval_tasks, sources.eval_tasks_format, kwargs) if sources.eval_tasks
             else bundled_tasks(cls, "eval", kwargs))
    if sources.holdout_fraction:  # a held-out split of the training tasks replaces the eval tasks
        if sources.eval_tasks:
            raise ValueError("env.holdout_fraction splits env.tasks into train and eval: leave env.eval_tasks null")
        train, evals = holdout_split(train, float(sources.holdout_fraction), sources.holdout_seed)
    return EnvSetup(sources.name, kwargs, train, evals, sources)


def env_option_defaults(env_cls: type) -> dict[str, Any]:
    """An env class's constructor options with their defaults: its keyword parameters (less the task source, which the
    launcher passes), and the fields of its `config_class` when it takes further options as **kwargs."""
    out: dict[str, Any] = {}
    try:
        params = inspect.signature(env_cls.__init__).parameters.values()
    except (TypeError, ValueError):
        params = []
    for p in params:
        if p.name in ("self", "tasks", "split", "render_mode") or p.default is inspect.Parameter.empty:
            continue
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD):
            out[p.name] = p.default if not isinstance(p.default, tuple) else list(p.default)
    config_class = getattr(env_cls, "config_class", None)
    if config_class is not None:
        out.update(defaults_node(config_class))
    return out


# ----- policy -----
@dataclass
class PolicyPlan:
    type: str  # local | sglang | vllm | openai
    config: LocalPolicyOptions | SGLangConfig | VLLMConfig | OpenAIConfig


#: policy.type -> its options (the group's schema). `local` is built by rollout.policy.build; the others are clients.
POLICY_CONFIGS: dict[str, type] = {"local": LocalPolicyOptions, "sglang": SGLangConfig, "vllm": VLLMConfig,
                                    "openai": OpenAIConfig}
SERVER_POLICIES: dict[str, Callable[[Any], Policy]] = {"sglang": SGLangPolicy, "vllm": VLLMPolicy,
                                                       "openai": OpenAIPolicy}
#: options a group's schema leaves out: the launcher sets them (run.seed; the sampling temperature)
POLICY_EXCLUDE = {"local": ("seed", "warm_start.sft.seed"), "vllm": ("warm_start.sft.seed",)}


def plan_policy(policy_cfg: Any, run: RunSettings) -> PolicyPlan:
    """`policy.type` -> the policy's options. Server policies write trained weights under the run directory unless
    `policy.weights_dir` names a directory the servers read."""
    data = plain(policy_cfg)
    kind = data.pop("type", "local")
    if kind not in POLICY_CONFIGS:
        raise ValueError(f"policy.type={kind!r} is not available; known: {', '.join(POLICY_CONFIGS)}")
    if kind == "local":
        return PolicyPlan(kind, from_options(LocalPolicyOptions, data, "local policy", seed=run.seed))
    if data.get("weights_dir") is None:
        data["weights_dir"] = str((Path(run.out_dir) / "weights").resolve())
    return PolicyPlan(kind, from_options(POLICY_CONFIGS[kind], data, f"{kind} policy"))


def build_server_policy(plan: PolicyPlan) -> Policy:
    """The HTTP client policy of a server plan (no request is sent)."""
    return SERVER_POLICIES[plan.type](plan.config)


# ----- trainer -----
@dataclass
class TrainerPlan:
    backend: str  # torch | megatron
    config: TorchTrainerConfig | MegatronTrainerConfig
    placement: TrainerPlacement  # in the launcher's process (one rank), or rank actors in a Ray placement group


def _torch_trainer(config: TorchTrainerConfig, model: Any, tokenizer: Any) -> Trainer:
    from train.backends.torch_backend import TorchTrainer  # torch: imported when a run builds a trainer

    return TorchTrainer(model, config, tokenizer)


def _megatron_trainer(config: MegatronTrainerConfig, model: Any, tokenizer: Any) -> Trainer:
    from train.backends.megatron_backend import MegatronTrainer  # megatron-core (an extra): imported when used

    return MegatronTrainer.from_hf_model(model, config)


#: trainer.backend -> (its options, how it is built from the policy's model). Both start from the same HF weights and
#: compute logprobs at the sampling temperature, so the same batch gives the same loss (tests/test_cross_backend.py).
TRAINER_BACKENDS: dict[str, tuple[type, Callable[..., Trainer]]] = {
    "torch": (TorchTrainerConfig, _torch_trainer),
    "megatron": (MegatronTrainerConfig, _megatron_trainer),
}
TRAINER_EXCLUDE = ("temperature",)  # set from sampling.temperature


def plan_trainer(trainer_cfg: Any, temperature: float) -> TrainerPlan:
    """`trainer.backend` -> the trainer's options, at the sampling temperature."""
    data = plain(trainer_cfg)
    backend = data.pop("backend", "torch")
    if backend not in TRAINER_BACKENDS:
        raise ValueError(f"trainer.backend={backend!r} is not available; known: {', '.join(TRAINER_BACKENDS)}")
    cls = TRAINER_BACKENDS[backend][0]
    config = from_options(cls, data, f"{backend} trainer", temperature=float(temperature))
    return TrainerPlan(backend, config, TrainerPlacement.of(backend, config))


def build_trainer(plan: TrainerPlan, model: Any, tokenizer: Any, *, model_path: str | None = None,
                  ray_address: str | None = None) -> Trainer:
    """The trainer of `plan`, holding its own copy of the weights: built in this process for one rank, else a
    TrainerGroup of rank actors (rollout/trainer_group.py) that load `model_path` or receive `model` once through
    Ray's object store. `ray_address` is the farm's, so the farm and the trainer share one Ray instance."""
    model_config = model.config.to_dict() if model is not None else read_config(model_path)
    check_placement(plan.placement, model_config)
    if plan.placement.in_process:
        if model is None:
            model = load_model(model_path)
        return TRAINER_BACKENDS[plan.backend][1](plan.config, model, tokenizer)
    import ray  # the group's transport: imported when a run starts one

    from rollout.farm.core import init_ray

    init_ray(ray_address)
    source = ModelSource(path=model_path) if model is None else ModelSource(model_ref=ray.put(model))
    return TrainerGroup.start(plan.backend, plan.config, plan.placement, source, tokenizer, ray_address)


def planned_model_config(policy: PolicyPlan) -> dict[str, Any] | None:
    """The config of the model the trainer will start from, as far as it is known before any weights are read: the
    served model's config.json, or the local tiny model's shape (None: no model directory to read)."""
    served_start = policy.type == "vllm" and not policy.config.model_path  # vLLM serves policy=local's tiny start
    if policy.type == "local" or served_start:
        m = policy.config.model
        text = {"model_type": "qwen3", "num_attention_heads": m.num_heads, "num_key_value_heads": m.num_kv_heads,
                "intermediate_size": m.intermediate_size, "hidden_size": m.hidden_size,
                "num_hidden_layers": m.num_layers, "vocab_size": m.vocab_size,
                "tie_word_embeddings": m.tie_word_embeddings}
        if policy.type == "local" and policy.config.vision.enabled:
            return {"model_type": "qwen3_vl", "text_config": text, "vision_config": asdict(policy.config.vision_tower)}
        return text
    path = policy.config.model_path
    return read_config(path) if path and (Path(path) / "config.json").is_file() else None


class NoTrainer(Trainer):
    """Stands in for a trainer when a server policy has no local weights to train (evaluation-only runs)."""

    version = 0

    def train_step(self, batch: Any) -> dict[str, float]:
        raise RuntimeError(
            "no trainer: set policy.model_path to the served model's HF directory to train "
            "(or loop.iterations=0 to only evaluate)"
        )

    def state_dict(self) -> dict[str, Any]:
        return self.train_step(None)

    def export_weights(self, path: str) -> str:
        return self.train_step(None)

    def close(self) -> None:
        return None


# ----- the whole run -----
@dataclass
class RunPlan:
    """Every component of one run as its config dataclass."""

    run: RunSettings
    env: EnvSetup | MixSetup
    farm: FarmConfig
    policy: PolicyPlan
    judge: JudgeConfig
    trainer: TrainerPlan
    reward: RewardConfig
    loop: LoopConfig
    sampling: SamplingParams
    farms: dict[str, FarmConfig] = field(default_factory=dict)  # env=mix: each family's own farm (plan_family_farms)

    def loop_families(self) -> list[LoopFamily]:
        return [LoopFamily(f.family, f.train_tasks, f.eval_tasks, f.weight, f.sampling) for f in self.env.families]


@dataclass
class Settings:
    farm: FarmConfig
    reward: RewardConfig
    loop: LoopConfig
    sampling: SamplingParams


def plan_run_settings(cfg: Any) -> RunSettings:
    return from_options(RunSettings, plain(cfg.run), "run")


def plan_reward(reward_cfg: Any) -> RewardConfig:
    """`reward.*` -> RewardConfig (its `mode` picks the reward math: train.batch)."""
    return from_options(RewardConfig, plain(reward_cfg), "reward")


def plan_judge(judge_cfg: Any, reward: RewardConfig | None = None) -> JudgeConfig:
    """`judge.type` -> the judge's options (prm.factory.judge_config: the judge types are dispatched there).
    `judge.hints` left unset (None) is decided by the reward: on for the directive modes, which train on hints."""
    judge = judge_config(plain(judge_cfg))
    directive = reward is not None and reward.directive
    if directive and judge.type == "none":
        raise ValueError(f"reward={reward.mode} trains on the judge's hints, and judge=none gives none: use judge=rule, "
                         "llm or ensemble")
    if directive and judge.hints is False:
        raise ValueError(f"reward={reward.mode} trains on the judge's hints: drop judge.hints=false")
    if judge.hints is None and directive:  # (unset and not directive: make_judge asks for none)
        judge = dataclasses.replace(judge, hints=True)
    return judge


def check_directive(reward: RewardConfig, policy: PolicyPlan, sampling: SamplingParams,
                    trainer: TrainerPlan | None = None) -> None:
    """What the directive modes need of the policy: token ids of the teacher's context (a local, SGLang or vLLM
    policy), for `reward.teacher=policy` servers that score tokens (SGLang, vLLM) at the temperature they return
    log-probs at, and for `reward.teacher=reference` a trainer that keeps its initial weights (the KL anchor's)."""
    if not reward.directive:
        return
    if trainer is not None:
        check_reference_teacher(reward, trainer)
        check_topk_trainer(reward, trainer)
    if policy.type not in ("local", "sglang", "vllm"):
        raise ValueError(f"reward={reward.mode} needs the teacher's context as token ids: use policy=local, "
                         f"policy=sglang or policy=vllm (policy={policy.type} renders no token ids)")
    if reward.teacher == "policy" and policy.type not in ("sglang", "vllm"):
        raise ValueError("reward.teacher=policy scores tokens on the policy's servers: use policy=sglang or "
                         "policy=vllm, or reward.teacher=trainer")
    if reward.teacher == "policy" and float(sampling.temperature) != 1.0:
        raise ValueError(f"reward.teacher=policy: the servers return log-probs at temperature 1, the rollout's are at "
                         f"sampling.temperature={sampling.temperature}; use reward.teacher=trainer (it computes both "
                         "at the sampling temperature)")


def check_topk_trainer(reward: RewardConfig, trainer: TrainerPlan) -> None:
    """`reward.opd_signal=teacher_topk` needs a trainer with the distillation loss and the teacher's logits: torch."""
    if reward.topk_signal and trainer.backend != "torch":
        raise ValueError(f"reward.opd_signal=teacher_topk: trainer={trainer.backend} has no distribution-level loss "
                         "and gives no top-k of its logits; use trainer=torch (or reward.opd_signal=sampled)")


def check_reference_teacher(reward: RewardConfig, trainer: TrainerPlan) -> None:
    """`reward.teacher=reference` scores with the trainer's frozen initial weights, which only a KL anchor keeps."""
    if reward.directive and reward.teacher == "reference" and trainer.config.kl_coef == 0.0:
        raise ValueError("reward.teacher=reference scores with the trainer's frozen initial weights, the KL anchor's, "
                         "and trainer.kl_coef=0 keeps none: set trainer.kl_coef > 0, or use reward.teacher=trainer")


def plan_settings(cfg: Any, run: RunSettings, policy: PolicyPlan) -> Settings:
    """The farm, reward, loop and sampling settings. Disk weight sync goes where a server policy's servers read."""
    loop = from_options(LoopConfig, plain(cfg.loop), "loop", seed=run.seed)
    weights_dir = getattr(policy.config, "weights_dir", None)
    if loop.weights_dir is None and weights_dir:
        loop = dataclasses.replace(loop, weights_dir=str(weights_dir))
    return Settings(
        farm=from_options(FarmConfig, plain(cfg.farm), "farm"),
        reward=plan_reward(cfg.reward),
        loop=loop,
        sampling=from_options(SamplingParams, plain(cfg.sampling), "sampling"),
    )


def plan_family_farms(farm: FarmConfig, env: EnvSetup | MixSetup) -> dict[str, FarmConfig]:
    """env=mix: each family's farm, `farm.*` with that family's `farm.families.<family>` overrides; the env slots
    (`farm.num_envs`) not given to a family by name are split by weight (rollout.mix.slot_quotas), and each family's
    start cap is `farm.max_starting` at most its slots. Empty for a one-env run (its farm is `farm`)."""
    if not isinstance(env, MixSetup):
        if farm.families:
            raise ValueError("farm.families sets per-family farms of env=mix; this run has one env: use farm.* instead")
        return {}
    weights = {f.family: f.weight for f in env.families}
    unknown = set(farm.families) - set(weights)
    if unknown:
        raise ValueError(f"farm.families names {sorted(unknown)}, which are not families of this run: {list(weights)}")
    own = {f: dict(o or {}) for f, o in farm.families.items()}
    fixed = {f: int(o["num_envs"]) for f, o in own.items() if "num_envs" in o}
    quotas = slot_quotas(farm.num_envs, weights, fixed)
    base = {k: v for k, v in dataclasses.asdict(farm).items() if k != "families"}
    out = {}
    for f in weights:
        options = {**base, "num_envs": quotas[f], "max_starting": min(farm.max_starting, quotas[f]), **own.get(f, {})}
        out[f] = from_options(FarmConfig, options, f"farm.families.{f}")
        if out[f].families:
            raise ValueError(f"farm.families.{f}.families: a family's farm has no families of its own")
    return out


def check_runners(loop: LoopConfig, policy: PolicyPlan, farms: Sequence[FarmConfig]) -> None:
    """`loop.runners > 1` runs episodes in Ray actors that reach the policy over HTTP, each with its share of the env
    slots (of every family's, for env=mix)."""
    if loop.runners == 1:
        return
    if policy.type not in SERVER_POLICIES:
        raise ValueError(f"loop.runners={loop.runners} runs episodes in Ray actors, which reach the policy over HTTP: "
                         f"use a server policy (policy={' or policy='.join(SERVER_POLICIES)}); policy={policy.type} "
                         "lives in the driver")
    for farm in farms:
        runner_farm_config(farm, loop.runners - 1, loop.runners)  # every runner gets a slot (a clear error if not)


def plan_run(cfg: Any) -> RunPlan:
    """Every component's config from the launcher's composed config (nothing started, no weights read)."""
    run = plan_run_settings(cfg)
    env = plan_env(cfg.env)
    policy = plan_policy(cfg.policy, run)
    settings = plan_settings(cfg, run, policy)
    trainer = plan_trainer(cfg.trainer, settings.sampling.temperature)
    check_directive(settings.reward, policy, settings.sampling, trainer)
    farms = plan_family_farms(settings.farm, env)
    check_runners(settings.loop, policy, [settings.farm, *farms.values()])
    return RunPlan(run=run, env=env, farm=settings.farm, policy=policy, judge=plan_judge(cfg.judge, settings.reward),
                   trainer=trainer, reward=settings.reward,
                   loop=settings.loop, sampling=settings.sampling, farms=farms)


def build_farm(plan: RunPlan) -> EnvFarm | MixFarm | RunnerPool:
    """The env farm of `plan` (not started): one farm, or for env=mix one per family behind a MixFarm; with
    `loop.runners > 1`, the runner actors, each hosting its share of it (rollout/episodes/pool.py)."""
    if plan.loop.runners > 1:
        return build_runners(plan)
    if isinstance(plan.env, MixSetup):
        return MixFarm({f.family: (f.name, f.kwargs, plan.farms[f.family]) for f in plan.env.families})
    return make_farm(plan.env.name, plan.env.kwargs, plan.farm)


def build_runners(plan: RunPlan) -> RunnerPool:
    """`loop.runners` Ray actors, each with its share of the farm (of each family's farm for env=mix), its own policy
    client and its own judge, built in the actor from these factories."""
    mixed = isinstance(plan.env, MixSetup)
    families = ({f.family: (f.name, f.kwargs, plan.farms[f.family]) for f in plan.env.families} if mixed
                else {plan.env.name: (plan.env.name, plan.env.kwargs, plan.farm)})
    spec = RunnerSpec(farm=farm_factory(families, mixed), policy=functools.partial(build_server_policy, plan.policy),
                      judge=functools.partial(make_judge, plan.judge), max_restarts=plan.farm.max_worker_restarts)
    name = MIX if mixed else plan.env.name
    return RunnerPool(spec, plan.loop.runners, env_name=name, ray_address=plan.farm.ray_address)


def build_policy_and_trainer(plan: RunPlan) -> tuple[Policy, Trainer, dict[str, Any]]:
    """The policy, a trainer holding its own copy of the weights, and the warm start's summary (local policy)."""
    if plan.policy.type == "local":
        policy, model, tokenizer, info = build_local_policy(plan.policy.config, plan.env.families, plan.run.seed)
        return policy, build_trainer(plan.trainer, model, tokenizer, ray_address=plan.farm.ray_address), info
    if plan.policy.type == "vllm" and not plan.policy.config.urls:
        return build_served_policy(plan)
    policy = build_server_policy(plan.policy)
    model_path = plan.policy.config.model_path
    if not model_path:
        return policy, NoTrainer(), {}
    # the served model's weights: loaded by the trainer (in this process, or by each rank of a group)
    tokenizer = load_tokenizer(getattr(plan.policy.config, "tokenizer", None) or model_path)
    return policy, build_trainer(plan.trainer, None, tokenizer, model_path=model_path,
                                 ray_address=plan.farm.ray_address), {}


def build_served_policy(plan: RunPlan) -> tuple[Policy, Trainer, dict[str, Any]]:
    """`policy=vllm` without `policy.urls`: the trainer (on `policy.model_path`, else on the tiny model policy=local
    starts from, warm-started and cached), its weights exported as the servers' first checkpoint
    (`<weights_dir>/v0`, in the layout that reloads exactly), `policy.server.num_servers` vLLM servers started on it
    and owned by the policy (stopped by its `close`), their URLs written into the plan (runner actors connect to
    them)."""
    cfg: VLLMConfig = plan.policy.config  # type: ignore[assignment]
    info: dict[str, Any] = {}
    if cfg.model_path:
        tokenizer = load_tokenizer(cfg.model_path)
        trainer = build_trainer(plan.trainer, None, tokenizer, model_path=cfg.model_path,
                                ray_address=plan.farm.ray_address)
    else:
        _local, model, tokenizer, info = build_local_policy(cfg.start_options(plan.run.seed), plan.env.families,
                                                            plan.run.seed)
        trainer = build_trainer(plan.trainer, model, tokenizer, ray_address=plan.farm.ray_address)
    servers: list[VLLMServer] = []
    try:
        start = Path(plan.loop.weights_dir or Path(plan.run.out_dir) / "weights") / "v0"
        trainer.export_weights(str(start))
        if cfg.tokenizer_path is None:  # a directory the weight sync never prunes (runner actors load it too)
            cfg.tokenizer_path = str(Path(plan.run.out_dir) / "servers" / "tokenizer")
            tokenizer.save_pretrained(cfg.tokenizer_path)
        servers = start_policy_servers(cfg, str(start), Path(plan.run.out_dir), max(20, plan.reward.topk))
        cfg.urls = [s.url for s in servers]
        return VLLMPolicy(cfg, tokenizer=tokenizer, servers=servers), trainer, info
    except BaseException:
        stop_servers(servers)
        trainer.close()
        raise


def start_judge_servers(plan: RunPlan, trainer: Trainer) -> list[VLLMServer]:
    """`judge.model_path` with no `judge.url`: the judge model served on vLLM by the launcher (`policy`: a frozen copy
    of the policy's starting weights, exported by the trainer), its URL written into the plan's judge config. The
    caller stops the servers (rollout.run)."""
    llm = plan.judge.llm
    if llm is None or llm.urls or not llm.model_path:
        return []
    model_dir = llm.model_path
    if model_dir == "policy":
        model_dir = str(Path(plan.run.out_dir) / "judge_model")
        trainer.export_weights(model_dir)
    options = from_options(VLLMServerOptions, dict(llm.server), "judge.server")
    server = VLLMServer(model_dir, options, name="vllm-judge", served_name=llm.model,
                        log_path=Path(options.log_dir or Path(plan.run.out_dir) / "servers") / "vllm-judge.log")
    server.start()
    llm.urls = [f"{server.url}/v1"]
    return [server]


# ----- the config groups' schemas -----
def _judge_schema(kind: str) -> dict[str, Any]:
    """judge=<kind>: JudgeConfig's keys this type takes, and the LLM judge's options for llm / ensemble."""
    if kind == "none":
        return {"type": "none"}
    skip = ("llm",) + tuple(k for k, kinds in TYPE_KEYS.items() if kind not in kinds)
    own = {**defaults_node(JudgeConfig, exclude=skip), "type": kind}
    return {**defaults_node(LLMJudgeConfig), **own} if kind in LLM_TYPES else own


def group_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(group, schema name) -> the schema node: every option of that group choice with its dataclass default. A group
    file extends its schema through its defaults list (`defaults: [<name>, _self_]`)."""
    out: dict[tuple[str, str], dict[str, Any]] = {
        ("", "launch_defaults"): {
            "run": defaults_node(RunSettings),
            "loop": defaults_node(LoopConfig, exclude=("seed",)),  # run.seed
            # greedy: evaluation's loop.eval_greedy; seed: the runner's, one per episode turn
            # (rollout.episodes.runner.turn_sampling)
            "sampling": defaults_node(SamplingParams, exclude=("greedy", "seed")),
        },
        ("farm", "farm_defaults"): defaults_node(FarmConfig),
        ("reward", "reward_defaults"): defaults_node(RewardConfig),
    }
    for kind, cls in POLICY_CONFIGS.items():
        out[("policy", f"{kind}_defaults")] = {"type": kind, **defaults_node(cls, POLICY_EXCLUDE.get(kind, ()))}
    for backend, (cls, _) in TRAINER_BACKENDS.items():
        out[("trainer", f"{backend}_defaults")] = {"backend": backend, **defaults_node(cls, TRAINER_EXCLUDE)}
    for kind in JUDGE_TYPES:
        out[("judge", f"{kind}_defaults")] = _judge_schema(kind)
    for name in envs.names():
        out[("env", f"{name}_defaults")] = env_schema(name)
    out[("env", f"{MIX}_defaults")] = defaults_node(MixSources)
    return out


def env_schema(name: str) -> dict[str, Any]:
    """The env group's schema for env `name`: the launcher's keys, then the env's constructor options. A plugin env
    whose class cannot be imported here gets the launcher's keys only (the error comes when a run makes it)."""
    try:
        options = env_option_defaults(envs.env_class(name))
    except envs.PluginLoadError:
        options = {}
    return {**defaults_node(TaskSources), "name": name, **options}


_registered = False


def register_schemas() -> None:
    """Store every group's schema in Hydra's ConfigStore (once per process); an env without configs/env/<name>.yaml (a
    plugin) gets its schema as its group file, so `env=<plugin> env.<option>=...` works."""
    global _registered
    if _registered:
        return
    cs = ConfigStore.instance()
    for (group, name), node in group_schemas().items():
        cs.store(group=group or None, name=name, node=node)
        if group == "env" and not (CONFIG_DIR / "env" / f"{node['name']}.yaml").exists():
            cs.store(group="env", name=node["name"], node=node)
    _registered = True


def compose_launch_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The launcher's config, composed by Hydra as `python -m rollout.launch <overrides>` composes it (the documented
    `key={...}` forms of free-form options included)."""
    register_schemas()
    args = open_dict_overrides(list(overrides))
    if GlobalHydra.instance().is_initialized():  # inside the launcher's Hydra app (experiments, the dry run)
        return compose(config_name="launch", overrides=args)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="launch", overrides=args)


__all__ = [
    "BUILTIN_FAMILIES", "CONFIG_DIR", "ENV_LAUNCH_KEYS", "MIX", "MixSetup", "MixSources", "build_farm", "check_directive",
    "check_reference_teacher", "check_topk_trainer", "compose_launch_config", "EnvSetup", "family_env_config", "plan_family_farms", "plan_mix", "NoTrainer", "PolicyPlan", "RunPlan", "RunSettings", "TaskSources",
    "TrainerPlan", "build_policy_and_trainer", "build_served_policy", "build_server_policy", "build_trainer",
    "env_option_defaults", "start_judge_servers",
    "planned_model_config",
    "env_schema", "group_schemas", "plan_env", "plan_judge", "plan_policy", "plan_reward", "plan_run", "plan_run_settings",
    "plan_settings", "plan_trainer", "register_schemas",
]
