"""Trainer throughput and rollout/train overlap on this machine, each against a baseline measured in the same run.

    python benchmarks/train.py                          # both parts
    python benchmarks/train.py --only throughput --sizes tiny --steps 3 --json out.json
    python benchmarks/train.py --only overlap --per-token-s 0.01 --iterations 4

Throughput arms (same weights, same TrainSample batch, same micro-batch token budget, same loss and AdamW settings):
- `hf_baseline`: a plain HF Qwen3ForCausalLM step: per micro-batch forward, log_softmax/gather, train/loss.py
  policy_loss, backward; clip_grad_norm_; torch.optim.AdamW. This is what a torch backend does at minimum.
- `torch_backend`: TorchTrainer.train_step (trainer=torch).
- `megatron`: MegatronTrainer.train_step (trainer=megatron: megatron-core GPTModel, gloo world of one, CPU shims).
Arms alternate step by step (A, B, C, A, B, C, ...) so machine noise hits all; the median and the fastest step are
reported (on a shared machine the fastest step is the least disturbed estimate), and tokens per CPU-second of the
process (all its threads), which time-slicing by other processes does not inflate.
tokens/s counts the real (unpadded) tokens of the batch per optimizer step (forward + backward + update).

Overlap: the real loop (RLLoop: toolcall env on a local farm, the local policy warm-started as
`python -m rollout.launch` builds it, the configured trainer) with the policy wrapped in SimulatedLatencyPolicy (each completion held back by
per_token_s x its output tokens, as a large model decoding on a server would be). Arms: `synchronous`
(loop.max_staleness=0, the baseline) and `overlapped` (loop.max_staleness=1), alternated round by round. Reported:
wall time of the training iterations, the fraction of that wall time the policy was generating while the trainer trained
(Timeline lanes "generate" and "train"), and the speed-up of overlapped over synchronous. Constant step-index buckets
get advantage 0 instead of being dropped (reward.constant=zero) so every iteration has the same training work.
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

from benchmarks.machine import machine_state  # noqa: E402
from train.backends.microbatch import make_micro_batches  # noqa: E402
from train.config import LossConfig  # noqa: E402
from train.loss import policy_loss  # noqa: E402
from train.records import TrainSample  # noqa: E402

SIZES = {  # FACTS.md's two measured sizes, in Qwen3 form
    "tiny": dict(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    ),
    "small": dict(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
    ),
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
        out.append(
            TrainSample(tokens, [0] * prompt + [1] * (length - prompt), [0.0] * prompt + [adv] * (length - prompt), old)
        )
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

    from train.backends.megatron_backend import MegatronTrainer
    from train.backends.torch_backend import TorchTrainer
    from train.config import MegatronTrainerConfig, TorchTrainerConfig

    torch.manual_seed(seed)
    hf = Qwen3ForCausalLM(Qwen3Config(**size)).float()
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    arms = {"hf_baseline": HFBaseline(hf, 1e-6, kl_coef, micro_batch_tokens)}
    mcfg = MegatronTrainerConfig(device="cpu", kl_coef=kl_coef, micro_batch_tokens=micro_batch_tokens)
    copy_for_torch = Qwen3ForCausalLM(hf.config).float()
    copy_for_torch.load_state_dict(sd)
    tcfg = TorchTrainerConfig(lr=1e-6, kl_coef=kl_coef, micro_batch_tokens=micro_batch_tokens)
    arms["torch_backend"] = TorchTrainer(copy_for_torch, tcfg)
    arms["megatron"] = MegatronTrainer(mcfg, hf_config=hf.config, hf_state_dict=sd)
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


def run_throughput(args: argparse.Namespace) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
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
            print(
                f"  {name:13s} median {r['tokens_per_s']:8.0f} tokens/s (x{r['speed_vs_hf_baseline']:.2f} vs "
                f"hf_baseline)   best {r['best_tokens_per_s']:8.0f} tokens/s (x{r['best_speed_vs_hf_baseline']:.2f})"
                f"   {r['tokens_per_cpu_s']:8.0f} tokens/cpu-s (x{r['cpu_speed_vs_hf_baseline']:.2f})"
            )
    return results


# ----- rollout/train overlap ------------------------------------------------------------------------------------


def overlap_config(args: argparse.Namespace, max_staleness: int, out_dir: Path):
    from rollout.build import compose_launch_config

    overrides = [
        "env=toolcall",
        f"trainer={args.trainer}",
        f"run.out_dir={out_dir}",
        "run.name=bench-overlap",
        f"loop.iterations={args.iterations}",
        f"loop.tasks_per_iteration={args.tasks}",
        f"loop.samples_per_task={args.samples_per_task}",
        "loop.eval_tasks=0",
        f"loop.max_staleness={max_staleness}",
        f"sampling.max_new_tokens={args.max_new_tokens}",
        "reward.constant=zero",
        "policy.num_threads=1",
        f"farm.num_envs={args.tasks * args.samples_per_task}",
    ]
    if args.trainer == "megatron":
        overrides.append("trainer.device=cpu")
    return compose_launch_config(overrides)


async def overlap_arm(args: argparse.Namespace, max_staleness: int, out_dir: Path) -> dict:
    """One real training run (args.iterations iterations) with the simulated-latency policy; its timeline figures."""
    import dataclasses

    from prm.factory import make_judge
    from rollout.build import build_policy_and_trainer, plan_run
    from rollout.farm.core import make_farm
    from rollout.loop import RunWriter
    from rollout.policy.latency import SimulatedLatencyPolicy
    from rollout.run import make_loop
    from train.timeline import Timeline

    plan = plan_run(overlap_config(args, max_staleness, out_dir))  # the launcher's builder: the run it would make
    plan.env = dataclasses.replace(plan.env, eval_tasks=[])
    inner, trainer, _ = build_policy_and_trainer(plan)
    timeline = Timeline()
    policy = SimulatedLatencyPolicy(inner, per_token_s=args.per_token_s, timeline=timeline)
    judge = make_judge(plan.judge)
    farm = make_farm(plan.env.name, plan.env.kwargs, plan.farm)
    writer = RunWriter(out_dir)
    try:
        await farm.start()
        loop = make_loop(plan, farm=farm, policy=policy, judge=judge, trainer=trainer, writer=writer,
                         timeline=timeline)
        t0 = timeline.clock()
        summary = await loop.run()
        wall = timeline.clock() - t0
    finally:
        writer.close()
        await farm.close()
        await judge.close()
        await policy.close()
        if hasattr(trainer, "close"):
            trainer.close()
    both = timeline.overlap("generate", "train")
    rows = summary.metrics
    return {
        "wall_s": wall,
        "generate_busy_s": timeline.busy("generate"),
        "train_busy_s": timeline.busy("train"),
        "generate_while_training_s": both,
        "generate_while_training_fraction": both / wall if wall > 0 else 0.0,
        "train_tokens": sum(r.get("train/tokens", 0.0) for r in rows),
        "env_steps": summary.env_steps,
        "produced": summary.produced,
        "trained": summary.trained,
        "dropped_stale": summary.dropped_stale,
        "staleness_mean": (
            sum(r["staleness_mean"] * r["trained"] for r in rows) / summary.trained if summary.trained else 0.0
        ),
    }


def run_overlap(args: argparse.Namespace) -> dict:
    import asyncio
    import os
    import tempfile

    os.environ.setdefault("TQDM_DISABLE", "1")  # the warm start's SFT bar (first run only; then it is cached)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    arms = {"synchronous": 0, "overlapped": 1}
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory(prefix="bench-overlap-") as tmp:
        for r in range(args.rounds):
            for name, bound in arms.items():  # alternate so machine noise hits both arms
                runs[name].append(asyncio.run(overlap_arm(args, bound, Path(tmp) / f"{name}-{r}")))
                x = runs[name][-1]
                print(
                    f"  round {r + 1} {name:11s} wall {x['wall_s']:6.1f} s   generating while training "
                    f"{x['generate_while_training_s']:5.1f} s ({100 * x['generate_while_training_fraction']:.0f}%)"
                    f"   trained {x['trained']}/{x['produced']} samples"
                )
    out: dict = {
        "settings": {
            k: getattr(args, k)
            for k in ("trainer", "per_token_s", "iterations", "tasks", "samples_per_task", "max_new_tokens", "rounds")
        }
    }
    for name, xs in runs.items():
        out[name] = {k: statistics.median(x[k] for x in xs) for k in xs[0]}
        out[name]["rounds"] = xs
    out["speedup_overlapped_vs_synchronous"] = out["synchronous"]["wall_s"] / out["overlapped"]["wall_s"]
    s, o = out["synchronous"], out["overlapped"]
    print(
        f"overlap ({args.trainer} trainer, {args.per_token_s * 1000:.0f} ms/token simulated decode, "
        f"{args.iterations} iterations, median of {args.rounds}):"
    )
    for name, x in (("synchronous", s), ("overlapped", o)):
        print(
            f"  {name:11s} wall {x['wall_s']:6.1f} s   policy generating while the trainer trained: "
            f"{100 * x['generate_while_training_fraction']:.0f}% of wall time   "
            f"(generate busy {x['generate_busy_s']:.1f} s, train busy {x['train_busy_s']:.1f} s)"
        )
    print(
        f"  overlapped vs synchronous: x{out['speedup_overlapped_vs_synchronous']:.2f} wall-time speed-up, "
        f"{o['dropped_stale']:.0f} stale samples dropped, mean staleness {o['staleness_mean']:.2f}"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="trainer throughput (tokens/s vs a plain HF step) and rollout/train overlap"
    )
    p.add_argument("--only", choices=["throughput", "overlap"], default=None)
    p.add_argument("--json", default=None, help="also write the results here")
    t = p.add_argument_group("throughput")
    t.add_argument("--sizes", default="tiny,small")
    t.add_argument("--steps", type=int, default=5)
    t.add_argument("--samples", type=int, default=32)
    t.add_argument("--min-len", type=int, default=64)
    t.add_argument("--max-len", type=int, default=256)
    t.add_argument("--micro-batch-tokens", type=int, default=4096)
    t.add_argument("--kl-coef", type=float, default=0.01)
    t.add_argument("--threads", type=int, default=1, help="torch threads (1: no OpenMP spinning on a shared CPU)")
    o = p.add_argument_group("overlap")
    o.add_argument("--trainer", choices=["torch", "megatron"], default="torch")
    o.add_argument("--per-token-s", type=float, default=0.01, help="simulated decode time per output token")
    o.add_argument("--iterations", type=int, default=4)
    o.add_argument("--tasks", type=int, default=8, help="task groups per iteration")
    o.add_argument("--samples-per-task", type=int, default=4)
    o.add_argument("--max-new-tokens", type=int, default=96)
    o.add_argument("--rounds", type=int, default=2)
    o.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval (GIL hand-off, s)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    warnings.simplefilter("ignore")

    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    results: dict = {"command": " ".join(["python benchmarks/train.py", *(sys.argv[1:] if argv is None else argv)]),
                     "machine_before": machine_state()}
    if args.only in (None, "throughput"):
        results["throughput"] = run_throughput(args)
    if args.only in (None, "overlap"):
        results["overlap"] = run_overlap(args)
    results["machine_after"] = machine_state()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
