"""The SFT warm start of `policy=local` on the toolcall env's demonstrations: wall time, loss, and what the model
learned, per torch thread count and SFT batch size, in one run.

    python benchmarks/sft_toolcall.py [--demos 1000] [--eval 100] [--threads 1,2] [--batch-tokens 1024] [--json out.json]

Each configuration trains the warm start from scratch (`train.warmstart.warm_start`, the launcher's path, with a fresh
temporary cache: nothing is loaded) on the demonstrations of the first `--demos` training tasks, with `SFTConfig`'s
defaults except `batch_tokens`. Configurations run one after the other in an interleaved order (every thread count for
one batch size, then the next), so a change in the machine's load touches all of them alike; every run records the
load. What the model learned, by greedy decoding on the demonstrations of the first `--eval` eval-split tasks:
- `tool_call_exact`: given system + user, the first assistant turn equals the demonstration's tool call (the model
  must turn a word problem into code);
- `answer_copied`: given the demonstration up to the tool's output, the final turn is the demonstration's
  `\\boxed{answer}` (the model must copy the number from the tool output).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import envs  # noqa: E402
from benchmarks.machine import machine_state  # noqa: E402
from rollout.policy.local import chat_prompt_ids  # noqa: E402
from rollout.policy.sampler import RowSampling, sample  # noqa: E402
from train.sft import SFTConfig  # noqa: E402
from train.warmstart import WarmStartConfig, warm_start  # noqa: E402


def demonstrations(split: str, n: int) -> list[list[dict]]:
    env = envs.make("toolcall")
    try:
        return [env.demonstration(t) for t in env.tasks(split)[:n]]
    finally:
        env.close()


def greedy_match_rate(model, tokenizer, prompts: list[list[dict]], targets: list[str], max_new_tokens: int) -> float:
    ids = [chat_prompt_ids(tokenizer, p) for p in prompts]
    outs = sample(model, ids, RowSampling(greedy=True, max_new_tokens=max_new_tokens),
                  stop_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id)
    texts = [tokenizer.decode(o.output_ids, skip_special_tokens=True).strip() for o in outs]
    return sum(t == target.strip() for t, target in zip(texts, targets)) / len(targets)


def evaluate(model, tokenizer, evals: list[list[dict]]) -> dict[str, float]:
    model.eval()
    with torch.no_grad():
        tool_call = greedy_match_rate(model, tokenizer, [c[:2] for c in evals], [c[2]["content"] for c in evals], 160)
        copied = greedy_match_rate(model, tokenizer, [c[:4] for c in evals], [c[4]["content"] for c in evals], 24)
    return {"tool_call_exact": tool_call, "answer_copied": copied}


def run_one(convs: list[list[dict]], evals: list[list[dict]], threads: int, batch_tokens: int) -> dict:
    torch.set_num_threads(threads)
    before = machine_state()
    cfg = WarmStartConfig(sft=SFTConfig(batch_tokens=batch_tokens, progress=False))
    with tempfile.TemporaryDirectory(prefix="sft-bench-") as cache:
        model, tokenizer, info = warm_start(convs, cfg, cache)
    row = {
        "threads": threads,
        "batch_tokens": batch_tokens,
        "train_seconds": round(info.train_seconds, 1),  # tokenizer + model + SFT
        "sft_seconds": round(info.sft["seconds"], 1),
        "optimizer_steps": info.sft["steps"],
        "final_step_loss": round(info.sft["final_loss"], 4),
        "last_epoch_loss": round(info.sft["epoch_losses"][-1], 4),
        "tokens": info.sft["tokens"],
        "params": info.params,
        **evaluate(model, tokenizer, evals),
        "machine_before": before,
        "machine_after": machine_state(),
    }
    print(f"threads {threads}, batch_tokens {batch_tokens}: {row['train_seconds']} s, {row['optimizer_steps']} steps, "
          f"final loss {row['final_step_loss']}, tool call exact {row['tool_call_exact']:.0%}, "
          f"answer copied {row['answer_copied']:.0%} (load {before['loadavg'][0]} -> "
          f"{row['machine_after']['loadavg'][0]})", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demos", type=int, default=1000, help="training demonstrations (toolcall train split)")
    p.add_argument("--eval", type=int, default=100, help="eval-split demonstrations decoded greedily")
    p.add_argument("--threads", default="1,2", help="torch thread counts to compare (comma-separated)")
    p.add_argument("--batch-tokens", default="1024", help="SFTConfig.batch_tokens values (comma-separated)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    convs, evals = demonstrations("train", args.demos), demonstrations("eval", args.eval)
    rows = [run_one(convs, evals, int(th), int(bt))
            for bt in args.batch_tokens.split(",") for th in args.threads.split(",")]
    if args.json:
        command = " ".join(["python benchmarks/sft_toolcall.py", *(sys.argv[1:] if argv is None else argv)])
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": command, "demos": len(convs), "eval": len(evals), "runs": rows},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
