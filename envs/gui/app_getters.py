"""OSWorld's application getters: VLC, GIMP, VS Code, LibreOffice Impress, the desktop's wallpaper, windows and
shortcuts, and dates relative to today (Chromium's are in envs.gui.browser_getters).

Everything is read from the desktop (its HOME, its loopback) through the GuestDesktop, never from the host. An app's
state that is absent (no VLC web interface answering, no config file) raises FileNotFoundError with a one-line
reason, which the evaluator scores 0.
"""

from __future__ import annotations

import json
import logging
import time
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable
from datetime import date, datetime, timedelta
from typing import Any

from envs.gui.getters import EvalContext, get_vm_file

log = logging.getLogger(__name__)


def save_to_cache(ctx: EvalContext, dest: str, data: bytes) -> str:
    ctx.cache_dir.mkdir(parents=True, exist_ok=True)
    path = ctx.cache_dir / dest
    path.write_bytes(data)
    return str(path)


def _read(ctx: EvalContext, path: str, what: str) -> bytes:
    try:
        return ctx.desktop.read_file(path)
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        raise FileNotFoundError(f"{what}: {path} is not on the desktop ({type(exc).__name__})") from None


def http_on_desktop(ctx: EvalContext, url: str, password: str | None = None, method: str = "GET") -> bytes:
    """GET a URL on the desktop's own loopback (the desktop's network namespace is not the host's)."""
    script = (
        "import base64,sys,urllib.request\n"
        "r=urllib.request.Request(sys.argv[1],method=sys.argv[3])\n"
        "if sys.argv[2]:r.add_header('Authorization','Basic '+base64.b64encode((':'+sys.argv[2]).encode()).decode())\n"
        "sys.stdout.buffer.write(urllib.request.urlopen(r,timeout=5).read())\n"
    )
    res = ctx.desktop.execute(["python3", "-c", script, url, password or "", method], timeout=15)
    if res.exit_code != 0:
        reason = (res.stderr.strip().splitlines() or ["no answer"])[-1]
        raise FileNotFoundError(f"{url} does not answer on the desktop: {reason[:160]}")
    return res.stdout.encode("utf-8", errors="surrogateescape")


# ----- VLC, GIMP, VS Code, Impress -----
def get_vlc_playing_info(ctx: EvalContext, config: dict[str, Any]) -> str:
    """VLC's status.xml from its web interface (OSWorld starts VLC with --extraintf http, password "password")."""
    port = config.get("port", 8080)
    data = http_on_desktop(ctx, f"http://localhost:{port}/requests/status.xml", password="password")
    return save_to_cache(ctx, config["dest"], data)


def get_vlc_config(ctx: EvalContext, config: dict[str, Any]) -> str:
    return save_to_cache(ctx, config["dest"], _read(ctx, "~/.config/vlc/vlcrc", "vlc_config"))


def get_gimp_config_file(ctx: EvalContext, config: dict[str, Any]) -> str:
    path = f"~/.config/GIMP/2.10/{config['file_name']}"
    return save_to_cache(ctx, config["dest"], _read(ctx, path, "gimp_config_file"))


def get_vscode_config(ctx: EvalContext, config: dict[str, Any]) -> str | None | list[str | None]:
    """Run a VS Code command from its palette (ctrl+shift+p, the command, enter), then fetch the file it writes."""
    command = json.dumps(str(config["vscode_extension_command"]))
    ctx.desktop.act(f"pyautogui.hotkey('ctrl', 'shift', 'p'); pyautogui.write({command}); pyautogui.press('enter')")
    time.sleep(1.0)
    return get_vm_file(ctx, {"path": config["path"], "dest": config["dest"]})


def get_audio_in_slide(ctx: EvalContext, config: dict[str, Any]) -> str | None:
    """The audio file linked from slide `slide_index` of a pptx on the desktop, extracted into the cache."""
    deck = get_vm_file(ctx, {"path": config["ppt_file_path"], "dest": config["ppt_file_path"].rsplit("/", 1)[-1]})
    if not isinstance(deck, str):
        raise FileNotFoundError(f"audio_in_slide: {config['ppt_file_path']} is not on the desktop")
    rels = f"ppt/slides/_rels/slide{int(config['slide_index']) + 1}.xml.rels"
    with zipfile.ZipFile(deck) as z:
        if rels not in z.namelist():
            return None
        for rel in ET.fromstring(z.read(rels)):
            if "audio" not in rel.get("Type", ""):
                continue
            target = rel.get("Target", "")
            inner = "/".join(_normalize_zip_path("ppt/slides/" + target).split("/"))
            if inner in z.namelist():
                return save_to_cache(ctx, config["dest"], z.read(inner))
            return target  # an external (linked) file: its path, as OSWorld gives it
    return None


def _normalize_zip_path(path: str) -> str:
    parts: list[str] = []
    for p in path.split("/"):
        if p == "..":
            parts = parts[:-1]
        elif p and p != ".":
            parts.append(p)
    return "/".join(parts)


def get_vm_wallpaper(ctx: EvalContext, config: dict[str, Any]) -> str:
    """The wallpaper image GNOME shows (org.gnome.desktop.background picture-uri); an empty file when unset."""
    res = ctx.desktop.execute(["gsettings", "get", "org.gnome.desktop.background", "picture-uri"])
    uri = res.stdout.strip().strip("'") if res.exit_code == 0 else ""
    path = uri[len("file://"):] if uri.startswith("file://") else uri
    data = b""
    if path:
        try:
            data = ctx.desktop.read_file(path)
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            data = b""
    return save_to_cache(ctx, config["dest"], data)


def get_vm_window_size(ctx: EvalContext, config: dict[str, Any]) -> dict[str, int] | None:
    """The size of the first window whose class contains `app_class_name`."""
    name = str(config["app_class_name"]).lower()
    for w in ctx.desktop.windows():
        if any(name in c.lower() for c in w.wm_class):
            return {"width": w.w, "height": w.h}
    return None


# ----- dates relative to today (OSWorld's rule_relativeTime) -----
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]


def _next_month_day(now: date, day: int) -> date:
    return date(now.year + (now.month == 12), now.month % 12 + 1, day)


def _first_monday_months_later(now: date, months: int) -> date:
    m = now.month - 1 + months
    first = date(now.year + m // 12, m % 12 + 1, 1)
    return first + timedelta(days=(7 - first.weekday()) % 7)


def _weekday_after(now: date, weekday: int, this_week_ok: bool) -> date:
    """The next `weekday` (0 Monday) after today; with `this_week_ok`, one later this week counts."""
    ahead = weekday - now.weekday()
    if ahead <= 0 or not this_week_ok:
        ahead += 7 if ahead <= 0 else 0
    return now + timedelta(days=ahead)


def _next_week(now: date, weekday: int) -> date:
    return now + timedelta(days=7 - now.weekday() + weekday)


def relative_day(phrase: str, now: date, start: date | None = None) -> date:
    """The day a phrase of OSWorld's tasks names (`start`: the range's first day, for "next Friday" after "next
    Monday" and "next Sunday" after a Friday/Saturday)."""
    base = phrase.removesuffix(" split")
    fixed: dict[str, Callable[[], date]] = {
        "tomorrow": lambda: now + timedelta(days=1),
        "this month": lambda: now,
        "5th next month": lambda: _next_month_day(now, 5),
        "10th next month": lambda: _next_month_day(now, 10),
        "11th next month": lambda: _next_month_day(now, 11),
        "this Saturday": lambda: now + timedelta(days=5 - now.weekday()),
        "this Sunday": lambda: now + timedelta(days=6 - now.weekday()),
        "next Monday": lambda: now + timedelta(days=7 - now.weekday()),
        "next Saturday": lambda: _weekday_after(now, 5, True),
        "next week Friday": lambda: _next_week(now, 4),
        "next week Saturday": lambda: _next_week(now, 5),
        "next week Sunday": lambda: _next_week(now, 6),
        "first monday four months later": lambda: _first_monday_months_later(now, 4),
        "first monday eight months later": lambda: _first_monday_months_later(now, 8),
    }
    if base == "next Friday":
        if start is not None and start.weekday() == 0:
            return start + timedelta(days=4)
        return _weekday_after(now, 4, True)
    if base in ("next Sunday", "next week Sunday") and start is not None and start.weekday() in (4, 5):
        return start + timedelta(days=6 - start.weekday())
    if base == "next Sunday":
        return _weekday_after(now, 6, True)
    if base not in fixed:
        raise ValueError(f"rule_relativeTime: unknown relative day {phrase!r}")
    return fixed[base]()


def format_day(template: str, day: date) -> str:
    """OSWorld's placeholders: {DoW} {Month} {MonthFull} {month} {DayD} {Day0D} {MonthD} {Month0D} {Year}."""
    subs = {"{DoW}": DAYS[day.weekday()], "{MonthFull}": MONTHS[day.month - 1], "{Month0D}": f"{day.month:02d}",
            "{Month}": MONTHS[day.month - 1][:3], "{month}": MONTHS[day.month - 1].lower(), "{DayD}": str(day.day),
            "{Day0D}": f"{day.day:02d}", "{MonthD}": str(day.month), "{Year}": str(day.year)}
    for k, v in subs.items():
        template = template.replace(k, v)
    return template


def _today(rules: dict[str, Any]) -> date:
    tz = rules.get("timezone")
    if tz:
        from zoneinfo import ZoneInfo

        return datetime.now(ZoneInfo(tz)).date()
    return datetime.now().astimezone().date()  # the desktop shares the host's clock


def get_rule_relativeTime(ctx: EvalContext, config: dict[str, Any]) -> dict[str, Any]:  # noqa: N802 - OSWorld's
    """The rule with its expected dates filled in from today: `relativeTime.from` (and `.to`) name days; the
    expected `time` (or `from` / `to`, or with "split" the pick-up and drop-off day/month/year fields) are
    templates."""
    rules = json.loads(json.dumps(config["rules"]))  # a copy: the task's dict is reused by every episode
    rel, exp, now = rules["relativeTime"], rules["expected"], _today(rules)
    first = relative_day(rel["from"], now)

    def fill(key: str, day: date) -> None:
        v = exp[key]
        exp[key] = [format_day(t, day) for t in v] if isinstance(v, list) else format_day(v, day)

    if "to" not in rel:
        fill("time", first)
        return rules
    last = relative_day(rel["to"], now, start=first)
    if rel["from"].endswith(" split"):
        for k in ("puDay", "puMonth", "puYear"):
            fill(k, first)
    else:
        fill("from", first)
    if rel["to"].endswith(" split"):
        for k in ("doDay", "doMonth", "doYear"):
            if k in exp:
                fill(k, last)
    else:
        fill("to", last)
    return rules


def get_shortcuts_on_desktop(ctx: EvalContext, config: dict[str, Any]) -> dict[str, str]:
    """{path: content} of every .desktop file on ~/Desktop."""
    res = ctx.desktop.execute(["sh", "-c", "ls -1 ~/Desktop/*.desktop 2>/dev/null"])
    out = {}
    for path in res.stdout.split():
        try:
            out[path] = ctx.desktop.read_file(path).decode("utf-8", errors="replace")
        except (FileNotFoundError, PermissionError):
            continue
    return out


GETTERS: dict[str, Callable[[EvalContext, dict[str, Any]], Any]] = {
    name[len("get_"):]: fn for name, fn in dict(globals()).items()
    if name.startswith("get_") and callable(fn) and fn is not get_vm_file
}
