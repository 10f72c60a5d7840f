"""The train layer's options as dataclasses (loss, SFT, the tiny model, the trainer backends), importable without
torch or megatron-core: the launcher registers their defaults as its config schemas (rollout.config), and the modules
that do the work (train.loss, train.sft, train.warmstart, train.backends.*) take them. Each dataclass owns its defaults;
a YAML group under configs/ sets only what differs (docs/architecture.md, "Defaults").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from envs.options import from_options


@dataclass(frozen=True)
class LossConfig:
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.01
    # samples whose every token is masked contribute nothing (they are counted in metrics)


@dataclass
class SFTConfig:
    epochs: int = 3
    lr: float = 5e-3  # a from-scratch tiny model wants a large lr; a pretrained one ~1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    # padded tokens (rows x longest row) per optimizer step. Small batches: copying numbers from the question / tool
    # output is learned after enough optimizer steps, not enough tokens (measured on the toolcall demonstrations).
    batch_tokens: int = 1024
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1  # cosine decay from lr to lr * min_lr_ratio over the run
    grad_clip: float = 1.0
    max_seq_len: int = 2048  # longer conversations are cut at the right
    bf16: bool = False  # autocast the forward to bfloat16 (the loss is computed in float32)
    seed: int = 0
    progress: bool = True  # a tqdm bar on stderr

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # type: ignore[assignment]  # configs pass a list
        if self.epochs < 1 or self.batch_tokens < 1 or self.lr <= 0:
            raise ValueError(f"SFTConfig needs epochs >= 1, batch_tokens >= 1 and lr > 0, got {self}")


@dataclass
class TinyModelConfig:
    """The shape of the tiny Qwen3 built locally (train.tiny.tiny_qwen3_config)."""

    vocab_size: int = 1024  # upper bound; the model gets exactly the tokenizer's size
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True


@dataclass
class WarmStartConfig(TinyModelConfig):
    """The tiny model's shape, its tokenizer's digit rule, the seed and the first SFT stage."""

    digits: str = "single"  # tokenizer: "single" (a token per digit, Qwen's rule) | "runs" (BPE learns whole numbers)
    seed: int = 0
    sft: SFTConfig = field(default_factory=SFTConfig)

    def __post_init__(self) -> None:
        if isinstance(self.sft, Mapping):  # from a config file
            self.sft = SFTConfig(**self.sft)

    def cache_fields(self) -> dict[str, Any]:
        """What decides the result (display-only settings such as the progress bar are left out)."""
        d = asdict(self)
        d["sft"].pop("progress", None)
        if d["digits"] == "single":  # the default before the option existed: keeps those cache keys
            d.pop("digits")
        return d


OLD_LOGPROBS = ("rollout", "recompute")  # where a backend takes the PPO ratio's old logprobs from (`trainer.old_logprobs`)


def check_old_logprobs(value: str) -> None:
    if value not in OLD_LOGPROBS:
        raise ValueError(f"trainer.old_logprobs={value!r}: use one of {', '.join(OLD_LOGPROBS)}")


@dataclass
class TorchTrainerConfig:
    # the launcher's default policy is the tiny local model, which needs a much larger step than the paper's 1e-6
    # (for 4B-32B models; the GPU experiment configs set it)
    lr: float = 2e-4
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; <= 0 disables clipping
    micro_batch_tokens: int = 4096  # padded tokens (rows x longest row) per forward/backward
    bf16: bool = False  # autocast the forward to bfloat16 (logprobs are computed in float32)
    kl_coef: float = 0.01  # k3 KL to the initial model; 0 skips the reference model entirely
    clip_low: float = 0.2
    clip_high: float = 0.28
    temperature: float = 1.0  # logprobs of logits / temperature, as the sampler computed them
    ppo_epochs: int = 1
    minibatches: int = 1  # optimizer steps per epoch (the batch is split into this many parts)
    # the PPO ratio's old logprobs: "rollout" (recorded by the sampler) | "recompute" (this trainer's forward before
    # the update: one more forward pass, and an update that does not depend on how the policy batched its requests)
    old_logprobs: str = "rollout"

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # type: ignore[assignment]  # configs may pass a list
        check_old_logprobs(self.old_logprobs)
        if self.ppo_epochs < 1 or self.minibatches < 1:
            raise ValueError(f"ppo_epochs and minibatches must be >= 1, got {self.ppo_epochs}, {self.minibatches}")
        if self.micro_batch_tokens < 1 or self.temperature <= 0:
            raise ValueError("micro_batch_tokens must be >= 1 and temperature > 0")

    @property
    def loss(self) -> LossConfig:
        return LossConfig(clip_low=self.clip_low, clip_high=self.clip_high, kl_coef=self.kl_coef)


@dataclass
class MegatronTrainerConfig:
    model_path: str | None = None  # HF model directory (config.json + weights); None: build from `model_config`
    model_config: dict[str, Any] | None = None  # Qwen3Config kwargs, used when model_path is None
    seed: int = 0  # initial weights when built from config
    lr: float = 2e-4  # as TorchTrainerConfig: the tiny default policy's; the paper's 1e-6 is for 4B-32B models
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.01  # k3 KL to the frozen initial model; 0 skips the reference model entirely
    temperature: float = 1.0  # the policy's sampling temperature: logprobs are those of softmax(logits / temperature)
    micro_batch_tokens: int = 4096  # padded tokens (samples x longest) per micro-batch
    ppo_epochs: int = 1  # passes over each batch
    minibatches: int = 1  # optimizer steps per pass (the batch is split into this many interleaved parts)
    pad_token_id: int | None = None  # None: the model config's pad_token_id (0 if it has none), as the torch backend
    bf16: bool = False  # GPU only: bf16 model params, fp32 main params in megatron's optimizer
    tp_size: int = 1
    pp_size: int = 1
    device: str = "auto"  # "auto" (cuda if available) | "cpu" | "cuda"
    optimizer: str = "auto"  # "auto" (megatron on cuda, torch on cpu) | "torch" | "megatron"
    old_logprobs: str = "rollout"  # as TorchTrainerConfig.old_logprobs

    def __post_init__(self) -> None:
        self.betas = tuple(float(b) for b in self.betas)  # type: ignore[assignment]
        check_old_logprobs(self.old_logprobs)
        if self.pp_size != 1:
            raise ValueError(
                "pp_size > 1 is not supported yet by the megatron backend (pipeline schedules are phase 2)"
            )
        if self.optimizer not in ("auto", "torch", "megatron"):
            raise ValueError(f"optimizer={self.optimizer!r}: use 'auto', 'torch' or 'megatron'")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.ppo_epochs < 1 or self.minibatches < 1:
            raise ValueError(f"ppo_epochs and minibatches must be >= 1, got {self.ppo_epochs}, {self.minibatches}")
        if self.micro_batch_tokens < 2:
            raise ValueError(f"micro_batch_tokens must be >= 2, got {self.micro_batch_tokens}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> MegatronTrainerConfig:
        """From a config group (configs/trainer/megatron.yaml); `backend` names the group, unknown keys are errors."""
        data = {k: v for k, v in values.items() if k != "backend"}
        if isinstance(data.get("model_config"), Mapping):
            data["model_config"] = dict(data["model_config"])
        return from_options(cls, data, "megatron trainer")

    @property
    def loss(self) -> LossConfig:
        return LossConfig(clip_low=self.clip_low, clip_high=self.clip_high, kl_coef=self.kl_coef)
