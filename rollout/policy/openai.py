"""`OpenAIPolicy`: a policy over an OpenAI-compatible chat completions server (the client is prm.client.openai_chat).

Messages may carry a screenshot under "image" (an H×W×3 uint8 array, a PIL image or PNG bytes): it is sent as an
`image_url` content part (a base64 PNG data URL), the vision message format OpenAI, vLLM and SGLang accept.

Token fidelity: the OpenAI API returns text and logprobs, not token ids. Servers that accept the `return_token_ids`
extension (vLLM, and `rollout.server.app`) also return `prompt_token_ids` and each choice's `token_ids`; the policy
then fills `Completion` exactly. Without them, the completion carries no ids (and says so once in the log): use
`policy=sglang` for training, where ids are exact by construction.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prm.client.openai_chat import ChatClientConfig, OpenAIChatClient
from prm.client.retry import RetryPolicy
from rollout.policy.base import Completion, Message, Policy, SamplingParams, WeightUpdate
from rollout.policy.export import export_update

log = logging.getLogger(__name__)


@dataclass
class OpenAIConfig(ChatClientConfig):
    """The `openai` policy: the chat client's options, and where trained weights go for the servers to load."""

    retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(timeout_s=600.0))  # per try: long generations
    model_path: str | None = None  # the served model's HF directory (the trainer's starting weights, config files)
    weights_dir: str | None = None  # where in-memory weight updates are written for the servers to load
    keep_weight_versions: int = 2


class OpenAIPolicy(Policy):
    """Policy over an OpenAI-compatible server: vision messages for GUI; exact ids where the server returns them."""

    def __init__(self, cfg: OpenAIConfig):
        self.cfg = cfg
        self.client = OpenAIChatClient(cfg, name="policy server")
        self.weight_version = 0
        self._warned_no_ids = False

    async def generate(
        self, messages: Sequence[Message], sampling: SamplingParams, session: str | None = None
    ) -> Completion:
        res = await self.client.chat(
            messages,
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            stop=sampling.stop,
            seed=sampling.seed,
            session=session,
        )
        c = res.choices[0]
        ids, lps = c.token_ids, c.logprobs
        if ids is None or lps is None or len(ids) != len(lps):
            if not self._warned_no_ids:
                log.warning(
                    "the server at %s returns no token ids with logprobs: completions carry no ids "
                    "(fine for evaluation; use policy=sglang for training)",
                    self.cfg.urls,
                )
                self._warned_no_ids = True
            ids, lps = [], []
        version = res.weight_version
        return Completion(
            text=c.text,
            prompt_ids=list(res.prompt_token_ids or []) if ids else [],
            output_ids=list(ids),
            output_logprobs=list(lps),
            finish_reason=c.finish_reason if c.finish_reason in ("stop", "length") else "stop",
            weight_version=int(version) if version is not None and str(version).isdigit() else self.weight_version,
        )

    def end_session(self, session: str) -> None:
        self.client.pool.end_session(session)

    async def health(self) -> dict[str, bool]:
        return await self.client.pool.check_health()

    async def update_weights(self, update: WeightUpdate) -> None:
        """OpenAI-compatible servers have no standard weight-update call: SGLang's is tried, and its answer checked."""
        path = update.path
        if path is None:
            if update.state_dict is None or not self.cfg.weights_dir:
                raise ValueError(
                    "a weight update for a server policy needs WeightUpdate.path, or a state_dict and "
                    "policy.weights_dir (a directory the servers can read)"
                )
            path = await export_update(update, self.cfg)
        results = await self.client.pool.broadcast(
            "update_weights_from_disk", {"model_path": path, "weight_version": str(update.version)}, root=True
        )
        bad = {u: r for u, r in results.items() if not (isinstance(r, Mapping) and r.get("success"))}
        if bad:
            raise RuntimeError(
                f"weight update v{update.version} failed on {sorted(bad)}: use policy=sglang for training"
            )
        self.weight_version = update.version

    async def close(self) -> None:
        await self.client.aclose()
