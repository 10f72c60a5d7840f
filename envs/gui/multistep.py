"""Procedurally generated multi-step desktop tasks (`task_set=multistep`): Table 4's GUI analogue for a tiny text policy.

Two families over the bundled GTK apps, each step one action with a milestone the env checks after it:

- `form` (ns-form): "Sign up 'Member 48-21' with the email m48-21@post.net on the Pro plan[, ticking Subscribe to
  newsletter], then press Submit." Steps: click Name and type the name; click Email and type the email; click the plan;
  [tick Subscribe]; click Submit; DONE.
- `settings` (ns-settings), opening on a random state: "In the Settings window, turn on Dark mode, set the font size to
  17 and choose German, then press Apply." Steps: click the switch; set the font size (triple-click, type, Enter);
  click the language; click Apply; DONE.

Member codes ("95-12": 7,088 training ones, 1,012 held-out ones) and font sizes come from disjoint pools per split
(`train`: 4,000 tasks, `eval`: 64 held-out ones) that use the same number tokens (`digits=runs`: a 2-digit group is
one token), so held-out success needs copying the value from the task line, not memory. Every task lists its
milestones (`nextstate.progress`, in order) and its violations (`nextstate.violations`: checks that say a step went
wrong: a field holding another text, another plan or switch or language chosen, the changes discarded); the env turns
them into the `progress` / `wrong` signals the rule judge votes on.

Every step has one dominant mistake (`MISTAKES`): typing the name without its code, typing the name into the Email
field, clicking the other plan, pressing Clear instead of Submit, skipping the newsletter box; switching the
neighbouring switch, the other font size of the size's pair, the other language, Cancel instead of Apply. `GUINoise`
injects them into demonstrations with a given rate per step (the demonstration then goes on with the script, as an
agent that did not notice would), for a deliberately weak SFT start.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from envs.gui.task_builders import SETTINGS, SIGNUP, a11y_checked, a11y_text, execute, json_rules, launch, status, task

Task = dict[str, Any]
Step = Any  # a solution step (envs.gui.solution)

MULTISTEP_SEED = 17
N_TRAIN = 4000
N_EVAL = 64
FAMILIES = ("form", "settings")

# ----- value pools: train (index 0) and eval (index 1) never share a value, and use the same tokens -----
# Member codes: two 2-digit groups ("95-12"), each group one token with `digits=runs` (as the tool-call row's operands);
# the held-out codes are those whose groups sum to a multiple of 8, so both splits use every group token, and 7,088
# training codes are too many to memorize: the form must be copied from the task line.
CODES = tuple([f"{a}-{b}" for a in range(10, 100) for b in range(10, 100) if ((a + b) % 8 == 0) == held]
              for held in (False, True))
DOMAINS = ("example.com", "mail.org", "post.net", "home.io")  # a choice both splits make (the code is the value)
# Font sizes in pairs (the spin button takes 8-32): a task's size is one of a pair, its mistake the other one, so a
# mistaken size stays in the split's pool; the pairs alternate between the splits, so both use the same digits.
FONT_PAIRS = ([(8, 9), (12, 13), (16, 17), (20, 21), (24, 25), (28, 29)],
              [(10, 11), (14, 15), (18, 19), (22, 23), (26, 27), (30, 31)])
FONT_SIZES = tuple([s for pair in pairs for s in pair] for pairs in FONT_PAIRS)
PLANS = ("Pro", "Team")  # Free is the form's default, so a plan step always changes something
# (label, settings key): each task starts from a random state and flips one switch
SWITCHES = (("Dark mode", "dark_mode"), ("Notifications", "notifications"), ("Automatic updates", "auto_update"))
ALL_LANGUAGES = ("English", "German", "French")

# Short on purpose: a tiny policy reads it in every episode (the env's SYSTEM_PROMPT explains the element lines at length)
MULTISTEP_SYSTEM_PROMPT = "Act on the desktop: reply with one pyautogui action on the elements' @x,y, or DONE."

#: The dominant mistake of each step kind (what GUINoise injects), and the step kinds of each family in order.
MISTAKES = {
    "name": "code_missing",
    "email": "name_as_email",
    "plan": "other_plan",
    "subscribe": "skipped",
    "submit": "clear",
    "switch": "other_switch",
    "font": "neighbour_size",
    "language": "other_language",
    "apply": "cancel",
}


def _click(name: str, role: str | None = None) -> dict[str, Any]:
    return {"click": name, **({"role": role} if role else {})}


def _type_into(field_name: str, text: str) -> dict[str, Any]:
    """Click a text field and type into it, as one action."""
    return {"do": [_click(field_name, "text"), {"write": text}]}


@dataclass(frozen=True)
class PlannedStep:
    kind: str  # a key of MISTAKES, or "done"
    step: Step  # the right action
    mistake: Step | None  # the dominant wrong one (None: the step is left out, e.g. a skipped box)


def form_task(task_id: str, split: str, code: str, domain: str, plan: str, subscribe: bool) -> Task:
    name = f"Member {code}"
    email = f"m{code}@{domain}"
    other = PLANS[1 - PLANS.index(plan)]
    steps = [
        PlannedStep("name", _type_into("Name", name), _type_into("Name", "Member")),
        PlannedStep("email", _type_into("Email", email), _type_into("Email", name)),
        PlannedStep("plan", _click(plan, "radio button"), _click(other, "radio button")),
    ]
    if subscribe:
        steps.append(PlannedStep("subscribe", _click("Subscribe to newsletter"), None))
    steps += [PlannedStep("submit", _click("Submit"), _click("Clear")), PlannedStep("done", "DONE", None)]
    ticking = ", ticking Subscribe to newsletter" if subscribe else ""
    instruction = f"Sign up '{name}' with the email {email} on the {plan} plan{ticking}, then press Submit."
    milestones = [a11y_text("Name", name), a11y_text("Email", email), a11y_checked(plan)]
    if subscribe:
        milestones.append(a11y_checked("Subscribe to newsletter", "check-box"))
    milestones.append(status("Submitted"))
    violations = [_other_text("Name", name), _other_text("Email", email), a11y_checked(other), status("Form cleared"),
                  *([] if subscribe else [a11y_checked("Subscribe to newsletter", "check-box")])]
    expect = {"name": name, "email": email, "plan": plan, "subscribe": subscribe}
    t = task(task_id, split, instruction, [execute(f"rm -f {SIGNUP}"), launch("ns-form", "--out", SIGNUP)],
             json_rules(SIGNUP, "signup.json", expect), "Sign-up form", [s.step for s in steps], None, milestones,
             related=["ns-form"])
    labels = ["wrong_name", "wrong_email", "other_plan", "cleared", *([] if subscribe else ["unasked_subscribe"])]
    return _finish(t, "form", steps, violations, labels, {"name": name, "code": code, "email": email, "plan": plan,
                                                  "subscribe": subscribe})


def settings_task(task_id: str, split: str, initial: Mapping[str, Any], switch: int, size: int, language: str) -> Task:
    """Flip switch `switch` of SWITCHES, set the font size to `size`, choose `language`, Apply; the dialog opens on
    `initial` ({dark_mode, notifications, auto_update, font_size, language}, written to its config file first)."""
    label, key = SWITCHES[switch]
    value = not initial[key]
    other_label, other_key = SWITCHES[(switch + 1) % len(SWITCHES)]
    other_lang = next(lang for lang in ALL_LANGUAGES if lang not in (language, initial["language"]))
    if size == initial["font_size"] or language == initial["language"]:
        raise ValueError(f"task {task_id}: the font size and the language must change")
    font = "Font size"
    steps = [
        PlannedStep("switch", _click(label), _click(other_label)),
        PlannedStep("font", _set_font(size), _set_font(size ^ 1)),  # the other size of its pair
        PlannedStep("language", _click(language, "radio button"), _click(other_lang, "radio button")),
        PlannedStep("apply", _click("Apply"), _click("Cancel")),
        PlannedStep("done", "DONE", None),
    ]
    instruction = (f"In the Settings window, turn {'on' if value else 'off'} {label}, set the font size to {size} and "
                   f"choose {language}, then press Apply.")
    milestones = [_switch_is(label, value), a11y_text(font, str(size), role="spin-button"), a11y_checked(language),
                  status("Settings saved")]
    violations = [_switch_is(other_label, not initial[other_key]),
                  _other_text(font, str(size), "spin-button", skip=str(initial["font_size"])),
                  a11y_checked(other_lang), status("Changes discarded")]
    expect = {key: value, "font_size": size, "language": language}
    state = json.dumps(dict(initial), sort_keys=True)
    setup = [execute(f"mkdir -p $(dirname {SETTINGS}) && printf '%s\\n' '{state}' > {SETTINGS}"),
             launch("ns-settings", "--config", SETTINGS)]
    t = task(task_id, split, instruction, setup, json_rules(SETTINGS, "settings.json", expect), "Settings",
             [s.step for s in steps], None, milestones, related=["ns-settings"])
    labels = ["other_switch", "wrong_font_size", "other_language", "cancelled"]
    return _finish(t, "settings", steps, violations, labels, {"initial": dict(initial), "switch": label, "size": size,
                                                      "language": language})


def _set_font(size: int) -> dict[str, Any]:
    """Select the spin button's text, type the size, commit it with Enter (the shown value updates)."""
    return {"do": [{"click": "Font size", "role": "spin button", "clicks": 3}, {"write": str(size)}, {"press": "enter"}]}


def _switch_is(label: str, on: bool) -> dict[str, Any]:
    state = "[@st:checked='true']" if on else "[not(@st:checked='true')]"
    return {"func": "check_accessibility_tree", "result": {"type": "accessibility_tree"},
            "expected": {"type": "rule", "rules": [{"xpath": f"//check-box[@name='{label}']{state}"}]}}


def _other_text(name: str, text: str, role: str = "text", skip: str = "") -> dict[str, Any]:
    """A field that holds something other than `text` (and other than empty / `skip`, its untouched content)."""
    keep = f"[normalize-space(.) != '']" + (f"[normalize-space(.) != '{skip}']" if skip else "")
    return {"func": "check_accessibility_tree", "result": {"type": "accessibility_tree"},
            "expected": {"type": "rule", "rules": [{"xpath": f"//{role}[@name='{name}']{keep}[. != '{text}']"}]}}


def _finish(t: Task, family: str, steps: Sequence[PlannedStep], violations: list[dict], labels: list[str],
            params: dict) -> Task:
    """`labels` name the violations (the env's `mistake` signal says which one a step made true)."""
    assert len(labels) == len(violations)
    t["source"] = "nextstate multistep"
    ns = t["nextstate"]
    ns.pop("wrong")
    ns["violations"] = violations
    ns["multistep"] = {"family": family, "params": params, "kinds": [s.kind for s in steps],
                       "mistakes": [s.mistake for s in steps], "violation_labels": labels}
    return t


# ----- the bundled sets -----
def generate(split: str, n: int, seed: int = MULTISTEP_SEED) -> list[Task]:
    """`n` distinct tasks of `split`, alternating the families; values from that split's pools only."""
    if split not in ("train", "eval"):
        raise ValueError(f"multistep tasks exist for train and eval, not {split!r}")
    pool = 0 if split == "train" else 1
    rng = random.Random(f"{seed}-{split}")
    out: list[Task] = []
    seen: set[str] = set()
    while len(out) < n:
        family = FAMILIES[len(out) % len(FAMILIES)]
        tid = f"ns-ms-{family}-{split}-{len(out):05d}"
        if family == "form":
            t = form_task(tid, split, rng.choice(CODES[pool]), rng.choice(DOMAINS),
                          rng.choice(PLANS), rng.random() < 0.5)
        else:
            initial = {key: rng.random() < 0.5 for _, key in SWITCHES}
            start, size = rng.sample(FONT_SIZES[pool], 2)
            if size ^ 1 == start:  # the mistaken size would read as the untouched field: no `wrong` signal
                continue
            first_lang, language = rng.sample(ALL_LANGUAGES, 2)
            initial.update(font_size=start, language=first_lang)
            t = settings_task(tid, split, initial, rng.randrange(len(SWITCHES)), size, language)
        key = json.dumps([t["instruction"], t["nextstate"]["multistep"]["params"]], sort_keys=True)
        if key in seen:  # the same task (a settings task also by its starting state)
            continue
        seen.add(key)
        out.append(t)
    return out


@lru_cache(maxsize=2)
def _bundled(split: str) -> tuple[Task, ...]:
    return tuple(generate(split, N_TRAIN if split == "train" else N_EVAL))


def multistep_tasks(split: str = "train") -> list[Task]:
    """The bundled multistep set: `train` 4,000 tasks, `eval` 64 held-out ones (fresh copies)."""
    import copy

    return [copy.deepcopy(t) for t in _bundled(split)]


def is_multistep(task: Mapping[str, Any]) -> bool:
    return isinstance(task.get("nextstate", {}).get("multistep"), Mapping)


def mistake_label(task: Mapping[str, Any], new_violations: Sequence[bool], progress: bool) -> str:
    """A step's `mistake` signal: the first violation it made true, else "ok" (a milestone reached) or "no_progress"."""
    for label, new in zip(task["nextstate"]["multistep"]["violation_labels"], new_violations):
        if new:
            return label
    return "ok" if progress else "no_progress"


# ----- noisy demonstrations -----
@dataclass(frozen=True)
class GUINoise:
    """Each step's dominant mistake (MISTAKES) with probability `rate` (or `rates[kind]`), drawn per task from `seed`."""

    rate: float = 0.0
    rates: Mapping[str, float] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "rates", dict(self.rates))
        unknown = sorted(set(self.rates) - set(MISTAKES))
        if unknown:
            raise ValueError(f"GUINoise.rates: unknown step kinds {unknown}; known: {', '.join(MISTAKES)}")
        if not all(0.0 <= r <= 1.0 for r in [self.rate, *self.rates.values()]):
            raise ValueError(f"mistake rates must be in [0, 1], got rate={self.rate}, rates={dict(self.rates)}")

    def draws(self, task_id: str, kinds: Sequence[str]) -> list[bool]:
        digest = hashlib.sha256(f"{self.seed}:{task_id}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        return [rng.random() < self.rates.get(k, self.rate) and k in MISTAKES for k in kinds]


def scripted_steps(task: Mapping[str, Any], noise: GUINoise | None = None) -> tuple[list[Step], list[str]]:
    """The steps a (noisy) demonstration plays, and the label of each: "ok" or the injected mistake."""
    ms = task["nextstate"]["multistep"]
    draws = noise.draws(str(task["id"]), ms["kinds"]) if noise else [False] * len(ms["kinds"])
    steps, labels = [], []
    for kind, right, wrong, hit in zip(ms["kinds"], task["nextstate"]["solution"], ms["mistakes"], draws):
        if not hit:
            steps.append(right)
            labels.append("ok")
        elif wrong is not None:
            steps.append(wrong)
            labels.append(MISTAKES[kind])
        # a mistake without an action (a skipped box) leaves the step out
    return steps, labels


# ----- what each turn of a (noisy) demonstration did, in the env's `mistake` signal's words -----
#: The violation label a step's dominant mistake makes true (the `mistake` signal the env gives a live step).
MISTAKE_SIGNALS = {"name": "wrong_name", "email": "wrong_email", "plan": "other_plan", "submit": "cleared",
                   "switch": "other_switch", "font": "wrong_font_size", "language": "other_language",
                   "apply": "cancelled"}
_ELEMENT_LINE = re.compile(r'^[a-z ]+? "(?P<name>[^"]*)".*@(?P<x>\d+),(?P<y>\d+)$')
_CLICK = re.compile(r"pyautogui\.(?:click|tripleClick)\((\d+), (\d+)\)")
_WRITE = re.compile(r"pyautogui\.write\('((?:[^'\\]|\\.)*)'\)")


def label_conversation(task: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The label of every assistant turn of a multistep conversation: "ok" for the step's right action, the
    `mistake` signal its dominant mistake gives (MISTAKE_SIGNALS), and for the closing DONE "ok" or "unsolved" (after
    any mistake). Read from the turn's action and the element coordinates of the observation before it; a skipped
    box (the subscribe step's mistake) leaves no turn, so the next turn is matched to the next step."""
    ms = task["nextstate"]["multistep"]
    params, kinds = ms["params"], list(ms["kinds"])
    right = {"name": params.get("name"), "email": params.get("email"), "plan": params.get("plan"),
             "subscribe": "Subscribe to newsletter", "submit": "Submit", "switch": params.get("switch"),
             "font": str(params.get("size")), "language": params.get("language"), "apply": "Apply"}
    labels: list[str] = []
    at: dict[tuple[int, int], str] = {}
    k = 0
    for m in messages:
        content = str(m.get("content", ""))
        if m.get("role") == "user":
            at = {(int(g["x"]), int(g["y"])): g["name"] for g in map(_ELEMENT_LINE.match, content.splitlines()) if g}
            continue
        if m.get("role") != "assistant" or k >= len(kinds):
            continue
        click = _CLICK.search(content)
        written = _WRITE.search(content)
        did = written.group(1) if written else (at.get((int(click[1]), int(click[2]))) if click else content.strip())
        if kinds[k] == "subscribe" and did != right["subscribe"]:
            k += 1  # the box was skipped: this turn is the next step's
        kind = kinds[k]
        if kind == "done":
            labels.append("ok" if all(label == "ok" for label in labels) and len(labels) == len(kinds) - 1
                          else "unsolved")
        else:
            labels.append("ok" if did == right[kind] else MISTAKE_SIGNALS.get(kind, "no_progress"))
        k += 1
    return labels


__all__ = ["FAMILIES", "GUINoise", "MULTISTEP_SYSTEM_PROMPT", "MISTAKES", "form_task", "generate", "is_multistep",
           "label_conversation", "mistake_label", "multistep_tasks", "scripted_steps", "settings_task"]
