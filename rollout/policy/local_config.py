"""Options of the in-process policy: `LocalPolicyConfig` (the LocalPolicy itself, any HF causal LM) and
`LocalPolicyOptions` (the launcher's `policy=local` group: the tiny Qwen3 built from config, its tokenizer and its SFT
warm start). Importable without torch: the launcher registers their defaults as the group's schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from train.config import SFTConfig, TinyModelConfig, TinyVisionConfig, VisionConfig


@dataclass
class LocalPolicyConfig:
    max_batch: int = 64  # requests per sampler call
    max_prompt_tokens: int = 1536  # longer prompts are left-truncated (the system turn is kept when it fits) ...
    truncate_prompts: bool = True  # ... or, when False, rejected with a ValueError
    seed: int = 0  # seeds the sampler's torch.Generator
    device: str = "cpu"
    num_threads: int | None = None  # torch intra-op threads; 1 is fastest for tiny models on a busy shared CPU

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")


@dataclass
class TokenizerOptions:
    digits: str = "single"  # single: every digit its own token (Qwen's rule) | runs: BPE learns whole numbers


@dataclass
class WarmStartOptions:
    """SFT on the env's demonstrations before RL (cached on disk, keyed by everything that shapes the result)."""

    enabled: bool = True  # false: RL from a randomly initialized tiny model
    max_conversations: int = 2000  # demonstrations drawn from the training tasks
    demonstrations: dict[str, Any] = field(default_factory=dict)  # options of env.demonstration(task, **options)
    # null: <cache root>/warmstart ($NEXTSTATE_CACHE, else /var/cache/nextstate as root, else ~/.cache/nextstate)
    cache_dir: str | None = None
    seed: int | None = None  # model init + SFT order; None: run.seed (a fixed value shares one start across seeds)
    # torch threads while the start trains (then back to the policy's num_threads); None: the policy's. 2 on an idle
    # 2-core machine: 1.5x faster SFT (measured); an experiment builds its starts before any run starts
    num_threads: int | None = None
    sft: SFTConfig = field(default_factory=SFTConfig)  # its seed is `seed` above
    # env=mix: a family's own share of this first stage, over the values above: family -> {max_conversations, offset
    # (into its train tasks), demonstrations (merged over the shared ones, key by key), repeat (each of its
    # conversations this many times: its own passes in one shared SFT)}; a family it does not name takes the shared
    # values (rollout.policy.build.stage_shares)
    families: dict[str, Any] = field(default_factory=dict)
    # further SFT passes from the previous weights, each its own cache entry:
    # [{name, max_conversations, offset (into the train tasks), demonstrations: {...}, sft: {...}, families: {...}}]
    stages: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class LocalPolicyOptions(LocalPolicyConfig):
    """`policy=local`: a tiny Qwen3-architecture model built from this config (no download), its tokenizer trained on
    the env's demonstrations, warm-started by SFT on them, served in process with dynamic batching. `seed` is run.seed."""

    # torch intra-op threads of this process (SFT, sampling, the torch trainer): on a busy 2-core machine 2 threads
    # made the tiny model's SFT 6-12x slower (LocalPolicyConfig leaves torch's default for other models)
    num_threads: int | None = 1
    model: TinyModelConfig = field(default_factory=TinyModelConfig)
    tokenizer: TokenizerOptions = field(default_factory=TokenizerOptions)
    warm_start: WarmStartOptions = field(default_factory=WarmStartOptions)
    # vision.enabled: a tiny Qwen3-VL (the warm-started text model + a vision tower of `vision_tower`'s shape) that
    # sees the observations' screenshots (GUI); its prompts show the latest `vision.max_images` of them
    vision: VisionConfig = field(default_factory=VisionConfig)
    vision_tower: TinyVisionConfig = field(default_factory=TinyVisionConfig)

    def policy_config(self, seed: int) -> LocalPolicyConfig:
        """The LocalPolicy's own options (this group's top-level keys) with the run's seed."""
        return LocalPolicyConfig(max_batch=self.max_batch, max_prompt_tokens=self.max_prompt_tokens,
                                 truncate_prompts=self.truncate_prompts, seed=seed, device=self.device,
                                 num_threads=self.num_threads)
