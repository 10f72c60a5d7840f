"""MegatronTrainer: the Trainer protocol on a megatron-core GPTModel (Qwen3 architecture), same loss as every backend.

One train_step: pack the batch into right-padded micro-batches within a token budget, compute per-token logprobs of the
shifted targets through `vocab_parallel_cross_entropy`, old logprobs = the rollout's, reference logprobs from a frozen copy
of the initial model (only when kl_coef > 0), `train.loss.policy_loss` (token-mean per sample, then mean over samples),
gradient clipping on the global norm, one AdamW step (weight decay on every parameter, like torch.optim.AdamW).

Two execution paths with the same math:
- optimizer="torch" (the CPU path; CPU needs it): torch.optim.AdamW and our own micro-batch loop; gradients are summed
  over the DP ranks, and the gradient norm is reduced across TP ranks (split parameters summed over ranks, replicated
  ones counted once).
- optimizer="megatron" (default on GPUs): megatron's DistributedDataParallel + `get_megatron_optimizer` (fp32 main
  params, bf16 model params when bf16=True) + `get_forward_backward_func()` (forward_backward_no_pipelining for pp=1).

Data parallelism (dp_size > 1): every rank gets the whole batch and trains its DP shard of it (train/backends/
data_parallel.py); the ranks are started as a Ray actor group by rollout/trainer_group.py.

Weights go out in HF format (`export_weights`, `state_dict`), converted by `megatron_convert`, so a local torch policy or
an SGLang server (update_weights_from_disk) loads them as-is.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import shutil
import time
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from train.backends import Trainer, frozen_reference, with_recomputed_logprobs
from train.backends.megatron_convert import Qwen3Shape, hf_to_megatron, megatron_to_hf
from train.backends.megatron_model import (
    build_gpt_model,
    from_te_keys,
    to_te_keys,
    token_logprobs,
    transformer_config,
)
from train.backends.megatron_parallel import ParallelContext, init_parallel
from train.backends.data_parallel import StepMetrics, combine_steps, mismatch_of, rank_micro_batches
from train.backends.microbatch import MicroBatch, has_loss_tokens, make_micro_batches, minibatch_parts
from train.config import MegatronTrainerConfig
from train.loss import policy_loss
from train.records import TrainSample

log = logging.getLogger(__name__)

CHECKPOINT_MARK = "trainer.json"  # written last: its presence marks a complete checkpoint

#: files copied next to exported weights so the directory is a complete HF model for a policy server
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "generation_config.json",
    "chat_template.jinja",
)


def load_hf_model(cfg: MegatronTrainerConfig, dtype: torch.dtype) -> tuple[Any, dict[str, torch.Tensor]]:
    """(HF config, HF state dict on CPU) from `model_path`, or a fresh Qwen3 built from `model_config` and `seed`."""
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if cfg.model_path:
        hf_config = AutoConfig.from_pretrained(cfg.model_path)
        model = AutoModelForCausalLM.from_pretrained(cfg.model_path, dtype=dtype)
    elif cfg.model_config:
        hf_config = Qwen3Config(**cfg.model_config)
        torch.manual_seed(cfg.seed)
        model = Qwen3ForCausalLM(hf_config).to(dtype)
    else:
        raise ValueError(
            "MegatronTrainerConfig needs model_path (an HF directory) or model_config (Qwen3Config kwargs)"
        )
    return hf_config, {k: v.detach().cpu() for k, v in model.state_dict().items()}


class MegatronTrainer(Trainer):
    """Trainer protocol (train/backends/__init__.py) on megatron-core. Every rank calls the same methods with the
    same batch (each DP rank trains its shard of it). megatron's parallel state is process-global: one MegatronTrainer
    per process; `close()` releases it."""

    def __init__(
        self,
        cfg: MegatronTrainerConfig,
        *,
        hf_config: Any = None,
        hf_state_dict: dict[str, torch.Tensor] | None = None,
    ):
        self.cfg = cfg
        self.version = 0
        self._record_mismatch = False
        dtype = torch.bfloat16 if cfg.bf16 else torch.float32
        if hf_config is None or hf_state_dict is None:
            hf_config, hf_state_dict = load_hf_model(cfg, dtype)
        self.hf_config = hf_config
        # right padding is masked either way; as the torch backend: the model config's pad id unless one is given
        self.pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else int(getattr(hf_config, "pad_token_id", None) or 0)
        self.shape = Qwen3Shape.from_hf_config(hf_config)
        self.shape.check_tp(cfg.tp_size)
        self.ctx: ParallelContext = init_parallel(cfg.tp_size, cfg.pp_size, cfg.device, cfg.seed, dp=cfg.dp_size)
        try:
            self._setup(hf_state_dict, dtype)
        except BaseException:
            self.ctx.close()
            raise

    @classmethod
    def from_hf_model(cls, model: torch.nn.Module, cfg: MegatronTrainerConfig) -> MegatronTrainer:
        """Start from an in-memory HF Qwen3ForCausalLM (e.g. the local policy's model); its weights are copied."""
        sd = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        return cls(cfg, hf_config=model.config, hf_state_dict=sd)

    def _setup(self, hf_sd: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
        cfg, dev = self.cfg, self.ctx.device
        if cfg.bf16 and dev.type != "cuda":
            raise ValueError("bf16=True needs a GPU (megatron's bf16 path keeps fp32 main params in its GPU optimizer)")
        self.optimizer_kind = (
            cfg.optimizer if cfg.optimizer != "auto" else ("megatron" if dev.type == "cuda" else "torch")
        )
        if self.optimizer_kind == "megatron" and dev.type != "cuda":
            raise ValueError("optimizer='megatron' needs a GPU (megatron's optimizer and schedules allocate on cuda)")
        if cfg.use_distributed_optimizer and self.optimizer_kind != "megatron":
            raise ValueError("use_distributed_optimizer=true needs megatron's optimizer (optimizer='megatron' or "
                             "'auto' on a GPU); on the CPU the torch optimizer keeps the whole state")
        self.mconfig = transformer_config(
            self.hf_config, tp=cfg.tp_size, pp=cfg.pp_size, params_dtype=dtype,
            recompute_granularity=cfg.recompute_granularity, recompute_method=cfg.recompute_method,
            recompute_num_layers=cfg.recompute_num_layers,
        )
        shard = hf_to_megatron({k: v.to(dtype) for k, v in hf_sd.items()}, self.shape, cfg.tp_size)[self.ctx.tp_rank]
        self.model = self._build(shard)
        self.ref_model = None
        if cfg.kl_coef != 0.0:
            self.ref_model = self._build(shard)
            self.ref_model.eval()
            self.ref_model.requires_grad_(False)
        del shard
        if self.optimizer_kind == "torch":
            self._params = [p for p in self.model.parameters() if p.requires_grad]
            # QK-norm weights are replicated but each TP rank only sees its own heads: their gradients are partial
            # sums and must be summed over TP (megatron's finalize_model_grads does the same on its path)
            self._tp_partial = [p for n, p in self.model.named_parameters() if "q_layernorm" in n or "k_layernorm" in n]
            self.optimizer = torch.optim.AdamW(
                self._params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
            )
            self.ddp = None
        else:
            self._setup_megatron_optimizer()

    def _build(self, shard: dict[str, Any]) -> torch.nn.Module:
        model = build_gpt_model(self.hf_config, self.mconfig, self.cfg.attention)
        self._load(model, shard)
        return model.to(self.ctx.device)

    def _load(self, model: torch.nn.Module, shard: dict[str, Any]) -> None:
        """Load a local-spec shard (megatron_convert's names); the TE spec renames the fused norms and keeps its
        own `_extra_state` entries (nothing else may be missing)."""
        if self.cfg.attention != "te":
            model.load_state_dict(shard, strict=True)
            return
        result = model.load_state_dict(to_te_keys(shard), strict=False)
        missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
        if missing or result.unexpected_keys:
            raise RuntimeError(f"TE model state: missing {missing}, unexpected {result.unexpected_keys}")

    def _setup_megatron_optimizer(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.distributed import (
                DistributedDataParallel,
                DistributedDataParallelConfig,
                finalize_model_grads,
            )
            from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        cfg = self.cfg
        self.ddp = DistributedDataParallel(
            self.mconfig,
            DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                          use_distributed_optimizer=cfg.use_distributed_optimizer),
            self.model,
        )
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=cfg.lr,
                weight_decay=cfg.weight_decay,
                adam_beta1=cfg.betas[0],
                adam_beta2=cfg.betas[1],
                adam_eps=cfg.eps,
                clip_grad=cfg.grad_clip,
                bf16=cfg.bf16,
                params_dtype=self.mconfig.params_dtype,
                use_distributed_optimizer=cfg.use_distributed_optimizer,
            ),
            [self.ddp],
            config_overrides={},  # {} (not None): weight decay on every parameter, like torch.optim.AdamW
        )
        for group in self.optimizer.param_groups:  # no scheduler: constant lr (the paper's setting)
            group["lr"] = cfg.lr
        self.mconfig.finalize_model_grads_func = finalize_model_grads
        self.mconfig.grad_scale_func = self.optimizer.scale_loss

    # ----- the Trainer protocol -----
    def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        """One policy update: `ppo_epochs` passes over the batch split into `minibatches` optimizer steps (as
        trainer=torch); `version` goes up by one when any sample has a loss token."""
        t0 = time.perf_counter()
        self._check_tokens(batch)
        if any(s.distill for s in batch):  # its loss has no distillation term: refuse rather than drop it
            raise ValueError("trainer=megatron has no distribution-level directive loss (reward.opd_signal="
                             "teacher_topk): use trainer=torch")
        usable = [s for s in batch if has_loss_tokens(s)]
        base = {"samples": float(len(batch)), "samples_used": float(len(usable))}
        if not usable:
            log.warning(
                "train_step: no sample in the batch has a loss token; no update (version stays %d)", self.version
            )
            return {**base, "skipped": 1.0, "loss_tokens": 0.0, "micro_batches": 0.0, "version": float(self.version)}
        recomputed: dict[str, float] = {}
        if self.cfg.old_logprobs == "recompute":
            usable, recomputed = with_recomputed_logprobs(usable, self.compute_logprobs(usable))
        self.model.train()
        steps: list[dict[str, float]] = []
        for epoch in range(self.cfg.ppo_epochs):
            for part in minibatch_parts(usable, self.cfg.minibatches):
                # each DP rank trains its shard of the part, weighted against the whole part (data_parallel.py)
                mbs = rank_micro_batches(part, self.ctx.dp_rank, self.cfg.dp_size, self.cfg.micro_batch_tokens,
                                         self.pad_id)
                self._record_mismatch = epoch == 0
                if self.optimizer_kind == "torch":
                    step, grad_norm = self._step_torch(mbs)
                else:
                    step, grad_norm = self._step_megatron(mbs)
                step.reduce(self.ctx.dp_group, self.cfg.dp_size, self.ctx.device)
                steps.append({**step.result(), "grad_norm": float(grad_norm)})
        self._record_mismatch = False
        self.model.eval()
        self.version += 1
        dt = time.perf_counter() - t0
        metrics = combine_steps(steps)
        tokens = metrics["tokens"]
        metrics.update(
            base,
            version=float(self.version),
            lr=self.cfg.lr,
            seconds=dt,
            time_s=dt,
            tokens_per_s=tokens / dt if dt > 0 else 0.0,
            skipped=0.0,
        )
        metrics.update(recomputed)  # the rollout's mismatch against the old logprobs used (recompute)
        return metrics

    def export_weights(self, path: str) -> str:
        """Write an HF model directory (config.json, model.safetensors, tokenizer files of model_path) to `path`.

        Every TP rank must call it (the shards are gathered); global rank 0 writes. The weights file is written under a
        temporary name and renamed, so a reader never sees half a file.
        """
        from safetensors.torch import save_file

        hf_sd = self.state_dict()
        out = Path(path)
        if self.ctx.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            tensors = {
                k: v.contiguous()
                for k, v in hf_sd.items()
                if not (k == "lm_head.weight" and self.shape.tied_embeddings)
            }
            tmp = out / f".model.safetensors.tmp-{os.getpid()}"
            save_file(tensors, str(tmp), metadata={"format": "pt", "weight_version": str(self.version)})
            os.replace(tmp, out / "model.safetensors")
            config = copy.deepcopy(self.hf_config)
            # a policy server picks the model class from `architectures`; a config built from kwargs has none
            config.architectures = config.architectures or ["Qwen3ForCausalLM"]
            config.dtype = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
            config.save_pretrained(out)
            if self.cfg.model_path:
                for name in TOKENIZER_FILES:
                    src = Path(self.cfg.model_path) / name
                    if src.is_file():
                        shutil.copyfile(src, out / name)
        if self.ctx.world_size > 1:
            dist.barrier()
        return str(out)

    def state_dict(self) -> dict[str, Any]:
        """The current weights as an HF Qwen3ForCausalLM state dict (CPU tensors), what a local policy loads."""
        return megatron_to_hf(self._gather_shards(self.model), self.shape)

    # ----- extras -----
    @torch.no_grad()
    def compute_logprobs(self, samples: list[TrainSample], reference: bool = False) -> list[list[float]]:
        """Per-token logprobs under the current weights (`reference`: the frozen initial weights of the KL anchor),
        aligned like TrainSample.rollout_logprobs (0.0 at token 0)."""
        self._check_tokens(samples)
        model = frozen_reference(self.ref_model) if reference else self.model
        self.model.eval()
        out: list[list[float]] = [[] for _ in samples]
        for mb in make_micro_batches(
            samples, self.cfg.micro_batch_tokens, pad_id=self.pad_id, only_with_loss=False
        ):
            lp = token_logprobs(model, mb.to(self.ctx.device).tokens, self.cfg.temperature,
                                self.shape.vocab_size).cpu()
            for row, (i, n) in enumerate(zip(mb.indices, mb.lengths)):
                out[i] = [0.0] + lp[row, : n - 1].tolist()
        for i, s in enumerate(samples):
            if len(s.tokens) < 2:
                out[i] = [0.0] * len(s.tokens)
        return out

    # ----- resume -----
    def save_checkpoint(self, directory: str | Path) -> Path:
        """HF weights (`model/`), this rank's optimizer state, the version and the KL reference weights; a complete
        checkpoint has `trainer.json` (written last by rank 0). Every rank must call it."""
        d = Path(directory)
        if self.ctx.rank == 0:
            d.mkdir(parents=True, exist_ok=True)
            (d / CHECKPOINT_MARK).unlink(missing_ok=True)
        self.export_weights(str(d / "model"))
        ref = megatron_to_hf(self._gather_shards(self.ref_model), self.shape) if self.ref_model is not None else None
        state = {"version": self.version, "optimizer": self.optimizer.state_dict(), "ref_model": ref}
        if self.ctx.dp_rank == 0:  # DP replicas hold the same state: one file per TP rank
            torch.save(state, d / f"trainer_state.tp{self.ctx.tp_rank}.pt")
        if self.ctx.world_size > 1:
            dist.barrier()
        if self.ctx.rank == 0:
            cfg = {f.name: getattr(self.cfg, f.name) for f in fields(self.cfg)}
            (d / CHECKPOINT_MARK).write_text(json.dumps({"version": self.version, "config": cfg}, indent=2))
        return d

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore weights, optimizer state, version and reference model from `save_checkpoint`'s directory."""
        from safetensors.torch import load_file

        d = Path(directory)
        if not (d / CHECKPOINT_MARK).exists():
            raise FileNotFoundError(f"{d} is not a complete megatron trainer checkpoint (no {CHECKPOINT_MARK})")
        dtype = self.mconfig.params_dtype
        hf_sd = {k: v.to(dtype) for k, v in load_file(str(d / "model" / "model.safetensors")).items()}
        if self.shape.tied_embeddings:
            hf_sd.setdefault("lm_head.weight", hf_sd["model.embed_tokens.weight"])
        state = torch.load(d / f"trainer_state.tp{self.ctx.tp_rank}.pt", map_location="cpu", weights_only=False)
        with torch.no_grad():
            self._load(self.model, self._shard(hf_sd))
            if self.ref_model is not None and state["ref_model"] is not None:
                self._load(self.ref_model, self._shard({k: v.to(dtype) for k, v in state["ref_model"].items()}))
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])

    def _shard(self, hf_sd: dict[str, torch.Tensor]) -> dict[str, Any]:
        shard = hf_to_megatron(hf_sd, self.shape, self.cfg.tp_size)[self.ctx.tp_rank]
        return {k: (v.to(self.ctx.device) if isinstance(v, torch.Tensor) else v) for k, v in shard.items()}

    def close(self) -> None:
        self.ctx.close()

    def __enter__(self) -> MegatronTrainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ----- internals -----
    def _check_tokens(self, batch: list[TrainSample]) -> None:
        v = self.shape.vocab_size
        for i, s in enumerate(batch):
            if s.vision is not None:
                raise ValueError(
                    f"sample {i} carries images: trainer=megatron trains text models; a vision-language policy "
                    "trains with trainer=torch"
                )
            if s.tokens and (min(s.tokens) < 0 or max(s.tokens) >= v):
                raise ValueError(
                    f"sample {i}: token ids must lie in [0, {v}) (vocab size), got {min(s.tokens)}..{max(s.tokens)}"
                )

    def _micro_batch_loss(self, model: torch.nn.Module, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, Any]]:
        """The micro-batch's loss, weighted by its share of the batch's samples (so the sum is the batch loss)."""
        mb = mb.to(self.ctx.device)
        logprobs = token_logprobs(model, mb.tokens, self.cfg.temperature, self.shape.vocab_size)
        ref = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref = token_logprobs(self.ref_model, mb.tokens, self.cfg.temperature, self.shape.vocab_size)
        loss, m = policy_loss(logprobs, mb.old_logprobs, mb.advantages, mb.loss_mask, ref, self.cfg.loss)
        m = {**m, "_weight": mb.weight, "_real_tokens": mb.real_tokens,
             "_mismatch": mismatch_of(logprobs, mb) if self._record_mismatch else None}
        return loss * mb.weight, m

    def _step_torch(self, mbs: list[MicroBatch]) -> tuple[StepMetrics, float]:
        self.optimizer.zero_grad(set_to_none=True)
        step = StepMetrics()
        for mb in mbs:
            loss, m = self._micro_batch_loss(self.model, mb)
            loss.backward()
            step.add(m, m["_weight"], m["_real_tokens"], m["_mismatch"])
        self._sum_partial_grads_over_tp()
        self._sum_grads_over_dp()
        grad_norm = self._clip_grads()
        self.optimizer.step()
        return step, grad_norm

    def _sum_grads_over_dp(self) -> None:
        """Sum every gradient over the DP ranks: each rank's loss is its shard's share of the batch loss."""
        if self.cfg.dp_size == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.ctx.dp_group)
        for p, synced in zip(self._params, flat.split([g.numel() for g in grads])):
            p.grad = synced.view_as(p).clone()

    def _sum_partial_grads_over_tp(self) -> None:
        grads = [p.grad for p in self._tp_partial if p.grad is not None]
        if self.cfg.tp_size == 1 or not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.ctx.tp_group)
        for g, synced in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(synced.view_as(g))

    def _clip_grads(self) -> float:
        """Global L2 norm over TP ranks (split params: summed over ranks; replicated: once), then clip like
        torch.nn.utils.clip_grad_norm_ (scale by max_norm / (norm + 1e-6) when that is < 1)."""
        dev = self.ctx.device
        split_sq = torch.zeros((), dtype=torch.float64, device=dev)
        repl_sq = torch.zeros((), dtype=torch.float64, device=dev)
        for p in self._params:
            if p.grad is None:
                continue
            sq = p.grad.detach().double().pow(2).sum()
            if getattr(p, "tensor_model_parallel", False):
                split_sq += sq
            else:
                repl_sq += sq
        if self.cfg.tp_size > 1:
            dist.all_reduce(split_sq, group=self.ctx.tp_group)
        norm = math.sqrt(float(split_sq + repl_sq))
        if self.cfg.grad_clip > 0:
            coef = self.cfg.grad_clip / (norm + 1e-6)
            if coef < 1.0:
                for p in self._params:
                    if p.grad is not None:
                        p.grad.mul_(coef)
        return norm

    def _step_megatron(self, mbs: list[MicroBatch]) -> tuple[StepMetrics, float]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        n, dp = len(mbs), self.cfg.dp_size
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()

        def forward_step(data_iterator, model):
            mb = next(data_iterator)
            loss, m = self._micro_batch_loss(model, mb)

            def loss_func(output: torch.Tensor):
                # the 2-tuple form: the schedule divides by the number of micro-batches and megatron's DDP averages
                # the gradients over the DP ranks; undo both: our weights already make the sum the batch loss
                return output * n * dp, m

            return loss, loss_func

        parts = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(mbs),
            model=[self.ddp],
            num_microbatches=n,
            seq_length=max(int(mb.tokens.shape[1]) for mb in mbs) - 1,
            micro_batch_size=max(int(mb.tokens.shape[0]) for mb in mbs),
            forward_only=False,
        )
        ok, grad_norm, _ = self.optimizer.step()
        if not ok:
            raise RuntimeError("megatron optimizer step was skipped (non-finite gradients)")
        step = StepMetrics()
        for m in parts:
            step.add(m, m["_weight"], m["_real_tokens"], m["_mismatch"])
        return step, float(grad_norm if grad_norm is not None else float("nan"))

    def _gather_shards(self, model: torch.nn.Module) -> list[dict[str, torch.Tensor]]:
        """Every TP rank's megatron state dict (CPU), by all-gathering each tensor over the TP group."""
        local = {k: v.detach() for k, v in from_te_keys(model.state_dict()).items()}
        tp = self.cfg.tp_size
        if tp == 1:
            return [{k: v.cpu() for k, v in local.items()}]
        shards: list[dict[str, torch.Tensor]] = [{} for _ in range(tp)]
        for k, v in local.items():
            parts = [torch.empty_like(v) for _ in range(tp)]
            dist.all_gather(parts, v.contiguous(), group=self.ctx.tp_group)
            for r in range(tp):
                shards[r][k] = parts[r].cpu()
        return shards

