"""OSWorld's state getters (`"result"` / `"expected"` entries of a task's evaluator), against any GuestDesktop.

A getter is called with the evaluation context and its config dict and returns what the metric compares: command
output, the local path of a file fetched from the desktop, the accessibility XML, a rule. Implemented here (OSWorld's
names): rule, vm_command_line, vm_command_error, vm_file, cloud_file, cache_file, accessibility_tree, vm_screen_size,
list_directory, vm_terminal_output (the text of the terminal ctrl+alt+t opened), vm_active_window_title
(WindowsAgentArena's name; the focused window's title).
`cloud_file` and the `download` setup step read `file://` URLs, absolute local paths and paths relative to the task
set's files directory; http(s) URLs come from $NEXTSTATE_OSWORLD_FILES (a directory in OSWorld's download-cache layout)
or, with NEXTSTATE_OSWORLD_FETCH=1, from the web (fetched by the host, never by the desktop).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.runtime.desktop import GuestDesktop

log = logging.getLogger(__name__)


@dataclass
class EvalContext:
    desktop: GuestDesktop
    cache_dir: Path  # fetched files land here (one directory per episode)
    files_dir: Path | None = None  # where relative `cloud_file` / `download` sources resolve (the task set's files)
    client_password: str = "password"
    a11y_xml: str | None = None  # the tree already fetched for this step's observation, reused by getters
    extra: dict[str, Any] = field(default_factory=dict)

    def accessibility_tree(self) -> str:
        if self.a11y_xml is None:
            self.a11y_xml = self.desktop.a11y_tree()
        return self.a11y_xml


FILES_ENV = "NEXTSTATE_OSWORLD_FILES"  # a directory of task files named as OSWorld caches them: <uuid5(url)>_<name>
FETCH_ENV = "NEXTSTATE_OSWORLD_FETCH"  # "1": fetch http(s) task files from the web (from the host, never the desktop)


def is_remote(url: str) -> bool:
    return url.startswith(("http://", "https://"))


def mirrored(url: str) -> Path | None:
    """The local copy of a remote task file in $NEXTSTATE_OSWORLD_FILES, if there is one. The layout is OSWorld's own
    download cache (`cache/<task id>/<uuid5(url)>_<file name>`), so that directory can be used as it is."""
    root = os.environ.get(FILES_ENV)
    if not root:
        return None
    key = str(uuid.uuid5(uuid.NAMESPACE_URL, url))
    for found in sorted(Path(root).glob(f"**/{key}*")):
        if found.is_file():
            return found
    return None


def fetching_allowed() -> bool:
    return os.environ.get(FETCH_ENV, "0") == "1"


def offline_refusal(url: str) -> str:
    return (
        f"needs {url[:80]}{'...' if len(url) > 80 else ''}, which cannot be fetched offline: put the file in "
        f"${FILES_ENV} (OSWorld's cache layout), or set {FETCH_ENV}=1 where the web is reachable"
    )


def fetch_source(url: str, files_dir: Path | None, cache_dir: Path) -> bytes:
    """Bytes of a task-side file: file:// URL, absolute path, a path under `files_dir`, or http(s): its copy in
    $NEXTSTATE_OSWORLD_FILES, else (with NEXTSTATE_OSWORLD_FETCH=1) downloaded by the host and cached."""
    if url.startswith("file://"):
        return Path(url[len("file://") :]).read_bytes()
    if is_remote(url):
        local = mirrored(url)
        if local is not None:
            return local.read_bytes()
        cached = cache_dir / f"url-{uuid.uuid5(uuid.NAMESPACE_URL, url)}"
        if cached.exists():
            return cached.read_bytes()
        if not fetching_allowed():
            raise FileNotFoundError(offline_refusal(url))
        import httpx

        try:
            resp = httpx.get(url, follow_redirects=True, timeout=60)
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise FileNotFoundError(
                f"could not download {url}: {exc} (this machine may be offline; bundle the file "
                "with the task set and refer to it by a relative path)"
            ) from exc
        cache_dir.mkdir(parents=True, exist_ok=True)
        cached.write_bytes(resp.content)
        return resp.content
    path = Path(url)
    if not path.is_absolute():
        if files_dir is None:
            raise FileNotFoundError(f"{url!r} is a relative path but this task set has no files directory")
        path = files_dir / url
    return path.read_bytes()


def _multi(config: dict[str, Any]) -> tuple[list[str], list[str], set[int]]:
    if config.get("multi", False):
        return list(config["path"]), list(config["dest"]), set(config.get("gives", [0]))
    return [config["path"]], [config["dest"]], set(config.get("gives", [0]))


def get_rule(ctx: EvalContext, config: dict[str, Any]) -> Any:
    return config["rules"]


def get_vm_command_line(ctx: EvalContext, config: dict[str, Any]) -> str:
    return ctx.desktop.execute(config["command"], shell=bool(config.get("shell", False))).stdout


def get_vm_command_error(ctx: EvalContext, config: dict[str, Any]) -> str:
    return ctx.desktop.execute(config["command"], shell=bool(config.get("shell", False))).stderr


def get_vm_file(ctx: EvalContext, config: dict[str, Any]) -> str | None | list[str | None]:
    """Fetch file(s) from the desktop into the cache; the local path (None where the file is missing)."""
    paths, dests, gives = _multi(config)
    out: list[str | None] = []
    ctx.cache_dir.mkdir(parents=True, exist_ok=True)
    for i, (p, d) in enumerate(zip(paths, dests)):
        local = ctx.cache_dir / d
        try:
            data = ctx.desktop.read_file(p)
        except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
            log.debug("vm_file: %s not readable on the desktop: %s", p, exc)
            if i in gives:
                out.append(None)
            continue
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(data)
        if i in gives:
            out.append(str(local))
    return out[0] if len(out) == 1 else out


def get_cloud_file(ctx: EvalContext, config: dict[str, Any]) -> str | list[str]:
    paths, dests, gives = _multi(config)
    out = []
    ctx.cache_dir.mkdir(parents=True, exist_ok=True)
    for i, (p, d) in enumerate(zip(paths, dests)):
        local = ctx.cache_dir / d
        if not local.exists():
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(fetch_source(p, ctx.files_dir, ctx.cache_dir))
        if i in gives:
            out.append(str(local))
    return out[0] if len(out) == 1 else out


def get_cache_file(ctx: EvalContext, config: dict[str, Any]) -> str:
    path = ctx.cache_dir / config["path"]
    if not path.exists():
        raise FileNotFoundError(f"cache_file: {config['path']} is not in the episode cache")
    return str(path)


def get_accessibility_tree(ctx: EvalContext, config: dict[str, Any]) -> str:
    return ctx.accessibility_tree()


def get_vm_screen_size(ctx: EvalContext, config: dict[str, Any]) -> dict[str, int]:
    w, h = ctx.desktop.screen_size()
    return {"width": w, "height": h}


def get_list_directory(ctx: EvalContext, config: dict[str, Any]) -> dict[str, Any]:
    """OSWorld's /list_directory tree: {type, name, children: [...]}, listed through a command on the desktop."""
    script = (
        "import json,os,sys\n"
        "def t(d):\n"
        "  try:\n"
        "    return {'type':'directory','name':os.path.basename(d),'children':[t(os.path.join(d,e)) "
        "if os.path.isdir(os.path.join(d,e)) else {'type':'file','name':e} for e in os.listdir(d)]}\n"
        "  except OSError as e:\n"
        "    return {'error':str(e)}\n"
        "print(json.dumps(t(os.path.expanduser(sys.argv[1]))))\n"
    )
    import json

    res = ctx.desktop.execute(["python3", "-c", script, config["path"]])
    if not res.ok:
        raise FileNotFoundError(f"list_directory {config['path']}: {res.stderr.strip()}")
    return json.loads(res.stdout)


def get_vm_terminal_output(ctx: EvalContext, config: dict[str, Any]) -> str | None:
    """The text of the terminal the agent opened with ctrl+alt+t (OSWorld: gnome-terminal's, through AT-SPI)."""
    return ctx.desktop.terminal_output()


def get_vm_active_window_title(ctx: EvalContext, config: dict[str, Any]) -> str | None:
    for w in ctx.desktop.windows():
        if w.focused:
            return w.title
    return None


GETTERS: dict[str, Callable[[EvalContext, dict[str, Any]], Any]] = {
    name[len("get_") :]: fn for name, fn in dict(globals()).items() if name.startswith("get_") and callable(fn)
}
