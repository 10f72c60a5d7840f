"""The memory model's activation term (train.memory_model.saved_tensor_bytes) against the bytes autograd really saves
in one forward of the megatron GPTModel the backend builds (local layer spec), on the CPU, for a scaled-down Qwen3.

    python benchmarks/memory_model.py                      # a few shapes and lengths, ~1 minute on 2 cores
    python benchmarks/memory_model.py --out /tmp/mem.json  # also write the JSON report there

Measured: every tensor passed to `torch.autograd.graph.saved_tensors_hooks`' pack hook during `token_logprobs`'s
forward, counted once per storage (a saved view keeps its whole base alive) and not counting the parameters. That is
exactly what the model's kept activations + attention scores + the loss's fp32 softmax + the shared causal mask claim
to be; the transients (megatron's score buffer, the backward's workspace, the fp32 logits copy) are not saved tensors
and are not checked here. bf16 params (the GPU setting). CPU caveat: torch's CPU RMSNorm is the composite one
(`norm='composite'`), the CUDA one is fused (`norm='fused'`, the model's default): only the former is checked here.
Prints one JSON report: per case the predicted and measured bytes and their relative error; exit 1 when any is off by
more than --tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = [  # (layers, hidden, ffn, heads, kv heads, head dim, vocab, tied, rows, seq)
    (1, 64, 96, 4, 2, 32, 512, True, 1, 64),
    (2, 64, 96, 4, 2, 32, 512, True, 1, 128),
    (2, 64, 96, 4, 2, 32, 512, True, 2, 64),
    (2, 128, 384, 8, 2, 16, 1024, False, 1, 256),
    (3, 128, 384, 8, 4, 32, 1024, True, 3, 96),
    (2, 256, 512, 4, 4, 64, 2048, True, 1, 512),
]


def measure(case, ctx) -> int:
    import torch
    from transformers import Qwen3Config

    from train.backends.megatron_model import build_gpt_model, token_logprobs, transformer_config

    layers, h, f, a, g, d, v, tied, rows, seq = case
    hf = Qwen3Config(vocab_size=v, hidden_size=h, intermediate_size=f, num_hidden_layers=layers,
                     num_attention_heads=a, num_key_value_heads=g, head_dim=d, tie_word_embeddings=tied,
                     max_position_embeddings=4096)
    model = build_gpt_model(hf, transformer_config(hf, params_dtype=torch.bfloat16))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.02)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            saved[s.data_ptr()] = s.nbytes()
        return t

    tokens = torch.randint(0, v, (rows, seq + 1))  # token_logprobs runs on tokens[:, :-1]: seq positions
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp = token_logprobs(model, tokens, vocab_size=v)
    total = sum(saved.values())
    lp.sum().backward()  # the graph is a real one: it backpropagates
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--tolerance", type=float, default=0.02)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    from train.backends.megatron_parallel import init_parallel
    from train.memory_model import ModelShape, saved_tensor_bytes

    ctx = init_parallel(1, 1, "cpu")
    rows_out = []
    try:
        for case in CASES:
            layers, h, f, a, g, d, v, tied, rows, seq = case
            shape = ModelShape(layers, h, f, a, g, d, v, tied)
            predicted = saved_tensor_bytes(shape, rows=rows, seq=seq, act=2, norm="composite")
            measured = measure(case, ctx)
            rows_out.append({
                "shape": {"layers": layers, "hidden": h, "ffn_hidden": f, "heads": a, "kv_heads": g, "head_dim": d,
                          "vocab": v, "tied_embeddings": tied},
                "rows": rows, "seq": seq, "predicted_bytes": predicted, "measured_bytes": measured,
                "relative_error": predicted / measured - 1,
            })
    finally:
        ctx.close()
    worst = max(abs(r["relative_error"]) for r in rows_out)
    report = {"what": "saved-tensor bytes of one forward (megatron local spec, bf16, CPU, composite RMSNorm)",
              "tolerance": args.tolerance, "worst_relative_error": worst, "ok": worst <= args.tolerance,
              "cases": rows_out}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
