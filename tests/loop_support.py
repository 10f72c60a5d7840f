"""A small real setup for the loop tests: an env whose rewards depend on the action, a tiny local policy and trainer.

`ParityEnv` (registered as "loop_parity"): `steps` steps per episode; a step whose action has an even number of
characters shows progress (the rule judge scores it +1, else 0); the outcome is 1.0 when most steps were even. So
rewards vary with what the policy samples, and the step-index buckets have variance (gradients flow).
The spies that wrap the real trainer / policy (RecordingTrainer, FlakyUpdatesPolicy) are in tests/doubles.py.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import envs
from doubles import RecordingTrainer
from envs.base import AgentEnv, Transition
from prm.judge import RuleJudge
from rollout.farm.core import FarmConfig, make_farm
from rollout.policy.base import SamplingParams
from rollout.policy.local import LocalPolicy
from rollout.policy.local_config import LocalPolicyConfig
from train.tiny import build_model, build_tokenizer, render_chat, tiny_qwen3_config
from rollout.records import read_jsonl
from train.backends.torch_backend import TorchTrainer
from train.config import TorchTrainerConfig
from train.batch import RewardConfig
from rollout.loop import LoopConfig, RLLoop, RunWriter
from toy_conversations import addition_conversations


class ParityEnv(AgentEnv):
    def __init__(self, **kw: Any):
        super().__init__(max_steps=8, tasks=self.tasks(), **kw)
        self.even = 0

    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[dict]:
        return [{"id": f"p{i}", "steps": 2 + i % 2} for i in range(6)]

    def begin(self, task: dict) -> Transition:
        self.even = 0
        return Transition(f"task {task['id']}: answer with an even number of characters", role="user")

    def act(self, action: str) -> Transition:
        even = len(action) % 2 == 0
        self.even += even
        n = int((self.task or {}).get("steps", 2))
        done = self.step_index >= n
        return Transition(
            f"step {self.step_index}: {'even' if even else 'odd'}",
            signals={"progress": even},
            outcome=(1.0 if 2 * self.even > n else 0.0) if done else None,
        )

    def verify(self) -> float:
        return 0.0


def register() -> None:
    envs.register("loop_parity", ParityEnv, overwrite=True)


_TOKENIZER = None


def tiny_policy_and_model(seed: int = 0):
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = build_tokenizer([render_chat(c) for c in addition_conversations(40)], vocab_size=320)
    tok = _TOKENIZER
    cfg = tiny_qwen3_config(
        len(tok),
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    model = build_model(cfg, seed=seed)
    policy = LocalPolicy(copy.deepcopy(model), tok, LocalPolicyConfig(max_batch=32, max_prompt_tokens=384, seed=seed))
    return policy, model, tok


def run_loop(out: Path, *, policy=None, trainer=None, timeline=None, **loop_kw):
    """RLLoop on a local farm of ParityEnvs with the tiny policy / torch trainer; returns (summary or exception, rows,
    steps, trainer)."""
    register()
    base_policy, model, tok = tiny_policy_and_model()
    policy = policy(base_policy) if callable(policy) else base_policy
    trainer = (
        trainer(TorchTrainer(model, TorchTrainerConfig(lr=1e-3, kl_coef=0.0), tok))
        if trainer
        else RecordingTrainer(TorchTrainer(model, TorchTrainerConfig(lr=1e-3, kl_coef=0.0), tok))
    )
    cfg = LoopConfig(
        **{
            "iterations": 3,
            "tasks_per_iteration": 3,
            "samples_per_task": 3,
            "eval_tasks": 0,
            "record_token_ids": True,
            **loop_kw,
        }
    )

    async def main():
        farm = make_farm("loop_parity", {}, FarmConfig(backend="local", num_envs=9))
        await farm.start()
        writer = RunWriter(out, cfg.record_token_ids)
        try:
            loop = RLLoop(
                farm=farm,
                policy=policy,
                judge=RuleJudge(),
                trainer=trainer,
                reward_cfg=RewardConfig(),
                loop_cfg=cfg,
                sampling=SamplingParams(max_new_tokens=6),
                run_id="t",
                train_tasks=ParityEnv.tasks(),
                eval_tasks=[],
                writer=writer,
                timeline=timeline,
            )
            try:
                return await loop.run()
            except Exception as exc:  # the caller checks what the loop left behind
                return exc
        finally:
            writer.close()
            await farm.close()
            await policy.close()

    result = asyncio.run(main())
    metrics = read_jsonl(out / "metrics.jsonl")
    steps = read_jsonl(out / "trajectories.jsonl") if (out / "trajectories.jsonl").exists() else []
    return result, metrics, steps, trainer
