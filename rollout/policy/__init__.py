"""Policies: `local` (a tiny Qwen3 built from config, in process), `sglang`, `vllm` and `openai` (HTTP)."""

from rollout.policy.base import Completion, Message, Policy, SamplingParams, WeightUpdate

__all__ = ["Completion", "Message", "Policy", "SamplingParams", "WeightUpdate"]
