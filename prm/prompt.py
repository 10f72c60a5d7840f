"""Judge prompt templates: one text file per env family, rendered from a StepContext with bounded context.

A template file has a `[system]` section (optional) and a `[user]` section, written with `$placeholders`
(Python `string.Template`; write `$$` for a literal dollar sign):

  $instruction      the task as the agent first saw it (SWE: the issue text)
  $history          earlier messages of the episode (head and tail kept, the middle replaced by a marker)
  $step_number      1-based number of the step being judged ($step_index: 0-based)
  $action           the policy's full output for this step
  $next_state       the env's answer (its text content); $next_state_role: "tool" | "user"
  $exit_code        the exit / return code from the env's signals ("unknown" when the env gave none)
  $signals          the env's structured signals, as "key=value" pairs
  $image_before     GUI: the screenshot before the action (an image in the message; "(no screenshot)" if absent)
  $image_after      GUI: the screenshot after it
  $family, $task_id

Templates are looked up by family name under `prm/templates/` (or a directory of your own), falling back to
`generic.txt`; a single file can be forced with `judge.template=path`. The hint templates (directive signals) are
looked up the same way under `prm/templates/hints/` (`judge.hint_template=path` forces one).
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.spaces import truncate_middle

TEMPLATES_DIR = Path(__file__).with_name("templates")
FALLBACK = "generic"
PLACEHOLDERS = frozenset(
    {
        "instruction",
        "history",
        "step_number",
        "step_index",
        "action",
        "next_state",
        "next_state_role",
        "exit_code",
        "signals",
        "image_before",
        "image_after",
        "family",
        "task_id",
    }
)
IMAGE_SLOTS = ("image_before", "image_after")
_SECTION = re.compile(r"^\[(system|user)\]\s*$", re.MULTILINE)
_EXIT_CODE_KEYS = ("exit_code", "returncode", "return_code", "exit_status")


class TemplateError(ValueError):
    """A template file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class JudgeTemplate:
    name: str
    system: str
    user: str
    source: str  # the file it came from
    digest: str  # of the text: part of the judge cache key

    @classmethod
    def parse(cls, text: str, *, name: str, source: str) -> JudgeTemplate:
        pieces = _SECTION.split(text)
        if pieces[0].strip():
            raise TemplateError(f"{source}: text before the first [system] or [user] section header")
        sections: dict[str, str] = {}
        for kind, body in zip(pieces[1::2], pieces[2::2]):
            if kind in sections:
                raise TemplateError(f"{source}: more than one [{kind}] section")
            sections[kind] = body.strip("\n")
        if not sections.get("user", "").strip():
            raise TemplateError(f"{source}: a template needs a non-empty [user] section")
        for kind, body in sections.items():
            try:
                names = {
                    m.group("named") or m.group("braced")
                    for m in string.Template.pattern.finditer(body)
                    if m.group("named") or m.group("braced")
                }
                bad = [m.group(0) for m in string.Template.pattern.finditer(body) if m.group("invalid") is not None]
            except (ValueError, TypeError) as exc:
                raise TemplateError(f"{source} [{kind}]: {exc}") from exc
            unknown = sorted(names - PLACEHOLDERS)
            if unknown or bad:
                raise TemplateError(
                    f"{source} [{kind}]: unknown placeholder(s) {unknown or bad}; known: {sorted(PLACEHOLDERS)} "
                    "(write $$ for a literal $)"
                )
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        return cls(name, sections.get("system", ""), sections["user"], source, digest)

    @classmethod
    def load(cls, path: str | Path) -> JudgeTemplate:
        p = Path(path)
        if not p.is_file():
            raise TemplateError(f"judge template {p} does not exist")
        return cls.parse(p.read_text(encoding="utf-8"), name=p.stem, source=str(p))


class TemplateSet:
    """Templates by family: `override` (one file for everything), else `<dir>/<family>.txt`, else generic.txt.
    `kind` names a subdirectory of each directory: "" for the score templates, "hints" for the hint templates."""

    def __init__(self, templates_dir: str | Path | None = None, override: str | Path | None = None, kind: str = ""):
        self.dirs = [Path(templates_dir) / kind] if templates_dir else []
        self.dirs.append(TEMPLATES_DIR / kind)
        self.override = JudgeTemplate.load(override) if override else None
        self._cache: dict[str, JudgeTemplate] = {}

    def for_family(self, family: str) -> JudgeTemplate:
        if self.override is not None:
            return self.override
        if family not in self._cache:
            self._cache[family] = self._find(family)
        return self._cache[family]

    def _find(self, family: str) -> JudgeTemplate:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", family or FALLBACK)
        for name in (safe, FALLBACK):
            for d in self.dirs:
                p = d / f"{name}.txt"
                if p.is_file():
                    return JudgeTemplate.load(p)
        raise TemplateError(f"no judge template for family {family!r} and no {FALLBACK}.txt in {self.dirs}")


@dataclass(frozen=True)
class ContextLimits:
    """How much of a step the judge sees (characters; messages for history)."""

    instruction_chars: int = 4000
    action_chars: int = 4000
    next_state_chars: int = 4000
    history_head: int = 2  # earliest messages kept (after the instruction)
    history_tail: int = 6  # latest messages kept
    message_chars: int = 1200  # per history message


@dataclass
class RenderedPrompt:
    """Chat messages for the judge (OpenAI content parts; images as arrays until sent) and a cache key."""

    messages: list[dict[str, Any]]
    key: str
    images: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


def format_signals(signals: Mapping[str, Any]) -> str:
    """`key=value` pairs; keys whose value is None (not applicable to this step) are left out."""
    items = [(k, v) for k, v in sorted(signals.items(), key=lambda kv: str(kv[0])) if v is not None]
    return ", ".join(f"{k}={v}" for k, v in items) if items else "(none)"


def exit_code(signals: Mapping[str, Any]) -> str:
    for k in _EXIT_CODE_KEYS:
        if signals.get(k) is not None:
            return str(signals[k])
    return "unknown"


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            p.get("text", "[image]" if p.get("type") != "text" else "") for p in content if isinstance(p, Mapping)
        )
    return "" if content is None else str(content)


def format_history(history: Sequence[Mapping[str, Any]], limits: ContextLimits) -> str:
    """Earlier messages after the instruction: head and tail kept, each shortened, the middle replaced by a marker."""
    msgs = [m for m in history if m.get("role") != "system"]
    if msgs and msgs[0].get("role") == "user":
        msgs = msgs[1:]  # the instruction, shown on its own
    if not msgs:
        return "(none: this is the first step)"
    keep_head, keep_tail = max(limits.history_head, 0), max(limits.history_tail, 0)
    omitted = 0
    if len(msgs) > keep_head + keep_tail:
        omitted = len(msgs) - keep_head - keep_tail
        msgs_view: list[Mapping[str, Any] | None] = [*msgs[:keep_head], None, *msgs[len(msgs) - keep_tail :]]
    else:
        msgs_view = list(msgs)
    step = 0
    lines = []
    for m in msgs_view:
        if m is None:
            lines.append(f"[... {omitted} earlier messages omitted ...]")
            step += sum(1 for x in msgs[keep_head : keep_head + omitted] if x.get("role") == "assistant")
            continue
        role = m.get("role", "?")
        if role == "assistant":
            step += 1
            label = f"[agent, step {step}]"
        else:
            label = f"[{role}]"
        text, _ = truncate_middle(_content_text(m.get("content")), limits.message_chars)
        if m.get("image") is not None:
            text += "\n(a screenshot was shown here)"
        lines.append(f"{label}\n{text}")
    return "\n\n".join(lines)


def _image_digest(img: Any) -> str:
    import numpy as np

    if isinstance(img, (bytes, bytearray, str)):
        data = img.encode() if isinstance(img, str) else bytes(img)
        return hashlib.sha256(data).hexdigest()[:16]
    arr = np.ascontiguousarray(np.asarray(img))
    h = hashlib.sha256(arr.tobytes())
    h.update(str((arr.shape, arr.dtype.str)).encode())
    return h.hexdigest()[:16]


def render(template: JudgeTemplate, ctx: Any, limits: ContextLimits, *, images: bool = True) -> RenderedPrompt:
    """The judge's chat messages for one step (`ctx` is a prm.judge.StepContext)."""
    next_state = ctx.next_state or {}
    values = {
        "instruction": truncate_middle(ctx.instruction or "", limits.instruction_chars)[0],
        "history": format_history(ctx.history or [], limits),
        "step_number": str(ctx.step_index + 1),
        "step_index": str(ctx.step_index),
        "action": truncate_middle(ctx.action or "", limits.action_chars)[0],
        "next_state": truncate_middle(_content_text(next_state.get("content")), limits.next_state_chars)[0],
        "next_state_role": str(next_state.get("role", "")),
        "exit_code": exit_code(ctx.signals or {}),
        "signals": format_signals(ctx.signals or {}),
        "family": ctx.family,
        "task_id": ctx.task_id,
    }
    pictures = {"image_before": ctx.image_before, "image_after": ctx.image_after}
    sentinel = {slot: f"\x00{slot}\x00" for slot in IMAGE_SLOTS}
    key = hashlib.sha256(template.digest.encode())
    messages: list[dict[str, Any]] = []
    n_images = 0
    for role, body in (("system", template.system), ("user", template.user)):
        if not body.strip():
            continue
        text = string.Template(body).substitute({**values, **sentinel})
        parts: list[dict[str, Any]] = []
        for chunk in re.split(r"(\x00image_(?:before|after)\x00)", text):
            if not chunk:
                continue
            slot = chunk.strip("\x00") if chunk.startswith("\x00") else None
            if slot is None:
                parts.append({"type": "text", "text": chunk})
                key.update(chunk.encode())
            elif images and pictures[slot] is not None:
                parts.append({"type": "image", "image": pictures[slot]})
                key.update(f"<{slot}:{_image_digest(pictures[slot])}>".encode())
                n_images += 1
            else:
                parts.append({"type": "text", "text": "(no screenshot)"})
                key.update(b"(no screenshot)")
        if all(p["type"] == "text" for p in parts):
            messages.append({"role": role, "content": "".join(p["text"] for p in parts)})
        else:
            messages.append({"role": role, "content": _merge_text(parts)})
        key.update(b"\x01")
    return RenderedPrompt(messages, key.hexdigest(), n_images, {"template": template.source})


def _merge_text(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in parts:
        if p["type"] == "text" and out and out[-1]["type"] == "text":
            out[-1] = {"type": "text", "text": out[-1]["text"] + p["text"]}
        else:
            out.append(p)
    return out
