"""Training throughput of the trainer backends on this machine, as ratios against a baseline measured in the same run.

    python benchmarks/train.py                  # both model sizes, 5 timed steps each
    python benchmarks/train.py --sizes tiny --steps 3 --json out.json

Arms (same weights, same TrainSample batch, same micro-batch token budget, same loss and AdamW settings):
- `hf_baseline`: a plain HF Qwen3ForCausalLM step: per micro-batch forward, log_softmax/gather, train/loss.py policy_loss,
  backward; clip_grad_norm_; torch.optim.AdamW. This is what a torch backend does at minimum.
- `megatron`: MegatronTrainer.train_step (megatron-core GPTModel, gloo world of one, CPU shims).
- `torch_backend`: train/backends/torch_backend.py when it exists on this branch (measured only then).
Arms alternate step by step (A, B, A, B, ...) so machine noise hits both; the median and the fastest step are reported
(on a shared machine the fastest step is the least disturbed estimate), and tokens per CPU-second of the process (all its
threads), which time-slicing by other processes does not inflate.
tokens/s counts the real (unpadded) tokens of the batch per optimizer step (forward + backward + update).

TODO (phase 2, needs train/loop.py): rollout/train overlap: the fraction of wall time during which the policy was
generating while the trainer trained, with a simulated-latency policy; reported next to these numbers.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from train.backends import TrainSample  # noqa: E402
from train.backends.microbatch import make_micro_batches  # noqa: E402
from train.loss import LossConfig, policy_loss  # noqa: E402

SIZES = {  # FACTS.md's two measured sizes, in Qwen3 form
    "tiny": dict(vocab_size=1024, hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32),
    "small": dict(vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=32),
}


def make_batch(vocab: int, n: int, min_len: int, max_len: int, seed: int = 0) -> list[TrainSample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        prompt = length // 2
        tokens = torch.randint(0, vocab, (length,), generator=g).tolist()
        adv = 1.0 if i % 2 else -1.0
        old = [0.0] * prompt + (-7.0 + 0.3 * torch.randn(length - prompt, generator=g)).tolist()
        out.append(TrainSample(tokens, [0] * prompt + [1] * (length - prompt), [0.0] * prompt + [adv] * (length - prompt), old))
    return out


class HFBaseline:
    """The plain-torch step every backend is compared with."""

    def __init__(self, model, lr: float, kl_coef: float, micro_batch_tokens: int):
        import copy

        self.model = model.train()
        self.ref = copy.deepcopy(model).eval().requires_grad_(False) if kl_coef else None
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.1)
        self.loss_cfg = LossConfig(kl_coef=kl_coef)
        self.budget = micro_batch_tokens

    def _logprobs(self, model, tokens: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=tokens[:, :-1]).logits.float()  # right padding + causal attention: no mask needed
        return logits.log_softmax(-1).gather(-1, tokens[:, 1:, None])[..., 0]

    def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        self.opt.zero_grad(set_to_none=True)
        for mb in make_micro_batches(batch, self.budget):
            lp = self._logprobs(self.model, mb.tokens)
            ref = None
            if self.ref is not None:
                with torch.no_grad():
                    ref = self._logprobs(self.ref, mb.tokens)
            loss, _ = policy_loss(lp, mb.old_logprobs, mb.advantages, mb.loss_mask, ref, self.loss_cfg)
            (loss * mb.weight).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return {}


def build_arms(size: dict, kl_coef: float, micro_batch_tokens: int, seed: int = 0) -> dict:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from train.backends.megatron_backend import MegatronTrainer, MegatronTrainerConfig

    torch.manual_seed(seed)
    hf = Qwen3ForCausalLM(Qwen3Config(**size)).float()
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    arms = {"hf_baseline": HFBaseline(hf, 1e-6, kl_coef, micro_batch_tokens)}
    mcfg = MegatronTrainerConfig(device="cpu", kl_coef=kl_coef, micro_batch_tokens=micro_batch_tokens)
    arms["megatron"] = MegatronTrainer(mcfg, hf_config=hf.config, hf_state_dict=sd)
    try:  # the torch backend lands with the foundation issue; measured when present
        import train.backends.torch_backend  # noqa: F401
    except ImportError:
        pass
    else:
        logging.getLogger(__name__).warning("train/backends/torch_backend.py exists: add its arm here (phase 2)")
    return arms


def measure(arms: dict, batch: list[TrainSample], steps: int, warmup: int = 1) -> tuple[dict, dict]:
    """Wall time and process CPU time (all threads) of each step, per arm."""
    wall: dict[str, list[float]] = {name: [] for name in arms}
    cpu: dict[str, list[float]] = {name: [] for name in arms}
    for i in range(warmup + steps):
        for name, arm in arms.items():
            t0, c0 = time.perf_counter(), time.process_time()
            arm.train_step(batch)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if i >= warmup:
                wall[name].append(dt)
                cpu[name].append(dc)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="trainer backend throughput (tokens/s), ratios vs a plain HF step")
    p.add_argument("--sizes", default="tiny,small")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--min-len", type=int, default=64)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--micro-batch-tokens", type=int, default=4096)
    p.add_argument("--kl-coef", type=float, default=0.01)
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    warnings.simplefilter("ignore")

    results = {"threads": torch.get_num_threads(), "kl_coef": args.kl_coef, "sizes": {}}
    for size_name in args.sizes.split(","):
        size = SIZES[size_name]
        batch = make_batch(size["vocab_size"], args.samples, args.min_len, args.max_len)
        tokens = sum(len(s.tokens) for s in batch)
        arms = build_arms(size, args.kl_coef, args.micro_batch_tokens)
        try:
            times, cpu_times = measure(arms, batch, args.steps)
        finally:
            arms["megatron"].close()
        params = sum(p.numel() for p in arms["hf_baseline"].model.parameters())
        base, base_best = statistics.median(times["hf_baseline"]), min(times["hf_baseline"])
        base_cpu = statistics.median(cpu_times["hf_baseline"])
        row = {"params": params, "tokens_per_step": tokens, "arms": {}}
        for name, ts in times.items():
            med = statistics.median(ts)
            row["arms"][name] = {
                "median_step_s": med,
                "tokens_per_s": tokens / med,
                "speed_vs_hf_baseline": base / med,
                # the fastest step is the least disturbed by other load on a shared machine
                "best_tokens_per_s": tokens / min(ts),
                "best_speed_vs_hf_baseline": base_best / min(ts),
                # CPU seconds are what the step costs whatever else runs: the fairest ratio on a loaded machine
                "tokens_per_cpu_s": tokens / statistics.median(cpu_times[name]),
                "cpu_speed_vs_hf_baseline": base_cpu / statistics.median(cpu_times[name]),
                "steps_s": ts,
                "steps_cpu_s": cpu_times[name],
            }
        results["sizes"][size_name] = row
        print(f"{size_name}: {params / 1e6:.2f}M params, {tokens} tokens/step, {args.steps} steps (median)")
        for name, r in row["arms"].items():
            print(f"  {name:12s} median {r['tokens_per_s']:8.0f} tokens/s (x{r['speed_vs_hf_baseline']:.2f} vs hf_baseline)"
                  f"   best {r['best_tokens_per_s']:8.0f} tokens/s (x{r['best_speed_vs_hf_baseline']:.2f})"
                  f"   {r['tokens_per_cpu_s']:8.0f} tokens/cpu-s (x{r['cpu_speed_vs_hf_baseline']:.2f})")
    results["rollout_train_overlap"] = "TODO (phase 2: train/loop.py with a simulated-latency policy)"
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
