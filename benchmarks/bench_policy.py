"""Throughput of the local policy stack on the ~0.5M-parameter tiny Qwen3, each against a baseline run in the same process.

- sampler: our KV-cache sampler (with per-token logprobs) vs transformers' `model.generate` (sampling, returning logits,
  logprobs computed from them), same prompts, same token budget, no early stop; tokens/s at batch 1 / 32 / 128.
- SFT: `train.sft.sft` (chat rendering, assistant masks, batching, schedule) vs a bare loop (forward + cross-entropy +
  backward + AdamW on the same padded batches): tokens/s and the ratio (how much the bookkeeping costs).
- trainer: `TorchTrainer.train_step` (policy loss, KL reference forward, micro-batching) vs the same bare loop on the same
  tokens: tokens/s and the ratio.

Usage: python benchmarks/bench_policy.py [--threads 1] [--rounds 3] [--quick] [--json results.json]
The machine is shared and noisy: each comparison interleaves its two sides `rounds` times and reports medians; compare
the ratios, not the absolute numbers, across runs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import machine_state
from rollout.policy.local import chat_prompt_ids
from rollout.policy.sampler import RowSampling, SamplerStats, sample
from rollout.policy.tiny import build_model, build_tokenizer, render_chat, tiny_qwen3_config
from train.backends import TrainSample
from train.backends.microbatch import pack_by_token_budget as pack_micro_batches
from train.backends.torch_backend import TorchTrainer, TorchTrainerConfig
from train.sft import SFTConfig, make_batches, right_pad, sft, tokenize_conversation
from train.toy_conversations import addition_conversations


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def bench_sampler(model, tok, batch: int, new_tokens: int, rounds: int, seed: int = 0) -> dict:
    convs = addition_conversations(batch, seed=seed + batch)
    prompts = [chat_prompt_ids(tok, c[:4]) for c in convs]
    gen = torch.Generator().manual_seed(seed)

    def ours() -> float:
        stats = SamplerStats()
        _, secs = timed(
            lambda: sample(
                model, prompts, RowSampling(max_new_tokens=new_tokens), stop_token_ids=[], generator=gen, stats=stats
            )
        )
        return stats.new_tokens / secs

    # baseline: HF generate with left padding, sampling, output logits -> logprobs of the sampled tokens
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

    def hf() -> float:
        def run():
            with torch.no_grad():
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    do_sample=True,
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    top_k=0,
                    top_p=1.0,
                    temperature=1.0,
                    output_logits=True,
                    return_dict_in_generate=True,
                    pad_token_id=0,
                )
                new = out.sequences[:, width:]
                logits = torch.stack(out.logits, dim=1).float()
                torch.log_softmax(logits, -1).gather(-1, new[..., None])
                return new.numel()

        n, secs = timed(run)
        return n / secs

    a, b = alternate(ours, hf, rounds)
    return {"batch": batch, "new_tokens": new_tokens, "ours_tok_s": a, "hf_generate_tok_s": b, "speedup_vs_hf": a / b}


def alternate(fa, fb, rounds: int) -> tuple[float, float]:
    """Medians of `rounds` interleaved runs of two rate measurements (the shared machine's load drifts)."""
    ra, rb = [], []
    for _ in range(rounds):
        ra.append(fa())
        rb.append(fb())
    return statistics.median(ra), statistics.median(rb)


def bare_loop(model, batches: list[list[list[int]]], lr: float) -> float:
    """Forward + cross-entropy on every next token + backward + AdamW, nothing else. Returns seconds (the first
    batch runs once untimed first, as a warm-up that also creates the optimizer state)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)

    def step(rows):
        ids = right_pad(rows, 0)
        logits = model(input_ids=ids).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step(batches[0])
    t0 = time.perf_counter()
    for rows in batches:
        step(rows)
    return time.perf_counter() - t0


def bench_sft(tok, n_convs: int, batch_tokens: int, rounds: int, bf16: bool = False) -> dict:
    convs = addition_conversations(n_convs, seed=7)
    cfg = SFTConfig(epochs=1, batch_tokens=batch_tokens, progress=False, bf16=bf16)
    data = [tokenize_conversation(tok, c).ids for c in convs]
    batches = [[data[i] for i in b] for b in make_batches([len(d) for d in data], batch_tokens, random.Random(0))]
    tokens = sum(len(d) for d in data)

    def ours() -> float:
        return sft(build_model(tiny_qwen3_config(len(tok)), seed=0), tok, convs, cfg).tokens_per_s

    def bare() -> float:
        return tokens / bare_loop(build_model(tiny_qwen3_config(len(tok)), seed=0), batches, cfg.lr)

    a, b = alternate(ours, bare, rounds)
    return {
        "conversations": n_convs,
        "tokens": tokens,
        "batch_tokens": batch_tokens,
        "bf16": bf16,
        "sft_tok_s": a,
        "bare_loop_tok_s": b,
        "ratio_vs_bare": a / b,
    }


def bench_trainer(tok, n_samples: int, kl_coef: float, micro_batch_tokens: int, rounds: int) -> dict:
    rng = random.Random(3)
    convs = addition_conversations(n_samples, seed=11)
    samples = []
    for c in convs:
        prompt = chat_prompt_ids(tok, c[:4])
        out = tok.encode(c[4]["content"], add_special_tokens=False) + [tok.eos_token_id]
        n_p, n_o = len(prompt), len(out)
        samples.append(
            TrainSample(
                prompt + out,
                [0] * n_p + [1] * n_o,
                [0.0] * n_p + [rng.uniform(-1, 1)] * n_o,
                [0.0] * n_p + [-1.0] * n_o,
            )
        )
    tokens = sum(len(s.tokens) for s in samples)
    cfg = TorchTrainerConfig(lr=1e-4, kl_coef=kl_coef, micro_batch_tokens=micro_batch_tokens)
    trainer = TorchTrainer(build_model(tiny_qwen3_config(len(tok)), seed=0), cfg)
    trainer.train_step(samples[:4])  # warm-up
    groups = pack_micro_batches([len(s.tokens) for s in samples], micro_batch_tokens)
    rows = [[samples[i].tokens for i in g] for g in groups]

    def ours() -> float:
        return tokens / timed(lambda: trainer.train_step(samples))[1]

    def bare() -> float:
        return tokens / bare_loop(build_model(tiny_qwen3_config(len(tok)), seed=0), rows, 1e-4)

    a, b = alternate(ours, bare, rounds)
    return {
        "samples": n_samples,
        "tokens": tokens,
        "kl_coef": kl_coef,
        "trainer_tok_s": a,
        "bare_loop_tok_s": b,
        "ratio_vs_bare": a / b,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved repeats per comparison (medians are reported)")
    ap.add_argument("--only", choices=["sampler", "sft", "trainer"], help="run one part")
    ap.add_argument("--json", "--out", dest="json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tok = build_tokenizer([render_chat(c) for c in addition_conversations(2000)], vocab_size=1024)
    cfg = tiny_qwen3_config(1024)
    cfg.initializer_range = 0.2  # a non-degenerate random policy (default init repeats its last token)
    model = build_model(cfg, seed=0)
    params = sum(p.numel() for p in model.parameters())
    new_tokens = 32 if args.quick else 128
    results: dict = {
        "command": " ".join(["python benchmarks/bench_policy.py", *sys.argv[1:]]),
        "machine_before": machine_state(),
        "threads": args.threads,
        "rounds": args.rounds,
        "params": params,
        "vocab": len(tok),
        "sampler": [],
        "sft": [],
        "trainer": [],
    }
    parts = {args.only} if args.only else {"sampler", "sft", "trainer"}
    for b in (1, 32, 128) if "sampler" in parts else ():
        r = bench_sampler(model, tok, b, new_tokens, args.rounds)
        results["sampler"].append(r)
        print(
            f"sampler  batch {b:4d}: ours {r['ours_tok_s']:8.0f} tok/s   HF generate {r['hf_generate_tok_s']:8.0f} "
            f"tok/s   x{r['speedup_vs_hf']:.2f}",
            flush=True,
        )
    for bt, bf16 in ((1024, False), (8192, False), (8192, True)) if "sft" in parts else ():
        r = bench_sft(tok, 200 if args.quick else 1000, bt, args.rounds, bf16)
        results["sft"].append(r)
        print(
            f"sft      batch_tokens {bt}{' bf16' if bf16 else ''}: {r['sft_tok_s']:8.0f} tok/s   "
            f"bare loop (fp32) {r['bare_loop_tok_s']:8.0f} tok/s   "
            f"x{r['ratio_vs_bare']:.2f}   ({r['tokens']} tokens, {r['conversations']} conversations)",
            flush=True,
        )
    for kl in (0.0, 0.01) if "trainer" in parts else ():
        r = bench_trainer(tok, 32 if args.quick else 128, kl, 4096, args.rounds)
        results["trainer"].append(r)
        print(
            f"trainer  kl_coef {kl}: {r['trainer_tok_s']:8.0f} tok/s   bare loop {r['bare_loop_tok_s']:8.0f} tok/s   "
            f"x{r['ratio_vs_bare']:.2f}",
            flush=True,
        )
    results["machine_after"] = machine_state()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
