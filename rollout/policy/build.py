"""The local policy (`policy=local`): a tiny Qwen3 warm-started on the env's demonstrations (cached on disk).

`build_local_policy(options, families, seed)` is the `local` branch of rollout.build: the demonstrations (each family
env's `demonstration(task, **options)` hook, on an env built with the run's own settings; env=mix: every family that
has one, one tokenizer over all), the warm start (train.warmstart) or, for envs without demonstrations, an untrained
tiny model; then the LocalPolicy serving a copy of the weights.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections import Counter
from dataclasses import asdict, dataclass, field
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import envs
from envs.base import HINT_SIGNALS, implements
from envs.cache import cache_dir
from prm.hints import step_rule_hint, with_hint
from rollout.policy.local_config import LocalPolicyOptions
from train.config import SFTConfig, WarmStartConfig

log = logging.getLogger(__name__)


def demonstrations(
    env_name: str, env_kwargs: dict[str, Any], tasks: list[dict], limit: int, options: dict[str, Any] | None = None
) -> list[tuple[dict, list[dict]]]:
    """(task, reference conversation) for the first `limit` tasks that have one, from an env built with the run's own
    settings (its tools and prompts); `options` go to `env.demonstration(task, **options)` (e.g. toolcall chain tasks'
    `noise`). Tasks without one (envs.NoDemonstration: e.g. OSWorld's own, which come without a solution) are left
    out, in one line."""
    if not implements(envs.env_class(env_name), "demonstration"):
        return []
    env = envs.make(env_name, **env_kwargs)
    out: list[tuple[dict, list[dict]]] = []
    without: list[str] = []
    try:
        for t in tasks[:limit]:
            try:
                out.append((t, with_written_hints(env.demonstration(t, **(options or {})))))
            except envs.NoDemonstration:
                without.append(str(t.get("id")))
    finally:
        env.close()
    if without:
        log.warning("warm start: %d %s tasks have no demonstration and are left out of it: %s%s", len(without),
                    env_name, ", ".join(without[:8]), " ..." if len(without) > 8 else "")
    return out


def with_written_hints(conversation: list[dict]) -> list[dict]:
    """The conversation with each `HINT_SIGNALS` message's hint written in: the rule judge's hint from those signals
    (`prm.hints.step_rule_hint`: a wrong or a right step's), appended as the teacher's context has it
    (`prm.hints.with_hint`). Unchanged without any."""
    if not any(HINT_SIGNALS in m for m in conversation):
        return conversation
    out = []
    for i, m in enumerate(conversation):
        if HINT_SIGNALS in m:
            hint = step_rule_hint(m[HINT_SIGNALS], "directive")  # a wrong step's hint, else a right step's
            if not hint:
                raise ValueError(f"demonstration message {i}: its hint signals {m[HINT_SIGNALS]} give no hint")
            m = with_hint([{k: v for k, v in m.items() if k != HINT_SIGNALS}], hint)[0]
        out.append(m)
    return out


def demonstration_label_counts(env_name: str, tasks: list[dict], convs: list[list[dict]]) -> dict[int, Counter]:
    """Per assistant-turn index, how many conversations had each step label (envs with `demonstration_labels`)."""
    cls = envs.env_class(env_name)
    if not implements(cls, "demonstration_labels"):
        return {}
    labeler = cls.demonstration_labels
    counts: dict[int, Counter] = {}
    for task, conv in zip(tasks, convs):
        for i, label in enumerate(labeler(task, conv) or []):
            counts.setdefault(i, Counter())[label] += 1
    return counts


def label_rates(counts: Mapping[int, Counter]) -> dict[int, dict[str, float]]:
    return {i: {k: n / sum(c.values()) for k, n in sorted(c.items())} for i, c in sorted(counts.items())}


def demonstration_label_rates(env_name: str, tasks: list[dict], convs: list[list[dict]]) -> dict[int, dict[str, float]]:
    """Per assistant-turn index, the fraction of each step label (envs with `demonstration_labels`, else {})."""
    return label_rates(demonstration_label_counts(env_name, tasks, convs))


class DemoFamily(Protocol):
    """What the warm start needs of one env family (rollout.build.EnvSetup has it)."""

    family: str
    name: str
    kwargs: dict[str, Any]
    train_tasks: list[dict]


#: the keys of a family's entry in a warm-start stage's `families` map
FAMILY_STAGE_KEYS = ("max_conversations", "offset", "demonstrations", "repeat")
#: the keys of an entry of `policy.warm_start.stages`
STAGE_KEYS = ("name", "max_conversations", "offset", "demonstrations", "sft", "families")


@dataclass(frozen=True)
class DemoShare:
    """One family's part of one SFT stage: `limit` demonstrations of its training tasks from `offset`, made with
    `options` (env.demonstration(task, **options)), each conversation trained `repeat` times."""

    limit: int
    offset: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    repeat: int = 1


def stage_shares(families: Sequence[DemoFamily], stage: Mapping[str, Any], where: str) -> dict[str, DemoShare]:
    """Each family's share of one SFT stage: the stage's `max_conversations`, `offset` and `demonstrations`, with the
    family's entry of the stage's `families` map over them (env=mix: e.g. the tool-call chain's noise is
    `{rates: [...]}`, the GUI's `{rate: ...}`; a family's `max_conversations: 0` leaves it out of the stage).
    `demonstrations` are merged key by key (the family's win); `repeat` is the family's alone (default 1)."""
    per = dict(stage.get("families") or {})
    names = [f.family for f in families]
    unknown = sorted(set(per) - set(names))
    if unknown:
        raise ValueError(f"{where}.families names {unknown}, which are not families of this run: {names}")
    out = {}
    for fam in families:
        entry = dict(per.get(fam.family) or {})
        bad = sorted(set(entry) - set(FAMILY_STAGE_KEYS))
        if bad:
            raise ValueError(f"{where}.families.{fam.family}: unknown keys {bad}; known: "
                             f"{', '.join(FAMILY_STAGE_KEYS)}")
        share = DemoShare(limit=int(entry.get("max_conversations", stage.get("max_conversations", 0))),
                          offset=int(entry.get("offset", stage.get("offset", 0))),
                          options={**(stage.get("demonstrations") or {}), **(entry.get("demonstrations") or {})},
                          repeat=int(entry.get("repeat", 1)))
        if share.limit < 0 or share.offset < 0 or share.repeat < 1:
            raise ValueError(f"{where}.families.{fam.family}: max_conversations and offset >= 0, repeat >= 1; got "
                             f"{share.limit}, {share.offset}, {share.repeat}")
        out[fam.family] = share
    return out


def family_demonstrations(families: Sequence[DemoFamily], shares: Mapping[str, DemoShare],
                          ) -> tuple[list[list[dict]], list[dict], dict[str, int]]:
    """Every family's demonstrations of one stage (`shares`: see stage_shares): the conversations (each family's
    repeated `repeat` times), the tasks they solve (aligned with them), and how many each family gave (its
    conversations, repeats counted; 0: its env has no demonstration() or its share is 0)."""
    convs: list[list[dict]] = []
    tasks: list[dict] = []
    per_family: dict[str, int] = {}
    for fam in families:
        share = shares[fam.family]
        chosen = fam.train_tasks[share.offset: share.offset + share.limit]
        got = demonstrations(fam.name, fam.kwargs, chosen, share.limit, share.options) if chosen else []
        convs += [conv for _, conv in got] * share.repeat
        tasks += [task for task, _ in got] * share.repeat
        per_family[fam.family] = len(got) * share.repeat
    return convs, tasks, per_family


def family_label_rates(families: Sequence[DemoFamily], convs: list[list[dict]], tasks: list[dict],
                       counts: dict[str, int]) -> dict[int, dict[str, float]]:
    """Step-label rates of the demonstrations, `tasks` aligned with `convs` and `counts` their families' shares in
    order (family_demonstrations): one family's envs' labels; a mix: the labelled conversations of every family that
    labels them, pooled per step (a label's rate is over all of them)."""
    pooled: dict[int, Counter] = {}
    start = 0
    for fam in families:
        n = counts.get(fam.family, 0)
        for i, c in demonstration_label_counts(fam.name, tasks[start: start + n], convs[start: start + n]).items():
            pooled.setdefault(i, Counter()).update(c)
        start += n
    return label_rates(pooled)


def stage_demonstrations(families: Sequence[DemoFamily], stage: Mapping[str, Any], where: str,
                         ) -> tuple[list[list[dict]], dict[str, int], dict[int, dict[str, float]]]:
    """One SFT stage's conversations, each family's count and their step-label rates."""
    convs, tasks, counts = family_demonstrations(families, stage_shares(families, stage, where))
    return convs, counts, family_label_rates(families, convs, tasks, counts)


def build_local_policy(options: LocalPolicyOptions, families: Sequence[DemoFamily], seed: int = 0):
    """(policy, trainable model copy, tokenizer, summary dict) for `policy=local`; `seed` is the run's. The warm start
    uses the demonstrations of every family that has them (env=mix: one tokenizer and one SFT over all of them)."""
    # torch and transformers: imported only when a run builds the model (the launcher and its dry run stay light)
    from rollout.policy.local import LocalPolicy
    from train.tiny import build_model, build_tokenizer, render_chat, tiny_qwen3_config
    from train.warmstart import SFTStage, warm_start

    if options.num_threads:  # before the warm start too: on a busy CPU extra OpenMP threads slow SFT many-fold
        import torch

        torch.set_num_threads(int(options.num_threads))
    ws = options.warm_start
    seed_sft = seed if ws.seed is None else int(ws.seed)  # a fixed SFT start shared by runs of different seeds
    model_cfg = asdict(options.model)
    digits = options.tokenizer.digits
    limit = ws.max_conversations
    first = {"max_conversations": limit, "demonstrations": ws.demonstrations, "families": ws.families}
    convs, per_family, first_labels = stage_demonstrations(families, first, "policy.warm_start")
    without = [f.family for f in families if not per_family.get(f.family)]
    if ws.enabled and without and convs:
        log.warning("local policy: families %s have no demonstrations; the warm start uses the others'", without)
    skipped = None
    if ws.enabled and not convs:
        # a minimal plugin (reset, step, close, tasks) runs under the default command: RL from an untrained tiny model
        names = ", ".join(repr(f.name) for f in families)
        if any(implements(envs.env_class(f.name), "demonstration") for f in families):
            skipped = (f"none of the training tasks of env {names} has a demonstration (e.g. OSWorld's own tasks), "
                       "so the tiny model starts untrained")
        else:
            skipped = (f"env {names} has no demonstration(task) method, so the tiny model starts untrained (add "
                       "demonstration() to the env for an SFT start)")
        log.warning("local policy: warm start skipped: %s", skipped)
    if ws.enabled and convs:
        stages, labels = [], {"sft": first_labels}
        for i, st in enumerate(ws.stages):
            where = f"policy.warm_start.stages.{i}"
            bad = sorted(set(st) - set(STAGE_KEYS))
            if bad:
                raise ValueError(f"{where}: unknown keys {bad}; known: {', '.join(STAGE_KEYS)}")
            name = str(st.get("name") or f"stage{i + 1}")
            stage_convs, _, labels[name] = stage_demonstrations(
                families, {"max_conversations": limit, **st}, where)
            stages.append(SFTStage(stage_convs, SFTConfig(**{**st.get("sft", {}), "seed": seed_sft}), name))
        sft = SFTConfig(**{**asdict(ws.sft), "seed": seed_sft})
        wcfg = WarmStartConfig(**model_cfg, digits=digits, seed=seed_sft, sft=sft)
        cache = Path(ws.cache_dir).expanduser() if ws.cache_dir else cache_dir("warmstart")
        with _torch_threads(ws.num_threads):
            model, tokenizer, info = warm_start(convs, wcfg, cache, stages)
        summary = {
            "cache": "hit" if info.cache_hit else "trained",
            "seconds": round(info.seconds, 1),
            "params": info.params,
            "conversations": sum(s.get("conversations", 0) for s in info.stages) or info.conversations,
            **({"conversations per family": per_family} if len(families) > 1 else {}),
            "final SFT loss": info.sft.get("final_loss"),
            # written to warm_start.json by the launcher (not printed): what the SFT saw and did, stage by stage
            "_details": {"path": info.path, "key": info.key, "stages": info.stages, "demonstration_labels": labels,
                         "train_seconds": info.train_seconds, "vocab_size": info.vocab_size},
        }
    else:
        texts = [render_chat(c) for c in convs] or [str(t) for f in families for t in f.train_tasks]
        tokenizer = build_tokenizer(texts, vocab_size=int(model_cfg.pop("vocab_size")), digits=digits)
        config = tiny_qwen3_config(len(tokenizer), **model_cfg, pad_token_id=tokenizer.pad_token_id,
                                   eos_token_id=tokenizer.eos_token_id)
        model = build_model(config, seed=seed_sft)
        summary = {"cache": "off (random init)", "params": sum(p.numel() for p in model.parameters())}
        if skipped:
            summary["skipped"] = skipped  # in warm_start.json and the run summary
    if options.vision.enabled:
        model, processor = vision_policy_model(model, tokenizer, options, seed_sft)
        summary["vision"] = (f"tiny Qwen3-VL: {sum(p.numel() for p in model.parameters())} params, up to "
                             f"{options.vision.max_images} screenshot(s) per prompt at <= "
                             f"{options.vision_tower.max_pixels} pixels")
        policy = LocalPolicy(copy.deepcopy(model), processor.tokenizer, options.policy_config(seed), vision=processor)
        log.info("local policy: %s", summary)
        return policy, model, processor, summary  # the trainer exports the processor with the weights
    policy = LocalPolicy(copy.deepcopy(model), tokenizer, options.policy_config(seed))
    log.info("local policy: %s", summary)
    return policy, model, tokenizer, summary


@contextlib.contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `n` inside (None: unchanged), the previous count restored after."""
    import torch

    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def vision_policy_model(text_model: Any, tokenizer: Any, options: LocalPolicyOptions, seed: int):
    """(the tiny Qwen3-VL, its VisionProcessor): the warm-started text model as its language model, a freshly
    initialized vision tower, the tokenizer with the vision tokens added."""
    from train.tiny import tiny_image_processor, tiny_qwen3vl_config, vision_model_from_text, vision_tokenizer
    from train.vision import VisionProcessor

    vl_tokenizer = vision_tokenizer(tokenizer)
    config = tiny_qwen3vl_config(text_model.config, vl_tokenizer, options.vision_tower)
    model = vision_model_from_text(text_model, config, seed=seed)
    processor = VisionProcessor(vl_tokenizer, tiny_image_processor(options.vision_tower), options.vision)
    return model, processor
