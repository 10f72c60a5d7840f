"""GUIEnv: OSWorld-style desktop tasks as a NextState env (family "gui").

Observation: `{"role": "user", "content": <task + windows + actionable elements with coordinates>, "image": HxWx3 uint8}`.
Action: pyautogui code (`pyautogui.click(62, 171)`), a computer_13 dict as JSON, or WAIT / DONE / FAIL. DONE and FAIL
end the episode and run the task's evaluator (OSWorld's rules: FAIL scores 1 only on an infeasible task); the step limit
truncates and evaluates the state as it is. Signals for the judge: `parse_error`, `error` (the action ran and raised or
timed out), `screen_changed`, `progress` (a task milestone newly reached; DONE / FAIL: the task scored 1), `wrong` (a
violation check of the task newly true, a reached milestone undone; DONE / FAIL: the task scored below 1),
`milestones` ("k/n").

Backends (`backend=`): `local` (an Xvfb desktop on this machine, the default, in a throwaway-root sandbox unless
`isolation=none`), `osworld` (a running OSWorld guest API at `osworld_url`: a real OSWorld VM or our guest server),
`docker` (our guest server in a container per env).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces

from envs.base import ERROR, PARSE_ERROR, PROGRESS, WRONG, AgentEnv, NoDemonstration, Transition, class_or_instance
from envs.cache import cache_dir
from envs.gui.evaluator import Evaluation, describe_check, evaluate, partial_checks
from envs.gui.getters import EvalContext
from envs.gui.observation import Element, parse_a11y, render
from envs.gui.setup_steps import SetupContext, run_steps
from envs.gui.solution import SolutionError, awaited, is_wait_step, max_waits, resolve_step, wait_is_over
from envs.gui.app_tasks import app_tasks
from envs.gui.tasks import APPS_BIN, Task, bundled_tasks, files_dir_for, validate_task
from envs.options import from_options
from envs.runtime.actions import ActionParseError, parse_action
from envs.runtime.desktop import DesktopError, GuestDesktop, WindowInfo
from envs.gui.osworld_tasks import load_osworld_examples
from envs.gui.app_models import Layout, model_for
from envs.gui.multistep import (
    MULTISTEP_SYSTEM_PROMPT,
    GUINoise,
    is_multistep,
    label_conversation,
    mistake_label,
    multistep_tasks,
    scripted_steps,
)

TASK_SETS = ("bundled", "multistep", "apps")
MISTAKE = "mistake"  # multistep tasks: what a step did (a violation's label, "ok", "no_progress"), as toolcall's signal

log = logging.getLogger(__name__)

OBSERVATION_VERSION = 2  # bump when the observation text changes (keys the demonstration cache)
SCREEN_CHANGED = "screen_changed"

SYSTEM_PROMPT = (
    "You control a Linux desktop. Each observation lists the windows and the on-screen elements as "
    'role "name" = value [state] @x,y (the element\'s centre). Reply with exactly one action: pyautogui code such as '
    "pyautogui.click(x, y), pyautogui.write('text'), pyautogui.press('enter'), pyautogui.hotkey('ctrl', 's'); "
    "or WAIT; or DONE when the task is complete; or FAIL if it cannot be done."
)


@dataclass
class GUIConfig:
    backend: str = "local"  # "local" | "osworld" | "docker"
    task_set: str = "bundled"  # the bundled tasks drawn from: "bundled" (envs.gui.tasks) | "multistep" (envs.gui.multistep)
    # | "apps" (the per-domain app tasks, envs.gui.app_tasks)
    isolation: str = "sandbox"  # local: "sandbox" (throwaway root, see envs.runtime.desktop) | "none" (unsandboxed)
    fresh_root_per_episode: bool = True  # local sandbox: a new sandbox per episode (False: reset inside it, faster)
    osworld_url: str | None = None  # backend=osworld: http://host:5000 or unix:///path/to/guest.sock
    docker_host: str | None = None  # backend=docker: the engine (default: DOCKER_HOST)
    docker_image: str | None = None  # backend=docker: guest image tag (default: envs.runtime.guest_image's recipe)
    docker_fresh_container: bool = True  # backend=docker: a new container per episode (else reset the session inside)
    screen_width: int = 1280
    screen_height: int = 800
    window_manager: str | None = None  # local: None or "openbox" (task_set=apps: openbox unless set, see below)
    action_space: str = "any"  # "pyautogui" | "computer_13" | "any"
    action_timeout_s: float = 10.0
    wait_s: float = 1.0  # what WAIT waits
    settle_min_s: float = 0.05  # after an action: wait at least this, then until two screenshots agree
    settle_max_s: float = 1.5
    settle_interval_s: float = 0.03
    ready_timeout_s: float = 30.0  # the task's ready window must appear within this after setup
    progress_checks: bool = True  # evaluate the task's milestones after every step (the progress signal)
    max_elements: int = 60  # elements listed in the observation text
    repeat_task: bool = True  # the task line in every observation (False: in the first one only)
    compact_observation: bool = False  # element lines, then the task line; no window list, headers, "[unchecked]"
    client_password: str = "password"  # OSWorld's {CLIENT_PASSWORD}
    accessibility: bool = True
    # local sandbox / docker: packages added to the desktop's guest root (local .deb paths or package names), from
    # Debian's mirror or guest_apt_sources (apt lines a connected machine can reach); its own cached root, built once
    guest_packages: tuple[str, ...] = ()
    guest_apt_sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.backend not in ("local", "osworld", "docker"):
            raise ValueError(f"gui backend={self.backend!r}: use local, osworld or docker")
        if self.task_set not in TASK_SETS:
            raise ValueError(f"gui task_set={self.task_set!r}: use one of {', '.join(TASK_SETS)}")
        if self.isolation not in ("sandbox", "none"):
            raise ValueError(f"gui isolation={self.isolation!r}: use sandbox (the default) or none (unsandboxed)")
        if self.backend == "osworld" and not self.osworld_url:
            raise ValueError("gui backend=osworld needs osworld_url (http://host:port or unix:///path.sock)")
        if self.action_space not in ("pyautogui", "computer_13", "any"):
            raise ValueError(f"action_space={self.action_space!r}: use pyautogui, computer_13 or any")
        if self.task_set == "apps" and self.window_manager is None:
            # the apps' dialogs (GIMP's export, VLC's and Thunderbird's settings) get the keyboard focus only from a
            # window manager, as on OSWorld's GNOME: without one it stays on the window the task launched
            self.window_manager = "openbox"
        self.guest_packages = _str_tuple(self.guest_packages)
        self.guest_apt_sources = _str_tuple(self.guest_apt_sources)
        if self.guest_packages or self.guest_apt_sources:
            where = ("backend=osworld (the VM is yours to provision)" if self.backend == "osworld"
                     else "isolation=none (there is no guest root: apps come from this machine)"
                     if self.backend == "local" and self.isolation == "none"
                     else "docker_image (an image of your own: build it with them)" if self.docker_image else None)
            if where:
                raise ValueError(f"gui guest_packages cannot be used with {where}")
            try:
                self.guest_recipe()  # checks the .deb files, names and source lines now, not at the first reset
            except ValueError as e:
                raise ValueError(f"gui {e}") from None

    def guest_recipe(self):
        """The recipe of the desktop's guest root (envs.runtime.guest_image.guest_recipe), None without additions."""
        if not self.guest_packages and not self.guest_apt_sources:
            return None
        from envs.runtime.guest_image import guest_recipe

        return guest_recipe(self.guest_packages, self.guest_apt_sources)


def _str_tuple(value: Any) -> tuple[str, ...]:
    """A list option as a tuple of strings (one string alone, e.g. `env.guest_packages=code`, is a list of one)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value.strip() else ()
    return tuple(str(v) for v in value)


def guest_programs(cfg: GUIConfig) -> Callable[[str], bool] | None:
    """Whether the desktop `cfg` makes has a program, known without starting one: this machine's PATH unsandboxed,
    the guest root's PATH directories once that root is unpacked; None where it is not known here (an OSWorld VM, a
    root not built yet, a docker guest), and the task's setup then refuses an app the desktop lacks."""
    if cfg.backend == "local" and cfg.isolation == "none":
        return lambda prog: shutil.which(prog) is not None
    if cfg.backend != "local":
        return None
    from envs.runtime.desktop_place import SANDBOX_PATH
    from envs.runtime.sandbox_root import sandbox_root_dir

    done = sandbox_root_dir(cfg.guest_recipe())
    if not (done / ".complete").exists():
        return None
    root = done / "root"
    return lambda prog: any(os.path.lexists(f"{root}{d}/{prog}") for d in SANDBOX_PATH.split(":"))


def make_desktop(cfg: GUIConfig) -> GuestDesktop:
    if cfg.backend == "local":
        from envs.runtime.desktop import DesktopConfig, LocalDesktop

        return LocalDesktop(
            DesktopConfig(
                isolation=cfg.isolation,
                fresh_root_per_episode=cfg.fresh_root_per_episode,
                width=cfg.screen_width,
                height=cfg.screen_height,
                window_manager=cfg.window_manager,
                accessibility=cfg.accessibility,
                path_prepend=(str(APPS_BIN),),
                action_timeout_s=cfg.action_timeout_s,
                open_with={"dir": ["ns-files"], "text": ["ns-editor"]},
                root_recipe=cfg.guest_recipe(),
            )
        )
    if cfg.backend == "osworld":
        from envs.runtime.osworld import OSWorldClient

        return OSWorldClient(cfg.osworld_url, action_timeout_s=cfg.action_timeout_s)
    from envs.runtime.osworld_docker import DockerGuest, DockerGuestConfig

    return DockerGuest(
        DockerGuestConfig(
            docker_host=cfg.docker_host,
            image=cfg.docker_image,
            width=cfg.screen_width,
            height=cfg.screen_height,
            action_timeout_s=cfg.action_timeout_s,
            fresh_container_per_episode=cfg.docker_fresh_container,
            recipe=cfg.guest_recipe(),
        )
    )


class GUIEnv(AgentEnv):
    family: ClassVar[str] = "gui"
    task_options: ClassVar[tuple[str, ...]] = ("task_set",)  # picks the bundled set: tasks(split, task_set=...)
    config_class: ClassVar[type | None] = GUIConfig  # the **gui options of the constructor
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"]}

    def __init__(
        self,
        *,
        max_steps: int = 15,
        tasks: Any = None,
        split: str = "train",
        max_observation_chars: int = 6000,
        max_action_chars: int = 4000,
        render_mode: str | None = None,
        **gui: Any,
    ):
        super().__init__(
            max_steps=max_steps,
            tasks=tasks,
            split=split,
            max_observation_chars=max_observation_chars,
            max_action_chars=max_action_chars,
        )
        self.cfg = from_options(GUIConfig, gui, "GUIEnv")
        self.render_mode = render_mode
        h, w = self.cfg.screen_height, self.cfg.screen_width
        self.observation_space = spaces.Dict(
            {
                **self.observation_space.spaces,
                "image": spaces.Box(0, 255, shape=(h, w, 3), dtype=np.uint8),
            }
        )
        self.desktop: GuestDesktop | None = None
        self._work = Path(tempfile.mkdtemp(prefix="nextstate-gui-"))
        self._episode_dir: Path | None = None
        self._image: np.ndarray | None = None
        self._elements: list[Element] = []
        self._windows: list[WindowInfo] = []
        self._a11y_xml: str | None = None
        self._text = ""
        self._milestones_best = 0
        self._milestones_n = 0
        self._milestones_now = 0  # reached after the last step (a drop below it is a regression)
        self._violations: list[bool] = []  # the task's violation checks after the last step
        self._last_special: str | None = None
        self.last_evaluation: Evaluation | None = None
        self._layouts: dict[tuple[str, ...], Layout] = {}  # app -> its recorded first screen (multistep demonstrations)

    # ----- task sets -----
    @classmethod
    def tasks(cls, split: str = "train", task_set: str = "bundled") -> Sequence[Task]:
        """The bundled `task_set` for `split`: "bundled" (hand-written tasks and their variants; also the `osworld`,
        `hand-written` and `all` splits), "multistep" (procedurally generated multi-step tasks, train and eval),
        "apps" (the per-domain app tasks: LibreOffice, GIMP, VLC, ...; train, eval and all)."""
        if task_set == "multistep":
            return multistep_tasks(split)
        if task_set == "apps":
            return app_tasks(split)
        if task_set != "bundled":
            raise ValueError(f"task_set={task_set!r}: use one of {', '.join(TASK_SETS)}")
        return bundled_tasks(split)

    def task_pool(self) -> list[Task]:
        if self._task_pool is None and self._task_source is None and self.cfg.task_set != "bundled":
            self._task_source = list(self.tasks(self.split, task_set=self.cfg.task_set))
        return super().task_pool()

    @classmethod
    def validate_task(cls, task: Task) -> Task:
        return validate_task(task)

    @classmethod
    def load_task_file(cls, path: str | Path, fmt: str, options: Mapping[str, Any] | None = None) -> list[Task]:
        """Named task sources, from an OSWorld evaluation_examples tree: `osworld` (the tasks test_all.json lists, without
        the chrome and multi_apps domains: the paper's setting), `osworld_all` (every domain), `osworld_os` (every
        example file of the os domain, listed or not: the ones that need only a shell and an X display). Tasks this env
        cannot run with these `options` (the env's) are skipped, each with a one-line reason (logged), and a summary
        line counts them by reason."""
        formats = {
            "osworld": {},
            "osworld_all": {"exclude_domains": ()},
            "osworld_os": {"domains": ("os",), "index": None},
        }
        if fmt not in formats:
            raise ValueError(f"unknown gui task format {fmt!r}; known: {', '.join(formats)}")
        names = {f.name for f in fields(GUIConfig)}
        cfg = from_options(GUIConfig, {k: v for k, v in (options or {}).items() if k in names}, "GUIEnv")
        got = load_osworld_examples(path, **formats[fmt], desktop_online=cfg.backend == "osworld",
                                    has_program=guest_programs(cfg))
        if got.skipped:
            log.warning("%d OSWorld tasks skipped (they need what this env cannot run):", len(got.skipped))
            for reason in got.skipped.values():
                log.warning("  %s", reason)
            kinds = Counter(got.skipped_kinds.values())
            log.warning("OSWorld tasks skipped: %d (%s); kept: %d", len(got.skipped),
                        ", ".join(f"{n} {k}" for k, n in kinds.most_common()), len(got.tasks))
        log.info("OSWorld tasks kept per domain: %s", got.domains)
        return got.tasks

    # ----- the episode -----
    def _ensure_desktop(self) -> GuestDesktop:
        if self.desktop is not None:
            try:
                self.desktop.new_session()
                return self.desktop
            except DesktopError as exc:
                log.warning("desktop unusable (%s); starting a new one", exc)
                self._close_desktop()
        self.desktop = make_desktop(self.cfg)
        return self.desktop

    def begin(self, task: Task) -> Transition:
        self._ensure_desktop()
        self._episode_dir = Path(tempfile.mkdtemp(prefix="episode-", dir=self._work))
        self._last_special = None
        self.last_evaluation = None
        run_steps(task.get("config", []), self._setup_ctx())
        self._wait_ready(task)
        self._observe_now(settle=True)
        milestones = self._milestones()
        self._milestones_n = len(milestones)
        self._milestones_best = self._milestones_now = sum(milestones)
        self._violations = self._checks("violations")
        content = self._render("", first=True)
        return Transition(
            content,
            role="user",
            image=self._image.copy(),
            signals={},
            extra_info={"system_prompt": system_prompt(task),
                        "milestones": f"{self._milestones_best}/{self._milestones_n}"},
        )

    def act(self, action: str) -> Transition:
        assert self.task is not None
        try:
            parsed = parse_action(action, self.cfg.action_space)
        except ActionParseError as exc:
            return self.parse_error(str(exc))
        before = self._image
        if parsed.kind == "special":
            self._last_special = parsed.special
            if parsed.special == "WAIT":
                time.sleep(self.cfg.wait_s)
                self._observe_now(settle=False)
                return self._transition("waited", self._step_signals(before))
            ev = self._evaluate(parsed.special)
            self._observe_now(settle=False)
            verdict = "the task is complete" if ev.score >= 1.0 else f"the task scored {ev.score:g}"
            word = "done" if parsed.special == "DONE" else "gave up (FAIL)"
            signals = {**self._step_signals(before, milestones=False), PROGRESS: ev.score >= 1.0, WRONG: ev.score < 1.0}
            if is_multistep(self.task):
                signals[MISTAKE] = "ok" if ev.score >= 1.0 else "unsolved"
            tr = self._transition(f"{word}; {verdict}", signals)
            tr.outcome = ev.score
            tr.extra_info["evaluation"] = asdict(ev)
            return tr
        self._last_special = None
        res = self.desktop.act(parsed, timeout=self.cfg.action_timeout_s)
        self._observe_now(settle=True)
        signals = self._step_signals(before)
        signals["action_space"] = parsed.space
        if not res.ok:
            signals[ERROR] = True
            signals["timed_out"] = res.timed_out
            msg = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "the action failed"
            signals["error_message"] = msg[:200]
            return self._transition(f"error: {msg}", signals)
        out = res.stdout.strip()
        return self._transition("ok" + (f"; printed: {out[:200]}" if out else ""), signals)

    def parse_error(self, reason: str) -> Transition:
        """Nothing ran: the same screen and elements again, with the reason."""
        return self._transition(f"could not parse the action: {reason}",
                                {PARSE_ERROR: True, SCREEN_CHANGED: False, "parse_message": reason})

    def verify(self) -> float:
        ev = self._evaluate(self._last_special if self._last_special == "FAIL" else None)
        return ev.score

    # ----- helpers -----
    def _setup_ctx(self) -> SetupContext:
        assert self.desktop is not None and self._episode_dir is not None
        return SetupContext(
            self.desktop,
            self._episode_dir,
            self._files_dir(),
            self.cfg.client_password,
            open_timeout_s=self.cfg.ready_timeout_s,
        )

    def _eval_ctx(self) -> EvalContext:
        assert self.desktop is not None and self._episode_dir is not None
        return EvalContext(
            self.desktop, self._episode_dir, self._files_dir(), self.cfg.client_password, a11y_xml=self._a11y_xml
        )

    def _files_dir(self) -> Path:
        """Where the episode task's relative file paths resolve (the generated app files for the app tasks)."""
        assert self.task is not None
        return files_dir_for(self.task)

    def _evaluate(self, last_special: str | None) -> Evaluation:
        assert self.task is not None
        ev = evaluate(self.task["evaluator"], self._eval_ctx(), last_special, self._setup_ctx())
        self.last_evaluation = ev
        return ev

    def _wait_ready(self, task: Task) -> None:
        ready = task.get("nextstate", {}).get("ready")
        if not ready:
            return
        title = ready.get("window")
        deadline = time.monotonic() + self.cfg.ready_timeout_s
        assert self.desktop is not None
        while title:
            if any(title in w.title for w in self.desktop.windows()):
                break
            if time.monotonic() > deadline:
                raise DesktopError(
                    f"task {task['id']}: no window {title!r} within {self.cfg.ready_timeout_s:.0f} s "
                    f"(windows: {[w.title for w in self.desktop.windows()]})"
                )
            time.sleep(0.05)
        if ready.get("a11y") and self.cfg.accessibility:
            # GTK registers with the accessibility bus a moment after it maps its window
            while True:
                try:
                    if any(title in e.name for e in self._frames(self.desktop.a11y_tree())):
                        break
                except DesktopError:
                    pass
                if time.monotonic() > deadline:
                    raise DesktopError(f"task {task['id']}: {title!r} never appeared in the accessibility tree")
                time.sleep(0.05)

    @staticmethod
    def _frames(xml: str) -> list[Element]:
        import xml.etree.ElementTree as ET

        try:
            root = ET.fromstring(xml)
        except ET.ParseError:
            return []
        return [
            Element("frame", n.get("name", ""), 0, 0, 0, 0)
            for app in root
            for n in app
            if n.tag.endswith(("frame", "dialog", "window"))
        ]

    def _screenshot(self) -> np.ndarray:
        assert self.desktop is not None
        img = self.desktop.screenshot()
        want = (self.cfg.screen_height, self.cfg.screen_width, 3)
        if img.shape != want:  # a remote VM with another resolution: fit the declared observation space
            from PIL import Image

            img = np.asarray(Image.fromarray(img).resize((want[1], want[0])))
        return img

    def _observe_now(self, settle: bool) -> None:
        assert self.desktop is not None
        if settle:
            time.sleep(self.cfg.settle_min_s)
            last = self._screenshot()
            deadline = time.monotonic() + self.cfg.settle_max_s
            while time.monotonic() < deadline:
                time.sleep(self.cfg.settle_interval_s)
                cur = self._screenshot()
                if np.array_equal(cur, last):
                    break
                last = cur
            self._image = last
        else:
            self._image = self._screenshot()
        self._windows = self.desktop.windows()
        self._a11y_xml = None
        if self.cfg.accessibility:
            try:
                self._a11y_xml = self.desktop.a11y_tree()
            except DesktopError as exc:
                log.debug("no accessibility tree this step: %s", exc)
        self._elements = parse_a11y(self._a11y_xml) if self._a11y_xml else []

    def _render(self, result: str, first: bool = False) -> str:
        assert self.task is not None
        self._text = self._observation_text(self.task, self._windows, self._elements, result, first)
        return self._text

    def _observation_text(self, task: Task, windows: Sequence[WindowInfo], elements: Sequence[Element], result: str,
                          first: bool) -> str:
        """The observation text of a screen, live or rendered from an app model (one formatting for both, so a
        rendered demonstration reads as a live one)."""
        return render(
            task["instruction"] if first or self.cfg.repeat_task else None,
            windows,
            elements,
            result=result,
            width=self.cfg.screen_width,
            height=self.cfg.screen_height,
            max_elements=self.cfg.max_elements,
            compact=self.cfg.compact_observation,
        )

    def _milestones(self) -> list[bool]:
        return self._checks("progress")

    def _checks(self, which: str) -> list[bool]:
        """The task's `nextstate.progress` milestones or `nextstate.violations`, scored on the current state."""
        assert self.task is not None
        checks = self.task.get("nextstate", {}).get(which, [])
        if not checks or not self.cfg.progress_checks:
            return []
        return partial_checks(checks, self._eval_ctx())

    def _step_signals(self, before: np.ndarray | None, milestones: bool = True) -> dict[str, Any]:
        signals: dict[str, Any] = {SCREEN_CHANGED: before is None or not np.array_equal(before, self._image)}
        if milestones and self._milestones_n:
            done = self._milestones()
            reached = sum(done)
            violations = self._checks("violations")
            new_violations = [now and not was for now, was in zip(violations, self._violations)]
            signals[WRONG] = any(new_violations) or reached < self._milestones_now  # a wrong change, or one undone
            signals[PROGRESS] = reached > self._milestones_best and not signals[WRONG]
            if self.task is not None and is_multistep(self.task):  # which mistake (the report's per-step start rates)
                undone = reached < self._milestones_now and not any(new_violations)
                signals[MISTAKE] = "undone" if undone else mistake_label(self.task, new_violations, signals[PROGRESS])
            signals["milestones"] = f"{reached}/{self._milestones_n}"
            self._milestones_best = max(self._milestones_best, reached)
            self._milestones_now, self._violations = reached, violations
            missing = [c for c, ok in zip(self.task["nextstate"]["progress"], done) if not ok] if self.task else []
            if missing:  # the first milestone not reached yet (a rule judge's hint names it)
                signals["milestone_missing"] = describe_check(missing[0])
        return signals

    def _transition(self, result: str, signals: dict[str, Any]) -> Transition:
        if self._image is None:
            self._image = np.zeros((self.cfg.screen_height, self.cfg.screen_width, 3), np.uint8)
        # a copy: the caller keeps each observation, and an unchanged screen must not alias the last one
        return Transition(self._render(result), role="user", image=self._image.copy(), signals=signals)

    # ----- scripted solutions and demonstrations -----
    def current_elements(self) -> tuple[list[Element], list[WindowInfo]]:
        return list(self._elements), list(self._windows)

    def play(
        self, task: Task | str, which: str = "solution", steps: Sequence[Any] | None = None
    ) -> tuple[list[dict[str, Any]], float]:
        """Reset to `task` and play its scripted `solution` (or `wrong`) steps, or the given `steps`; return the
        conversation and outcome. The script plays to its end whatever `max_steps` is (demonstrations are not bound by
        the step limit)."""
        obs, info = self.reset(options={"task": task})
        assert self.task is not None
        steps = list(steps) if steps is not None else self.task.get("nextstate", {}).get(which)
        if not steps:
            raise SolutionError(f"task {self.task['id']!r} has no scripted {which!r}")
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": info["system_prompt"]},
            {"role": "user", "content": obs["content"]},
        ]
        waits = sum(max_waits(s) for s in steps)
        # one step more than the script: a script that never says DONE or FAIL is caught below, not truncated
        with self.step_limit_lifted(len(steps) + waits + 1):
            for i, step in enumerate(steps):
                for action in self._scripted_actions(i, step):
                    obs, reward, terminated, truncated, info = self.step(action)
                    messages.append({"role": "assistant", "content": action})
                    if info["signals"].get(PARSE_ERROR) or info["signals"].get(ERROR):
                        raise SolutionError(
                            f"task {self.task['id']}: scripted step {i} ({action!r}) failed: {obs['content'][:300]}"
                        )
                    if terminated or truncated:
                        return messages, float(info["outcome"])
                    messages.append({"role": "user", "content": obs["content"]})
            raise SolutionError(f"task {self.task['id']}: the scripted {which} does not end with DONE or FAIL")

    def _scripted_actions(self, i: int, step: Any) -> Iterator[str]:
        """The action(s) of scripted step `i`, each resolved on the screen the last one left: one, or for a wait step
        (`wait_window`, `wait_element`) a WAIT until its window or element is on screen (none if it already is)."""
        if not is_wait_step(step):
            yield resolve_step(step, self._elements, self._windows)
            return
        for _ in range(max_waits(step)):
            if wait_is_over(step, self._elements, self._windows):
                return
            yield "WAIT"
        if not wait_is_over(step, self._elements, self._windows):
            assert self.task is not None
            focus = [(e.role, e.name, e.text) for e in self._elements if "focused" in e.states]
            raise SolutionError(f"task {self.task['id']}: scripted step {i}: no {awaited(step)} after "
                                f"{max_waits(step)} WAITs; windows: {[(w.title, w.focused) for w in self._windows]}; "
                                f"focused elements: {focus}")

    @class_or_instance
    def demonstration(self, task: Task, noise: Mapping[str, Any] | GUINoise | None = None) -> list[dict[str, Any]]:
        """The reference conversation for `task` (system, user observation, assistant action, ...): real observations,
        actions the env accepts. Bundled tasks: recorded by playing the scripted solution on a live desktop. Multistep
        tasks (envs.gui.multistep): rendered from the app's live-recorded layout by its model (envs.gui.app_models),
        with `noise` ({rate, rates, seed}, see `GUINoise`) injecting one dominant mistake per step for a weak start.
        On the class it runs on a temporary default env. Recordings and layouts are cached on disk (under envs.cache's
        root: $NEXTSTATE_CACHE, else /var/cache/nextstate as root, else ~/.cache/nextstate), keyed by the task (the
        app), the env's configuration and the observation format, so a second launch does not record them again."""
        if is_multistep(task):
            if noise is not None and not isinstance(noise, GUINoise):
                noise = GUINoise(**noise)
            return self.rendered_demonstration(task, noise)
        if noise:
            raise ValueError(f"task {task.get('id')!r}: noisy demonstrations exist for multistep tasks only")
        if not task.get("nextstate", {}).get("solution"):
            raise NoDemonstration(f"task {task.get('id')!r} has no scripted solution")
        cache = _demo_cache_path(task, asdict(self.cfg))
        if cache.exists():
            return json.loads(cache.read_text())
        messages, outcome = self.play(task, "solution")
        if outcome < 1.0:
            raise SolutionError(f"task {task.get('id')!r}: the reference solution scored {outcome}, not 1")
        _write_json_atomically(cache, messages)
        return messages

    @classmethod
    def demonstration_labels(cls, task: Task, messages: Sequence[Mapping[str, Any]]) -> list[str] | None:
        """Multistep tasks: what each assistant turn did, in the `mistake` signal's words
        (multistep.label_conversation); None for the other tasks."""
        return label_conversation(task, messages) if is_multistep(task) else None

    def rendered_demonstration(self, task: Task, noise: GUINoise | None = None) -> list[dict[str, Any]]:
        """A multistep task's (noisy) scripted conversation, rendered without playing it: the steps applied to the
        app's model over its recorded layout, each observation rendered as the env renders a live one."""
        steps, _ = scripted_steps(task, noise)
        ms = task["nextstate"]["multistep"]
        layout = self.app_layout(task)
        model = model_for(ms["family"], layout, ms["params"])
        windows = list(layout.windows)

        def observe(result: str) -> str:
            return self._observation_text(task, windows, model.elements(), result, first=not result)

        messages = [{"role": "system", "content": system_prompt(task)}, {"role": "user", "content": observe("")}]
        for step in steps:
            action = resolve_step(step, model.elements(), windows)
            messages.append({"role": "assistant", "content": action})
            if step in ("DONE", "FAIL"):
                return messages
            model.apply(step)
            messages.append({"role": "user", "content": observe("ok")})
        raise SolutionError(f"task {task['id']}: the scripted steps do not end with DONE or FAIL")

    def app_layout(self, task: Task) -> Layout:
        """The first screen of `task`'s app (windows and elements, as the accessibility tree gives them), recorded
        live once per app and env configuration: reset to the task and read the screen."""
        app = tuple(task.get("related_apps") or [task["id"]])
        if app in self._layouts:
            return self._layouts[app]
        cache = _demo_cache_path({"layout": list(app)}, asdict(self.cfg))
        if cache.exists():
            data = json.loads(cache.read_text())
        else:
            self.reset(options={"task": task})
            elements, windows = self.current_elements()
            data = {"windows": [asdict(w) for w in windows],
                    "elements": [{**asdict(e), "states": sorted(e.states)} for e in elements]}
            _write_json_atomically(cache, data)
        layout = Layout(tuple(WindowInfo(**w) for w in data["windows"]),
                        tuple(Element(**{**e, "states": frozenset(e["states"])}) for e in data["elements"]))
        self._layouts[app] = layout
        return layout

    # ----- gymnasium -----
    def render(self):
        return self._image

    def _close_desktop(self) -> None:
        if self.desktop is not None:
            try:
                self.desktop.close()
            except Exception:
                log.warning("closing the desktop failed", exc_info=True)
            self.desktop = None

    def close(self) -> None:
        self._close_desktop()
        shutil.rmtree(self._work, ignore_errors=True)
        super().close()


def system_prompt(task: Task) -> str:
    """The multistep tasks' short prompt (a tiny policy reads it every episode), the env's own for the others."""
    return MULTISTEP_SYSTEM_PROMPT if is_multistep(task) else SYSTEM_PROMPT


def _write_json_atomically(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def _demo_cache_path(task: Task, env_kwargs: dict[str, Any]) -> Path:
    files = None
    if task.get("nextstate", {}).get("files") == "generated":  # a changed file generator gives new recordings
        from envs.gui.app_files import digest

        files = digest()
    key = json.dumps({"task": task, "env": env_kwargs, "v": OBSERVATION_VERSION, **({"files": files} if files else {})},
                     sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir("gui-demos") / f"{task.get('id', 'task')}-{digest}.json"
