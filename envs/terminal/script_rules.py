"""What a task directory's scripts do, read the way they run: the facts behind its load-time refusals.

`envs.terminal.task_dirs` refuses a task whose tests fetch from the web, talk to a server off this machine, use the
oracle's files, or whose Dockerfile adds a package source other than Debian's. Each rule reads only what runs:
- shell (test scripts, `RUN` steps): comments are dropped by bash's rule (a `#` that starts a word, outside quotes;
  heredoc bodies kept as they are), and `curl` / `wget` of loopback (`localhost`, `127.x`, `[::1]`, `0.0.0.0`) is
  the task's own server, not the web;
- Python (test files): the code's imports and its string literals other than docstrings, from `ast` (a comment or a
  docstring runs nothing); a file that does not parse is read as text, as before;
- apt sources: only a step that names a source outside Debian's own hosts (`*.debian.org`) adds one.
"""

from __future__ import annotations

import ast
import re

# commands that fetch from the web at test time (a curl / wget to a remote host is checked apart)
FETCH_COMMANDS = re.compile(r"astral\.sh|\buv\s+(pip|add|sync|init|venv|run)\b|\bpip3?\s+install\b"
                            r"|\bapt(-get)?\s+(update|install)\b")
DOWNLOADERS = re.compile(r"\b(curl|wget)\b([^\n;|&]*)")
URL = re.compile(r"\b(?:https?|ftp)://(\[[0-9A-Fa-f:.]+\]|[\w.-]+)")  # the host ("{host}", "$HOST": none)
BARE_LOOPBACK = re.compile(r"(?:^|[\s'\"])(localhost|127(?:\.\d+){3}|0\.0\.0\.0|\[::1\])(?::\d+)?(?:/|[\s'\"]|$)")
HTTP_CLIENTS = frozenset({"requests", "httpx", "aiohttp", "urllib.request", "urllib3", "http.client"})
# `/solution` as a path of its own, also a parameter's default (`${1:-/solution}`), not inside another one
# (my-app/solution)
# `solution/solve.*` as a word of its own: after a quote or space, or starting a line (a Python string literal, which
# python_code gives one per line without its quotes)
ORACLE_PATH = re.compile(r"(?:(?<![\w.-])|(?<=:-))/solution\b|(?:^|(?<=[\"' ]))solution/solve\.\w+", re.M)
APT_SOURCES = re.compile(r"/etc/apt/sources\.list(\.d/[\w.-]+)?")
PPA = re.compile(r"\badd-apt-repository\b[^&;|\n]*|\bppa:[\w./-]+")
_WORD_START = frozenset(" \t\n;&|()<>`")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")


def is_loopback_host(host: str) -> bool:
    host = host.strip("[]").lower()
    return host in ("localhost", "::1", "0.0.0.0") or bool(re.fullmatch(r"127(\.\d+){3}", host)) \
        or host.endswith(".localhost")


def strip_shell_comments(text: str) -> str:
    """`text` without its shell comments: from a `#` that starts a word, outside quotes, to the end of its line (as
    bash reads it: `a#b`, `${#x}` and `"# x"` are not comments). Heredoc bodies are kept as they are."""
    out: list[str] = []
    quote = ""
    heredocs: list[tuple[str, bool]] = []  # delimiters whose bodies start after this line
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\" and quote == '"' and i + 1 < n:
                out.append(text[i:i + 2])
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c == "\\" and i + 1 < n:
            out.append(text[i:i + 2])
            i += 2
            continue
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] in _WORD_START):
            while i < n and text[i] != "\n":
                i += 1
            continue
        elif text.startswith("<<<", i):  # a here-string, not a heredoc
            out.append("<<<")
            i += 3
            continue
        elif c == "<" and (m := _HEREDOC.match(text, i)):
            heredocs.append((m.group(2), text.startswith("<<-", i)))
            out.append(m.group(0))
            i = m.end()
            continue
        elif c == "\n" and heredocs:
            i = _copy_heredocs(text, i + 1, heredocs, out)
            heredocs = []
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _copy_heredocs(text: str, i: int, heredocs: list[tuple[str, bool]], out: list[str]) -> int:
    out.append("\n")
    for end, tabs in heredocs:
        while i < len(text):
            nl = text.find("\n", i)
            line = text[i:] if nl < 0 else text[i:nl + 1]
            out.append(line)
            i += len(line)
            if (line.lstrip("\t") if tabs else line).rstrip("\n") == end:
                break
    return i


def fetches_from_web(script: str) -> str | None:
    """What in a shell script fetches from the web at run time (its text), or None: uv / pip / apt installs, and
    `curl` / `wget` of anything but loopback (a download with no visible URL counts: it is not the task's own)."""
    code = strip_shell_comments(script)
    if m := FETCH_COMMANDS.search(code):
        return m.group(0)
    for m in DOWNLOADERS.finditer(code):
        args = m.group(2)
        remote = [h for h in URL.findall(args) if not is_loopback_host(h)]
        if remote or not (BARE_LOOPBACK.search(args) or URL.search(args)):
            return m.group(0).strip()
    return None


def python_code(text: str) -> tuple[set[str], list[str]] | None:
    """(the modules a Python file imports, its string literals but docstrings), or None when it does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str)}
    imports: set[str] = set()
    strings: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imports.add(node.module)
            imports.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            strings.append(node.value)
    return imports, strings


def remote_server(text: str) -> str | None:
    """The host a Python test file talks to off this machine (an HTTP client imported and a URL to a host that is
    not loopback in its code), or None."""
    code = python_code(text)
    if code is None:  # unparseable: read as text
        imports_client = bool(re.search(r"^[ \t]*(import|from)[ \t]+(requests|httpx|aiohttp|urllib|http\.client)\b",
                                        text, re.M))
        strings = [text]
    else:
        imports, strings = code
        imports_client = bool(imports & HTTP_CLIENTS)
    if not imports_client:
        return None
    return next((h for s in strings for h in URL.findall(s) if not is_loopback_host(h)), None)


def code_that_runs(text: str, python: bool) -> str:
    """What of a test file runs: a Python file's string literals but docstrings, one per line (the whole text when it
    does not parse), a shell script without its comments."""
    code = python_code(text) if python else None
    return "\n".join(code[1]) if code is not None else strip_shell_comments(text)


def oracle_reference(text: str, python: bool) -> str | None:
    """Where a test file uses the oracle's files (`/solution`, `solution/solve.*`) in code that runs, or None."""
    m = ORACLE_PATH.search(code_that_runs(text, python))
    return m.group(0).strip(" \"'") if m else None


# a service manager asked whether a service runs: such a service is one the agent started and left running
SERVICE_STATUS = re.compile(r"\bsupervisorctl\s+status\b|\bsystemctl\s+(?:is-active|status)\b")


def service_check(text: str, python: bool) -> str | None:
    """Where a test file asks a service manager whether a service runs (`supervisorctl status`, `systemctl
    is-active`), in code that runs, or None. Such tests pass only while the agent's processes still run, and here
    every agent process has ended before the tests start (an agent's process left running could rewrite the verdict)."""
    m = SERVICE_STATUS.search(code_that_runs(text, python))
    return " ".join(m.group(0).split()) if m else None


def foreign_apt_source(command: str) -> str | None:
    """What in a `RUN` command adds a package source other than Debian's (a PPA, a vendor's apt repository), or
    None. Editing Debian's own sources (`debian.sources`, a file naming only *.debian.org) adds none."""
    code = strip_shell_comments(command)
    if m := PPA.search(code):
        return m.group(0).strip()
    if m := APT_SOURCES.search(code):
        foreign = [h for h in URL.findall(code) if not _debian_host(h)]
        if foreign:
            return f"{m.group(0)} ({foreign[0]})"
    return None


def _debian_host(host: str) -> bool:
    host = host.lower()
    return host == "debian.org" or host.endswith(".debian.org")


__all__ = ["code_that_runs", "fetches_from_web", "foreign_apt_source", "is_loopback_host", "oracle_reference",
           "python_code", "remote_server", "service_check", "strip_shell_comments"]
