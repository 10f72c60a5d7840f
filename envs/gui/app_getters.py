"""OSWorld's application getters: VLC, GIMP, VS Code, LibreOffice Impress, the desktop's wallpaper and windows, dates
relative to today, and Chromium's profile files and tabs.

Everything is read from the desktop (its HOME, its loopback) through the GuestDesktop, never from the host. An app's
state that is absent (no VLC web interface answering, no Chromium profile) raises FileNotFoundError with a one-line
reason, which the evaluator scores 0; `gotoRecreationPage_and_get_html_content` (it clicks through a live site)
raises RuntimeError saying so.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable
from datetime import date, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlparse

from envs.gui.getters import EvalContext, get_vm_file

log = logging.getLogger(__name__)

CHROME_PROFILES = ("~/.config/google-chrome/Default", "~/.config/chromium/Default")  # OSWorld's Chrome, Debian's
DEVTOOLS_PORTS = (9222, 1337)  # OSWorld forwards 9222 to Chrome's --remote-debugging-port=1337


def _save(ctx: EvalContext, dest: str, data: bytes) -> str:
    ctx.cache_dir.mkdir(parents=True, exist_ok=True)
    path = ctx.cache_dir / dest
    path.write_bytes(data)
    return str(path)


def _read(ctx: EvalContext, path: str, what: str) -> bytes:
    try:
        return ctx.desktop.read_file(path)
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        raise FileNotFoundError(f"{what}: {path} is not on the desktop ({type(exc).__name__})") from None


def _http_on_desktop(ctx: EvalContext, url: str, password: str | None = None, method: str = "GET") -> bytes:
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
    data = _http_on_desktop(ctx, f"http://localhost:{port}/requests/status.xml", password="password")
    return _save(ctx, config["dest"], data)


def get_vlc_config(ctx: EvalContext, config: dict[str, Any]) -> str:
    return _save(ctx, config["dest"], _read(ctx, "~/.config/vlc/vlcrc", "vlc_config"))


def get_gimp_config_file(ctx: EvalContext, config: dict[str, Any]) -> str:
    path = f"~/.config/GIMP/2.10/{config['file_name']}"
    return _save(ctx, config["dest"], _read(ctx, path, "gimp_config_file"))


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
                return _save(ctx, config["dest"], z.read(inner))
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
    return _save(ctx, config["dest"], data)


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


# ----- Chromium: profile files -----
def _profile_file(ctx: EvalContext, name: str) -> bytes:
    for profile in CHROME_PROFILES:
        try:
            return ctx.desktop.read_file(f"{profile}/{name}")
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            continue
    raise FileNotFoundError(f"no Chrome/Chromium profile on the desktop has {name} ({', '.join(CHROME_PROFILES)})")


def _preferences(ctx: EvalContext) -> dict[str, Any]:
    try:
        return json.loads(_profile_file(ctx, "Preferences"))
    except json.JSONDecodeError:
        return {}


def _sqlite_rows(ctx: EvalContext, name: str, dest: str, sql: str) -> list[tuple[Any, ...]]:
    path = _save(ctx, dest, _profile_file(ctx, name))
    with sqlite3.connect(path) as conn:
        return conn.execute(sql).fetchall()


def get_bookmarks(ctx: EvalContext, config: dict[str, Any]) -> dict[str, Any]:
    return json.loads(_profile_file(ctx, "Bookmarks")).get("roots", {})


def get_cookie_data(ctx: EvalContext, config: dict[str, Any]) -> list[tuple[Any, ...]]:
    return _sqlite_rows(ctx, "Cookies", config.get("dest", "Cookies"), "SELECT * FROM cookies")


def get_history(ctx: EvalContext, config: dict[str, Any]) -> list[tuple[Any, ...]]:
    return _sqlite_rows(ctx, "History", config.get("dest", "History"), "SELECT url, title, last_visit_time FROM urls")


def get_default_search_engine(ctx: EvalContext, config: dict[str, Any]) -> str:
    p = _preferences(ctx)
    return p.get("default_search_provider_data", {}).get("template_url_data", {}).get("short_name", "Google")


def get_profile_name(ctx: EvalContext, config: dict[str, Any]) -> str | None:
    return _preferences(ctx).get("profile", {}).get("name")


def get_chrome_font_size(ctx: EvalContext, config: dict[str, Any]) -> dict[str, Any]:
    defaults = {"default_fixed_font_size": 13, "default_font_size": 16, "minimum_font_size": 13}
    return _preferences(ctx).get("webkit", {}).get("webprefs", defaults)


def get_data_delete_automacally(ctx: EvalContext, config: dict[str, Any]) -> str:
    """"true" once the profile has content settings of its own (how Chrome records clearing data on close)."""
    return "true" if _preferences(ctx).get("profile", {}).get("default_content_setting_values") is not None else "false"


def get_new_startup_page(ctx: EvalContext, config: dict[str, Any]) -> str:
    p = _preferences(ctx)
    return "true" if "session" not in p or p["session"].get("restore_on_startup") == 5 else "false"


def get_enable_do_not_track(ctx: EvalContext, config: dict[str, Any]) -> str:
    return "true" if _preferences(ctx).get("enable_do_not_track") else "false"


def get_enable_safe_browsing(ctx: EvalContext, config: dict[str, Any]) -> str:
    sb = _preferences(ctx).get("safebrowsing", {})
    return "true" if sb.get("enhanced") or sb.get("enabled") else "false"


def get_chrome_appearance_mode_ui(ctx: EvalContext, config: dict[str, Any]) -> str:
    """light / dark / system, from the profile's colour scheme preference (0 system, 1 light, 2 dark)."""
    theme = _preferences(ctx).get("browser", {}).get("theme", {})
    scheme = theme.get("color_scheme2", theme.get("color_scheme", 0))
    return {1: "light", 2: "dark"}.get(scheme, "system")


def get_find_unpacked_extension_path(ctx: EvalContext, config: dict[str, Any]) -> list[str]:
    """The paths of the profile's extensions (unpacked ones are their source folders)."""
    settings = _preferences(ctx).get("extensions", {}).get("settings", {})
    return [s["path"] for s in settings.values() if isinstance(s, dict) and "path" in s]


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


# ----- Chromium: tabs over its DevTools endpoint -----
# Run on the desktop (stdlib only): one DevTools protocol call (method, JSON params) on a page's websocket; prints the
# call's result as JSON. A minimal RFC 6455 client: one masked text frame out, frames in until the reply with id 1.
CDP_CALL = r"""
import base64, json, os, socket, struct, sys
from urllib.parse import urlparse
u = urlparse(sys.argv[1])
s = socket.create_connection((u.hostname, u.port), timeout=20)
s.sendall(("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
           % (u.path, u.hostname, u.port, base64.b64encode(os.urandom(16)).decode())).encode())
buf = b""
while b"\r\n\r\n" not in buf:
    chunk = s.recv(65536)
    if not chunk:
        sys.exit("the DevTools websocket closed during the handshake")
    buf += chunk
head, buf = buf.split(b"\r\n\r\n", 1)
if b" 101 " not in head.split(b"\r\n")[0]:
    sys.exit("DevTools refused the websocket: " + head.split(b"\r\n")[0].decode())
msg = json.dumps({"id": 1, "method": sys.argv[2], "params": json.loads(sys.argv[3])}).encode()
n = len(msg)
size = bytes([0x80 | n]) if n < 126 else (bytes([0xFE]) + struct.pack(">H", n) if n < 65536
                                           else bytes([0xFF]) + struct.pack(">Q", n))
mask = os.urandom(4)
s.sendall(bytes([0x81]) + size + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(msg)))
def take(k):
    global buf
    while len(buf) < k:
        chunk = s.recv(65536)
        if not chunk:
            sys.exit("the DevTools websocket closed")
        buf += chunk
    out, buf = buf[:k], buf[k:]
    return out
data = b""
while True:
    b0, b1 = take(2)
    k = b1 & 0x7F
    k = struct.unpack(">H", take(2))[0] if k == 126 else struct.unpack(">Q", take(8))[0] if k == 127 else k
    payload = take(k)
    if b0 & 0x0F in (0x8, 0x9, 0xA):
        continue
    data += payload
    if b0 & 0x80:
        reply, data = json.loads(data), b""
        if reply.get("id") == 1:
            break
if "error" in reply:
    sys.exit("the DevTools call failed: " + json.dumps(reply["error"])[:300])
sys.stdout.write(json.dumps(reply.get("result", {})))
"""


def devtools(ctx: EvalContext, path: str, method: str = "GET") -> Any:
    """A DevTools HTTP call (`/json/list`, `/json/new?URL`, ...) on the desktop's browser: its JSON, or its text
    where it answers in words (`/json/close` says "Target is closing")."""
    last = ""
    for port in DEVTOOLS_PORTS:
        try:
            body = _http_on_desktop(ctx, f"http://localhost:{port}{path}", method=method)
        except FileNotFoundError as exc:
            last = str(exc)
            continue
        try:
            return json.loads(body or b"null")
        except json.JSONDecodeError:
            return body.decode("utf-8", errors="replace")
    raise FileNotFoundError(f"no browser DevTools endpoint on the desktop (ports {DEVTOOLS_PORTS}): {last}")


def cdp_call(ctx: EvalContext, tab: dict[str, Any], method: str, params: dict[str, Any] | None = None) -> Any:
    """One DevTools protocol call on a tab (over its websocket, from the desktop): the call's result."""
    ws = tab.get("webSocketDebuggerUrl")
    if not ws:
        raise FileNotFoundError(f"the tab {tab.get('url', '?')} has no DevTools websocket (another client holds it?)")
    res = ctx.desktop.execute(["python3", "-c", CDP_CALL, ws, method, json.dumps(params or {})], timeout=90)
    if res.exit_code != 0:
        raise FileNotFoundError(f"DevTools {method} in {tab.get('url', '?')[:80]} failed: "
                                f"{(res.stderr.strip().splitlines() or ['no output'])[-1][:200]}")
    return json.loads(res.stdout)


def evaluate_in_tab(ctx: EvalContext, tab: dict[str, Any], expression: str) -> Any:
    """The JSON value of a JavaScript expression evaluated in a tab."""
    got = cdp_call(ctx, tab, "Runtime.evaluate", {"expression": expression, "returnByValue": True})
    if "exceptionDetails" in got:
        raise FileNotFoundError(f"the script failed in {tab.get('url', '?')[:80]}: "
                                f"{json.dumps(got['exceptionDetails'])[:200]}")
    return got.get("result", {}).get("value")


def open_tab(ctx: EvalContext, url: str) -> dict[str, Any]:
    """A new tab showing `url` (DevTools' /json/new, which Chrome wants as a PUT)."""
    from urllib.parse import quote

    return devtools(ctx, f"/json/new?{quote(url, safe=':/?&=%#')}", method="PUT")


def _loaded(ctx: EvalContext, tab: dict[str, Any], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while evaluate_in_tab(ctx, tab, "document.readyState") != "complete":
        if time.monotonic() > deadline:
            raise FileNotFoundError(f"{tab.get('url', '?')[:80]} did not finish loading in {timeout_s:.0f} s")
        time.sleep(0.3)


def _in_new_tab(ctx: EvalContext, url: str, read: Callable[[dict[str, Any]], Any]) -> Any:
    """Open `url` in a new tab, wait for it to load, read it, close the tab (as OSWorld's new-page getters do)."""
    tab = open_tab(ctx, url)
    try:
        _loaded(ctx, tab)
        return read(tab)
    finally:
        devtools(ctx, f"/json/close/{tab['id']}")


def get_page_info(ctx: EvalContext, config: dict[str, Any]) -> dict[str, Any]:
    """{title, url, content} of `config["url"]` loaded in a new tab."""
    return _in_new_tab(ctx, config["url"], lambda tab: evaluate_in_tab(
        ctx, tab, "({title: document.title, url: location.href, content: document.documentElement.outerHTML})"))


def get_pdf_from_url(ctx: EvalContext, config: dict[str, Any]) -> str:
    """`config["path"]` (a URL) printed to PDF by the browser, saved as `dest`."""
    import base64

    data = _in_new_tab(ctx, config["path"], lambda tab: cdp_call(ctx, tab, "Page.printToPDF", {})["data"])
    return _save(ctx, config["dest"], base64.b64decode(data))


def open_tabs(ctx: EvalContext) -> list[dict[str, Any]]:
    return [t for t in devtools(ctx, "/json/list") if t.get("type") == "page"]


def get_open_tabs_info(ctx: EvalContext, config: dict[str, Any]) -> list[dict[str, str]]:
    return [{"title": t.get("title", ""), "url": t.get("url", "")} for t in open_tabs(ctx)]


def _url_from_a11y(ctx: EvalContext, config: dict[str, Any]) -> str | None:
    """The address bar's text (OSWorld's way: the omnibox entry of Google Chrome / Chromium in the a11y tree), with
    `goto_prefix` (https:// by default) in front, since the bar shows URLs without their scheme."""
    import lxml.etree
    from lxml.cssselect import CSSSelector

    from envs.gui.metrics.general import A11Y_NAMESPACES

    try:
        root = lxml.etree.fromstring(ctx.accessibility_tree().encode())
    except (lxml.etree.XMLSyntaxError, ValueError):
        return None
    for app in ("Google\\ Chrome", "Chromium"):
        found = CSSSelector(f"application[name={app}] entry[name=Address\\ and\\ search\\ bar]",
                            namespaces=A11Y_NAMESPACES)(root)
        if found and found[-1].text:
            return f"{config.get('goto_prefix', 'https://')}{found[0].text}"
    return None


def _active_url(ctx: EvalContext, config: dict[str, Any]) -> str | None:
    url = _url_from_a11y(ctx, config)
    if url is not None:
        return url
    tabs = open_tabs(ctx)  # without an a11y tree: DevTools lists the most recently focused page first
    return tabs[0].get("url") if tabs else None


def get_active_url_from_accessTree(ctx: EvalContext, config: dict[str, Any]) -> str | None:  # noqa: N802
    return _active_url(ctx, config)


def get_active_tab_info(ctx: EvalContext, config: dict[str, Any]) -> dict[str, Any] | None:
    """{title, url, content (the page's HTML)} of the active tab, read in place (OSWorld reloads the URL in a new
    page; reading the tab the agent left is the same page without a second load)."""
    tabs = open_tabs(ctx)
    if not tabs:
        return None
    tab = tabs[0]
    content = evaluate_in_tab(ctx, tab, "document.documentElement.outerHTML")
    return {"title": tab.get("title", ""), "url": tab.get("url", ""), "content": content}


def get_active_tab_url_parse(ctx: EvalContext, config: dict[str, Any]) -> dict[str, Any] | None:
    """The `parse_keys` query parameters of the active tab's URL ('' when absent), renamed by `replace`, split on
    commas with `split_list`."""
    url = _active_url(ctx, config)
    if url is None:
        return None
    query = parse_qs(urlparse(url).query)
    out: dict[str, Any] = {k: query.get(k, [""])[0] for k in config["parse_keys"]}
    for old, new in (config.get("replace") or {}).items():
        out[new] = out.pop(old)
    if config.get("split_list", False):
        out = {k: v.split(",") for k, v in out.items()}
    return out


def get_url_dashPart(ctx: EvalContext, config: dict[str, Any]) -> Any:  # noqa: N802 - OSWorld's name
    """The `partIndex`-th '/'-separated part of the active tab's URL (its query dropped with `needDeleteId`), as a
    string (`returnType: string`) or {key: part} (`json`)."""
    url = _active_url(ctx, config)
    if url is None:
        return None
    parts = url.split("/")
    i = int(config["partIndex"])
    if i >= len(parts):
        return None
    part = parts[i].split("?")[0] if config.get("needDeleteId", False) else parts[i]
    kind = config.get("returnType")
    return part if kind == "string" else {config["key"]: part} if kind == "json" else None


def get_url_path_parse(ctx: EvalContext, config: dict[str, Any]) -> dict[str, Any] | None:
    """OSWorld's Macy's product-listing URL reader: a path segment of comma-separated facet names followed by one of
    their values gives {facet: value}; plus `mens_clothing`, `shirts`, `short_sleeve` flags (True or None) and the
    `parse_keys` facets (Price_discount_range reduced to whether it is exactly the 50%-off bucket)."""
    from urllib.parse import unquote

    url = _active_url(ctx, config)
    if url is None:
        return None
    path = unquote(urlparse(url).path)
    parts = path.strip("/").split("/")
    facets: dict[str, Any] = {}
    shirts, short = "shirts" in path, "short-sleeve" in path
    for a, b in zip(parts, parts[1:]):
        if "," in a and "," in b:
            for k, v in zip((x.strip() for x in a.split(",")), (x.strip() for x in b.split(","))):
                facets[k] = ([x.strip() for x in v.split("|")] if v else None) if k == "Price_discount_range" else (
                    v or None)
                shirts = shirts or (k == "Product_department" and v in ("shirts", "Shirts", "Shirt"))
                short = short or (k == "Sleeve_length" and v in ("short-sleeve", "Short Sleeve"))
            break
    for k in ("Men_regular_size_t", "Price_discount_range"):
        facets.setdefault(k, None)
    out: dict[str, Any] = {"mens_clothing": True if "mens-clothing" in path else None,
                           "shirts": True if shirts else None, "short_sleeve": True if short else None}
    for key in config["parse_keys"]:
        if key not in facets:
            continue
        if key == "Price_discount_range":
            v = facets[key] or []
            fifty = "50_PERCENT_ off & more" in v and not {"30_PERCENT_ off & more", "20_PERCENT_ off & more"} & set(v)
            out[key] = "50_PERCENT_ off & more" if fifty else "not_50_PERCENT_ off & more"
        else:
            out[key] = facets[key]
    return out


# What get_active_tab_html_parse reads from the page, in one evaluation: per CSS class or XPath, the texts OSWorld's
# Playwright calls return (textContent of each match, the first match's own text nodes, list items' spans, child h3s,
# the element showing a label's text, an input's value).
HTML_PROBE = r"""
((spec) => {
  const all = (sel) => { try { return Array.from(document.querySelectorAll(sel)); } catch (e) { return []; } };
  const first = (xp) => { try {
      return document.evaluate(xp, document, null, XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue;
    } catch (e) { return null; } };
  const norm = (t) => (t || "").replace(/\s+/g, " ").trim().toLowerCase();
  const out = {url: location.href, texts: {}, direct: {}, li: {}, h3: {}, label: {}, xpath: {}, input: {}};
  for (const c of spec.texts) out.texts[c] = all(c).map(e => (e.textContent || "").trim());
  for (const c of spec.direct) {
    const e = all(c)[0];
    out.direct[c] = e ? Array.from(e.childNodes).filter(n => n.nodeType === Node.TEXT_NODE)
                          .map(n => n.textContent.trim()).filter(Boolean) : [];
  }
  for (const c of spec.li) out.li[c] = all(c + " li.catAllProducts").map(e => e.querySelector("span"))
                                         .filter(Boolean).map(s => s.innerText.trim());
  for (const c of spec.h3) out.h3[c] = all(c).map(e => e.querySelector("h3")).filter(Boolean)
                                         .map(h => (h.textContent || "").trim());
  for (const l of spec.label) {  // the innermost element whose text contains the label, as Playwright's text=
    const want = norm(l);
    const hit = Array.from(document.body ? document.body.querySelectorAll("*") : [])
      .find(e => norm(e.textContent).includes(want)
                 && !Array.from(e.children).some(k => norm(k.textContent).includes(want)));
    out.label[l] = hit ? (hit.textContent || "").trim() : "";
  }
  for (const x of spec.xpath) { const n = first(x); out.xpath[x] = n ? (n.textContent || "").trim() : ""; }
  for (const x of spec.input) { const n = first(x); out.input[x] = n && "value" in n ? (n.value || "").trim() : ""; }
  return out;
})
"""


def _probe_spec(config: dict[str, Any]) -> dict[str, list[str]]:
    dot = lambda names: ["." + n for n in names]  # noqa: E731 - OSWorld's configs name classes without the dot
    cat = config["category"]
    spec: dict[str, list[str]] = {k: [] for k in ("texts", "direct", "li", "h3", "label", "xpath", "input")}
    if cat == "class":
        spec["texts"] = dot([*config.get("class_multiObject", {}), *config.get("class_singleObject", {}),
                             *config.get("class_multiObject_search_exist", {})])
        spec["direct"] = dot(config.get("class_multiObject_child", {}))
        spec["h3"] = dot(config.get("class_multiObject_only_child", {}))
    elif cat == "class&url":
        spec["texts"] = dot(config.get("class_multiObject", {}))
        spec["li"] = dot(config.get("class_multiObject_li", {}))
    elif cat == "label":
        spec["label"] = list(config.get("labelObject", {}))
    elif cat == "xpath":
        spec["xpath"] = list(config.get("xpathObject", {}))
    elif cat == "input":
        spec["input"] = list(config.get("inputObject", {}))
    else:
        raise ValueError(f"active_tab_html_parse: unknown category {cat!r} (class, class&url, label, xpath, input)")
    return spec


def _pick(texts: list[str], rank: str) -> str:
    i = int(rank)
    return texts[i] if len(texts) > i else ""


def _flags(texts: list[str], wanted: list[str], out: dict[str, Any]) -> None:
    """class&url: which wanted names show (case-insensitively), and whether anything else shows."""
    for w in wanted:
        if any(w.lower() == t.lower() for t in texts):
            out[w.lower()] = True
    if any(all(t.lower() not in w.lower() for w in wanted) for t in texts):
        out["is_other_exist"] = True
    out.setdefault("is_other_exist", False)


def html_parse_result(config: dict[str, Any], page: dict[str, Any]) -> dict[str, Any]:
    """OSWorld's get_active_tab_html_parse result from what HTML_PROBE read."""
    out: dict[str, Any] = {}
    cat = config["category"]
    if cat == "class":
        for name, ranks in config.get("class_multiObject", {}).items():
            out.update({key: _pick(page["texts"]["." + name], r) for r, key in ranks.items()})
        for name, ranks in config.get("class_multiObject_child", {}).items():
            out.update({key: _pick(page["direct"]["." + name], r) for r, key in ranks.items()})
        for name, ranks in config.get("class_multiObject_only_child", {}).items():
            out.update({key: _pick(page["h3"]["." + name], r) for r, key in ranks.items()})
        for name, wanted in config.get("class_multiObject_search_exist", {}).items():
            texts = page["texts"]["." + name]
            out.update({w: w in texts for w in wanted if w != "is_other_exist"})
            if "is_other_exist" in wanted:
                out["is_other_exist"] = any(t not in wanted for t in texts)
        for name, key in config.get("class_singleObject", {}).items():
            texts = page["texts"]["." + name]
            out[key] = texts[0] if texts else ""
    elif cat == "class&url":
        for name, wanted in config.get("class_multiObject", {}).items():
            _flags(page["texts"]["." + name], wanted, out)
        for name, wanted in config.get("class_multiObject_li", {}).items():
            _flags(page["li"]["." + name], wanted, out)
        url = page["url"].lower()
        for key in config.get("url_include_expected", []):
            out.setdefault(key.lower(), key.lower() in url)
        for key, value in config.get("url_include_expected_multichoice", {}).items():
            out.setdefault(value.lower(), key.lower() in url)
    else:
        field = {"label": ("labelObject", "label"), "xpath": ("xpathObject", "xpath"),
                 "input": ("inputObject", "input")}[cat]
        out.update({key: page[field[1]][sel] for sel, key in config.get(field[0], {}).items()})
    return out


def get_active_tab_html_parse(ctx: EvalContext, config: dict[str, Any]) -> dict[str, Any] | None:
    """Texts of the active tab's elements, by CSS class, label, XPath or input (OSWorld's config keys); {} when no
    open tab shows the address bar's URL."""
    from urllib.parse import unquote

    url = _active_url(ctx, config)
    if not isinstance(url, str):
        return None
    same = [t for t in open_tabs(ctx) if unquote(t.get("url", "")).rstrip("/") == unquote(url).rstrip("/")]
    if not same:
        return {}
    page = evaluate_in_tab(ctx, same[0], f"{HTML_PROBE}({json.dumps(_probe_spec(config))})")
    return html_parse_result(config, page)


def _needs_cdp(name: str) -> Callable[[EvalContext, dict[str, Any]], Any]:
    def getter(ctx: EvalContext, config: dict[str, Any]) -> Any:
        raise RuntimeError(f"getter {name!r} navigates a live site (clicks through recreation.gov's pages), which "
                           "NextState's getters do not do")

    return getter


GETTERS: dict[str, Callable[[EvalContext, dict[str, Any]], Any]] = {
    name[len("get_"):]: fn for name, fn in dict(globals()).items() if name.startswith("get_") and callable(fn)
}
for _name in ("gotoRecreationPage_and_get_html_content",):
    GETTERS[_name] = _needs_cdp(_name)
