"""Token-exact multi-turn prompts: apply the chat template locally and never re-tokenize what the policy sampled.

Turn 1 of a conversation is the chat template applied to the messages. On later turns of the same session, the prompt
is the previous turn's exact `prompt_ids + output_ids`, then the template's end-of-turn tokens the model did not emit
itself (e.g. the newline after `<|im_end|>`, or `<|im_end|>` when it stopped on length), then the tokens of the new
messages (the tool result, the next user message) and the generation prompt. So the ids training sees for earlier turns
are the ids that were sampled, even where decoding and re-encoding the text would give other ids.

The delta for new messages comes from rendering them after a fixed probe conversation and subtracting the probe, which
works for templates that render each message independently of later ones (Qwen, Llama, ChatML ...). If the new messages
do not extend the session (history edited, an assistant message the policy did not write), it falls back to the full
template.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

_PROBE_TEXT = "\u2063probe\u2063"  # an unlikely string, to find where the template puts an assistant message's text
_PROBE_BASE = [{"role": "user", "content": "u"}]


def _plain(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the template sees them (role + content; images are not part of a text prompt)."""
    out = []
    for m in messages:
        d = {"role": m["role"], "content": m.get("content") or ""}
        for k in ("tool_calls", "name", "tool_call_id", "reasoning_content"):
            if m.get(k) is not None:
                d[k] = m[k]
        out.append(d)
    return out


def _key(messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    return [(str(m["role"]), str(m.get("content") or "")) for m in messages]


PROMPT_CACHE = 256  # whole-conversation prompts whose ids are kept (a batch's distinct first prompts)


@dataclass
class SessionState:
    messages: list[tuple[str, str]]  # (role, content) up to and including the assistant message just generated
    ids: list[int]  # prompt_ids + output_ids of that turn


@dataclass
class PromptIds:
    ids: list[int]
    incremental: bool  # built from the session's exact ids (True) or by templating everything (False)


class ChatTokenizer:
    """Builds prompt ids per session. `tokenizer` is a Hugging Face tokenizer with a chat template."""

    #: False: prompt ids per turn as before issue #33 (benchmarks/rollout_side.py's `--baseline` arms)
    lean: bool = True

    def __init__(self, tokenizer: Any, *, template_kwargs: Mapping[str, Any] | None = None, max_sessions: int = 1024):
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, SessionState] = OrderedDict()
        self.stats = {"incremental": 0, "full": 0, "mismatch": 0}
        self._prompts: OrderedDict[str, list[int]] = OrderedDict()  # full prompt text -> its ids (_encode_prompt)
        # a fast tokenizer's Rust backend, called directly: the same ids as tokenizer.encode(add_special_tokens=False)
        # (which calls it too) without the Python wrapping around it, a third of the cost per prompt
        backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        self._backend = backend if backend is not None and not getattr(tokenizer, "split_special_tokens", False) else None
        self._suffix_text = self._turn_suffix_text()
        self.turn_suffix = self.encode(self._suffix_text)

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            _plain(messages), add_generation_prompt=add_generation_prompt, tokenize=False, **self.template_kwargs
        )

    def encode(self, text: str) -> list[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _turn_suffix_text(self) -> str:
        """What the template writes after an assistant message's text (e.g. `<|im_end|>\\n`)."""
        text = self.render([*_PROBE_BASE, {"role": "assistant", "content": _PROBE_TEXT}], add_generation_prompt=False)
        at = text.rfind(_PROBE_TEXT)
        if at < 0:
            raise ValueError("the chat template drops assistant message text; cannot build token-exact prompts")
        return text[at + len(_PROBE_TEXT) :]

    def _delta_ids(self, new: Sequence[Mapping[str, Any]]) -> list[int] | None:
        """Ids of `new` messages (+ generation prompt) as the template renders them after an assistant turn.

        Only what follows the probe assistant's text is used, so templates that render an earlier assistant turn's
        opening differently (Qwen3 drops the empty think block once the turn is not the last) still work.
        """
        probe = [*_PROBE_BASE, {"role": "assistant", "content": _PROBE_TEXT}]
        after = self.render([*probe, *new], add_generation_prompt=True)
        at = after.find(_PROBE_TEXT)
        if at < 0:
            return None
        rest = after[at + len(_PROBE_TEXT) :]
        if not rest.startswith(self._suffix_text):
            return None
        return self.encode(rest[len(self._suffix_text) :])

    def prompt(self, messages: Sequence[Mapping[str, Any]], session: str | None = None) -> PromptIds:
        state = self._sessions.get(session) if session is not None else None
        if state is not None:
            n = len(state.messages)
            new = messages[n:]
            if _key(messages[:n]) == state.messages and new and all(m["role"] != "assistant" for m in new):
                delta = self._delta_ids(new)
                if delta is not None:
                    self._sessions.move_to_end(session)
                    self.stats["incremental"] += 1
                    return PromptIds(state.ids + self._close_turn(state.ids) + delta, True)
            self.stats["mismatch"] += 1
            log.debug("session %s: messages do not extend its last turn; templating the whole conversation", session)
        self.stats["full"] += 1
        return PromptIds(self._encode_prompt(self.render(messages, add_generation_prompt=True)), False)

    def _encode_prompt(self, text: str) -> list[int]:
        """A whole conversation's ids, from a small cache of the latest ones: a task's first prompt is the same for
        each of its n samples (and each evaluation), and encoding it is most of a first turn's CPU."""
        ids = self._prompts.get(text)
        if ids is None:
            ids = self._prompts[text] = self.encode(text)
            if len(self._prompts) > PROMPT_CACHE:
                self._prompts.popitem(last=False)
        else:
            self._prompts.move_to_end(text)
        return list(ids)  # the caller's own copy: the session state extends it

    def _close_turn(self, ids: Sequence[int]) -> list[int]:
        """The end-of-turn suffix ids the model did not produce itself (all of them if it stopped on length)."""
        suffix = self.turn_suffix
        for k in range(min(len(suffix), len(ids)), 0, -1):
            if list(ids[-k:]) == suffix[:k]:
                return suffix[k:]
        return list(suffix)

    def record(
        self,
        session: str | None,
        messages: Sequence[Mapping[str, Any]],
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        output_text: str,
    ) -> None:
        """Remember this turn so the next prompt of `session` continues from its exact ids."""
        if session is None:
            return
        state = SessionState(_key(messages) + [("assistant", output_text)], list(prompt_ids) + list(output_ids))
        self._sessions[session] = state
        self._sessions.move_to_end(session)
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)

    def end_session(self, session: str) -> None:
        self._sessions.pop(session, None)
