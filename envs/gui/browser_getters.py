"""OSWorld's Chromium getters: the profile's files (Preferences, Bookmarks, History, Cookies) and, over the browser's
DevTools endpoint on the desktop's loopback, its tabs, pages and address bar.

OSWorld drives Chrome with Playwright from the host; here every DevTools call runs on the desktop (a stdlib HTTP and
websocket client started with the desktop's python3), since the desktop's loopback is not the host's. The profile is
Google Chrome's (`~/.config/google-chrome`, OSWorld's) or Debian's Chromium's (`~/.config/chromium`). A browser that
is not running, or a profile that does not exist, raises FileNotFoundError with a one-line reason (scored 0);
`gotoRecreationPage_and_get_html_content` (it clicks through a live site) raises RuntimeError saying so.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlparse

from envs.gui.app_getters import http_on_desktop, save_to_cache
from envs.gui.getters import EvalContext

log = logging.getLogger(__name__)

CHROME_PROFILES = ("~/.config/google-chrome/Default", "~/.config/chromium/Default")  # OSWorld's Chrome, Debian's
DEVTOOLS_PORTS = (9222, 1337)  # OSWorld forwards 9222 to Chrome's --remote-debugging-port=1337


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
    path = save_to_cache(ctx, dest, _profile_file(ctx, name))
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


CONTENT_SETTING_SESSION_ONLY = 4  # Chrome's "clear on exit" value of a content setting


def get_data_delete_automacally(ctx: EvalContext, config: dict[str, Any]) -> str:
    """"true" once the profile's default cookie setting is session-only: "Delete cookies and site data when you close
    all windows", how Chrome records deleting browsing data on close. (OSWorld's getter answers "true" as soon as the
    profile has any default content setting, which Chromium 150 writes by itself on its first exit.)"""
    values = _preferences(ctx).get("profile", {}).get("default_content_setting_values") or {}
    return "true" if values.get("cookies") == CONTENT_SETTING_SESSION_ONLY else "false"


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
            body = http_on_desktop(ctx, f"http://localhost:{port}{path}", method=method)
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
    return save_to_cache(ctx, config["dest"], base64.b64decode(data))


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
