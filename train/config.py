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
    # weight of a second loss term, the mean cross-entropy on every other token (observations, the task, the system
    # prompt): > 0 also trains the model to predict what it reads, whose repeated values (a task line in every
    # observation) teach it to copy within fewer steps than the assistant tokens alone (GUI multistep, measured)
    context_loss_weight: float = 0.0
    min_lr_ratio: float = 0.1  # cosine decay from lr to lr * min_lr_ratio over the run
    grad_clip: float = 1.0
    max_seq_len: int = 2048  # longer conversations are cut at the right
    bf16: bool = False  # autocast the forward to bfloat16 (the loss is computed in float32)
    seed: int = 0
    progress: bool = True  # a tqdm bar on stderr

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # type: ignore[assignment]  # configs pass a list
        if self.epochs < 1 or self.batch_tokens < 1 or self.lr <= 0 or self.context_loss_weight < 0:
            raise ValueError("SFTConfig needs epochs >= 1, batch_tokens >= 1, lr > 0 and context_loss_weight >= 0, "
                             f"got {self}")


def sft_cache_fields(cfg: SFTConfig) -> dict[str, Any]:
    """What of an SFT config decides its result (the progress bar does not; a context loss of 0, the default before
    the option existed, is left out so those cache keys stay)."""
    d = asdict(cfg)
    d.pop("progress", None)
    if not d["context_loss_weight"]:
        d.pop("context_loss_weight")
    return d


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
class VisionConfig:
    """How a vision-language policy shows observations to its model (`policy.vision.*`; train/vision.py)."""

    enabled: bool = False  # true: the policy sees the screenshots (a vision-language model); false: text only
    max_images: int = 1  # screenshots kept in the prompt: the latest observations' (older turns keep their text)

    def __post_init__(self) -> None:
        if self.max_images < 1:
            raise ValueError(f"vision.max_images must be >= 1, got {self.max_images}")


@dataclass
class TinyVisionConfig:
    """The tiny Qwen3-VL vision tower (train.tiny.tiny_qwen3vl_config), on top of the tiny text model."""

    depth: int = 2
    hidden_size: int = 64
    num_heads: int = 2
    intermediate_size: int = 128
    patch_size: int = 8  # pixels per patch side (Qwen3-VL: 16); merged 2 x 2 into one token
    deepstack_layers: tuple[int, ...] = (1,)  # vision layers whose features are added to early text layers
    # a screenshot is resized to at most max_pixels (1280x800 -> 128x80: 160 patches, 40 tokens); its image processor
    # keeps the setting (preprocessor_config.json), as a real model's does
    max_pixels: int = 128 * 80
    min_pixels: int = 32 * 32

    def __post_init__(self) -> None:
        self.deepstack_layers = tuple(self.deepstack_layers)  # type: ignore[assignment]
        if not 1 <= self.min_pixels <= self.max_pixels:
            raise ValueError(f"vision_tower needs 1 <= min_pixels <= max_pixels, got {self}")


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
        d["sft"] = sft_cache_fields(self.sft)
        if d["digits"] == "single":  # the default before the option existed: keeps those cache keys
            d.pop("digits")
        return d


PLACEMENT_STRATEGIES = ("PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD")  # Ray placement group strategies
DP_MODES = ("ddp", "fsdp")


MEGATRON_ATTENTION = ("local", "fused", "te")  # trainer.attention of trainer=megatron (train/backends/megatron_model.py)
RECOMPUTE_GRANULARITY = ("none", "selective", "full")  # trainer.recompute_granularity of trainer=megatron
OLD_LOGPROBS = ("rollout", "recompute")  # where a backend takes the PPO ratio's old logprobs from (`trainer.old_logprobs`)


def check_old_logprobs(value: str) -> None:
    if value not in OLD_LOGPROBS:
        raise ValueError(f"trainer.old_logprobs={value!r}: use one of {', '.join(OLD_LOGPROBS)}")


@dataclass
class RankOptions:
    """Where a trainer's ranks run (both backends). A world of one rank trains in the launcher's process; more ranks
    (dp_size x tp_size x pp_size) run as a Ray actor group in one placement group (rollout/trainer_group.py)."""

    dp_size: int = 1  # data-parallel ranks: each takes its share of every batch, gradients are summed over them
    rank_num_cpus: float = 1.0  # CPUs reserved per rank in the placement group (each rank also gets a GPU on cuda)
    placement_strategy: str = "PACK"  # Ray's: PACK | STRICT_PACK (one node: TP over NVLink) | SPREAD | STRICT_SPREAD

    def _check_ranks(self) -> None:
        if self.dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {self.dp_size}")
        if self.rank_num_cpus < 0:
            raise ValueError(f"rank_num_cpus must be >= 0, got {self.rank_num_cpus}")
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(
                f"placement_strategy={self.placement_strategy!r}: use one of {', '.join(PLACEMENT_STRATEGIES)}"
            )


@dataclass
class MemoryBudget:
    """What `run.dry_run=true` checks a trainer rank's modelled GPU memory against (train/memory_plan.py), both
    backends. The estimate's worst micro-batch is rows of the longest sample: `max_sample_tokens` (None: one sample of
    micro_batch_tokens; a server policy's context length, e.g. 16384, is the honest value)."""

    # GiB per GPU (nvidia-smi's MiB / 1024: an 80 GB H100 is 80, an H200 141); None: the visible GPU's (torch.cuda),
    # and no check on a machine without one
    gpu_memory_gb: float | None = None
    max_sample_tokens: int | None = None

    def _check_budget(self) -> None:
        if self.gpu_memory_gb is not None and self.gpu_memory_gb <= 0:
            raise ValueError(f"gpu_memory_gb must be > 0, got {self.gpu_memory_gb}")
        if self.max_sample_tokens is not None and self.max_sample_tokens < 2:
            raise ValueError(f"max_sample_tokens must be >= 2, got {self.max_sample_tokens}")


@dataclass
class TorchTrainerConfig(MemoryBudget, RankOptions):
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
    device: str = "auto"  # "auto" (cuda if available) | "cpu" | "cuda": where the trainer's copy of the model trains
    # dp_size > 1: "ddp" (torch DistributedDataParallel: a full replica per rank) | "fsdp" (torch FSDP2: parameters,
    # gradients and optimizer state sharded over the ranks, so a 7-8B model fits a node's GPUs)
    dp_mode: str = "ddp"
    # the PPO ratio's old logprobs: "rollout" (recorded by the sampler) | "recompute" (this trainer's forward before
    # the update: one more forward pass, and an update that does not depend on how the policy batched its requests)
    old_logprobs: str = "rollout"
    # recompute each decoder layer's activations in backward (HF gradient checkpointing, non-reentrant): only the
    # layers' inputs are kept, what a 16k-token sample of a 4-8B model needs to fit one GPU
    gradient_checkpointing: bool = False

    @property
    def world_size(self) -> int:
        return self.dp_size

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # type: ignore[assignment]  # configs may pass a list
        self._check_ranks()
        self._check_budget()
        check_old_logprobs(self.old_logprobs)
        if self.dp_mode not in DP_MODES:
            raise ValueError(f"dp_mode={self.dp_mode!r}: use one of {', '.join(DP_MODES)}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device={self.device!r}: use 'auto', 'cpu' or 'cuda'")
        if self.ppo_epochs < 1 or self.minibatches < 1:
            raise ValueError(f"ppo_epochs and minibatches must be >= 1, got {self.ppo_epochs}, {self.minibatches}")
        if self.micro_batch_tokens < 1 or self.temperature <= 0:
            raise ValueError("micro_batch_tokens must be >= 1 and temperature > 0")

    @property
    def loss(self) -> LossConfig:
        return LossConfig(clip_low=self.clip_low, clip_high=self.clip_high, kl_coef=self.kl_coef)


@dataclass
class MegatronTrainerConfig(MemoryBudget, RankOptions):
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
    tp_size: int = 1  # tensor-parallel ranks per model replica (the world is tp_size x dp_size x pp_size ranks)
    pp_size: int = 1  # pipeline stages: only 1 for now
    device: str = "auto"  # "auto" (cuda if available) | "cpu" | "cuda"
    optimizer: str = "auto"  # "auto" (megatron on cuda, torch on cpu) | "torch" | "megatron"
    old_logprobs: str = "rollout"  # as TorchTrainerConfig.old_logprobs
    # the layers' attention (train/backends/megatron_model.py): "local" (megatron's unfused DotProductAttention: keeps
    # the [heads, s, s] scores of every layer) | "fused" (torch's scaled_dot_product_attention, causal per sample) |
    # "te" (megatron's TransformerEngine spec; needs transformer_engine)
    attention: str = "local"
    # megatron's activation recompute: "none" | "selective" (each layer's core attention is recomputed in backward:
    # its s x s softmax is never kept) | "full" (whole layers: only each chunk's input is kept)
    recompute_granularity: str = "none"
    recompute_method: str = "uniform"  # full only: "uniform" (chunks of recompute_num_layers) | "block" (first N layers)
    recompute_num_layers: int = 1  # full only: layers per chunk (uniform) or layers recomputed (block)
    # megatron's distributed optimizer: fp32 main weights and Adam moments sharded over the DP ranks (needs
    # optimizer=megatron, i.e. a GPU: megatron's optimizer allocates on cuda)
    use_distributed_optimizer: bool = False

    @property
    def world_size(self) -> int:
        return self.tp_size * self.dp_size * self.pp_size

    def __post_init__(self) -> None:
        self.betas = tuple(float(b) for b in self.betas)  # type: ignore[assignment]
        check_old_logprobs(self.old_logprobs)
        self._check_ranks()
        self._check_budget()
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")
        if self.pp_size != 1:
            raise ValueError(
                "pp_size > 1 is not supported yet by the megatron backend (no pipeline schedule is wired in): use "
                "tp_size and dp_size"
            )
        if self.optimizer not in ("auto", "torch", "megatron"):
            raise ValueError(f"optimizer={self.optimizer!r}: use 'auto', 'torch' or 'megatron'")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.ppo_epochs < 1 or self.minibatches < 1:
            raise ValueError(f"ppo_epochs and minibatches must be >= 1, got {self.ppo_epochs}, {self.minibatches}")
        if self.micro_batch_tokens < 2:
            raise ValueError(f"micro_batch_tokens must be >= 2, got {self.micro_batch_tokens}")
        if self.attention not in MEGATRON_ATTENTION:
            raise ValueError(f"attention={self.attention!r}: use one of {', '.join(MEGATRON_ATTENTION)}")
        if self.recompute_granularity not in RECOMPUTE_GRANULARITY:
            raise ValueError(f"recompute_granularity={self.recompute_granularity!r}: use one of "
                             f"{', '.join(RECOMPUTE_GRANULARITY)}")
        if self.recompute_method not in ("uniform", "block") or self.recompute_num_layers < 1:
            raise ValueError("recompute_method must be 'uniform' or 'block' and recompute_num_layers >= 1, got "
                             f"{self.recompute_method!r}, {self.recompute_num_layers}")
        if self.use_distributed_optimizer and self.optimizer == "torch":
            raise ValueError("use_distributed_optimizer=true is megatron's optimizer: set optimizer='megatron' or "
                             "'auto' (a GPU)")

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
