"""EchoEnv: type the letters of a word, one letter per step.

A small but complete NextState env: a deterministic bundled task set (`tasks(split)`), a reference conversation for SFT
(`demonstration(task)`), structured signals the rule judge reads (`parse_error`, `progress`, `error`), an outcome at the
end, and a step limit. Everything else (spaces, step bookkeeping, the gymnasium API) comes from envs.AgentEnv.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, ClassVar

from envs import ERROR, PARSE_ERROR, PROGRESS, AgentEnv, Transition

SEED = 7
N_TRAIN, N_EVAL = 500, 100
CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
SYSTEM_PROMPT = "Type the word you are given, one letter per turn. Answer with the single next letter only."


@lru_cache(maxsize=1)
def _words() -> tuple[list[str], list[str]]:
    """Unique pronounceable words (2-4 syllables) from a fixed seed; the first N_TRAIN train, the next N_EVAL eval."""
    rng = random.Random(SEED)
    seen: dict[str, None] = {}
    while len(seen) < N_TRAIN + N_EVAL:
        word = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(rng.randint(2, 4)))
        seen.setdefault(word)
    words = list(seen)
    return words[:N_TRAIN], words[N_TRAIN:]


class EchoEnv(AgentEnv):
    family: ClassVar[str] = "generic"  # no family-specific judge template: the rule judge reads the signals

    def __init__(self, *, max_steps: int = 12, success_reward: float = 1.0, failure_reward: float = 0.0, **kwargs: Any):
        super().__init__(max_steps=max_steps, **kwargs)
        self.success_reward = success_reward
        self.failure_reward = failure_reward
        self.typed = ""

    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[dict[str, Any]]:
        train, evals = _words()
        if split not in ("train", "eval"):
            raise ValueError(f"unknown split {split!r}: use 'train' or 'eval'")
        words = train if split == "train" else evals
        return [{"id": f"echo-{split}-{i:03d}", "word": w} for i, w in enumerate(words)]

    @classmethod
    def validate_task(cls, task: dict[str, Any]) -> dict[str, Any]:
        task = super().validate_task(task)
        word = task.get("word")
        if not isinstance(word, str) or not word.isalpha():
            raise ValueError(f"task {task['id']!r}: 'word' must be a non-empty string of letters, got {word!r}")
        return task

    def begin(self, task: dict[str, Any]) -> Transition:
        self.typed = ""
        return Transition(f"Type the word: {task['word']}", role="user", extra_info={"system_prompt": SYSTEM_PROMPT})

    def act(self, action: str) -> Transition:
        assert self.task is not None
        word: str = self.task["word"]
        letter = action.strip()
        if len(letter) != 1 or not letter.isalpha():
            return Transition(
                f"Could not parse {action[:40]!r}: answer with exactly one letter. Typed so far: {self.typed!r}",
                role="user",
                signals={PARSE_ERROR: True, PROGRESS: False, ERROR: False},
            )
        expected = word[len(self.typed)]
        if letter.lower() != expected:
            return Transition(
                f"Wrong letter {letter!r}: the word was {word!r}.",
                role="user",
                signals={PARSE_ERROR: False, PROGRESS: False, ERROR: True},
                outcome=self.failure_reward,
            )
        self.typed += expected
        done = self.typed == word
        return Transition(
            f"Typed so far: {self.typed}" + (" (done)" if done else ""),
            role="user",
            signals={PARSE_ERROR: False, PROGRESS: True, ERROR: False},
            outcome=self.success_reward if done else None,
        )

    def verify(self) -> float:
        return self.success_reward if self.task is not None and self.typed == self.task["word"] else self.failure_reward

    @classmethod
    def demonstration(cls, task: dict[str, Any]) -> list[dict[str, Any]]:
        """System, user, then one assistant letter per step with the env's real answer after each but the last."""
        word = cls.validate_task(dict(task))["word"]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Type the word: {word}"},
        ]
        for i, letter in enumerate(word):
            messages.append({"role": "assistant", "content": letter})
            if i < len(word) - 1:
                messages.append({"role": "user", "content": f"Typed so far: {word[: i + 1]}"})
        return messages
