"""Read a task's Dockerfile into the steps the local builder (`envs.terminal.task_image`) can replay offline.

Only what a single-stage task environment needs is accepted: `FROM` (one, first), `RUN`, `COPY`, `ADD` (local files and
archives), `WORKDIR`, `ENV`, `ARG`, `USER`. Metadata that changes no file (`LABEL`, `EXPOSE`, `CMD`, `ENTRYPOINT`,
`VOLUME`, `STOPSIGNAL`, `HEALTHCHECK`, `MAINTAINER`) is read and ignored. Anything else (a second `FROM`, `COPY --from`,
`ONBUILD`, `SHELL`, an `ADD` of a URL) is a `DockerfileError` naming the line and the reason. A `RUN` with BuildKit
heredocs (`RUN cat <<EOF > f` and the lines up to `EOF`) keeps its body: the shell reads it as its own heredoc.
Variables (`$X`, `${X}`, `${X:-default}`, `${X:+alt}`) are expanded in the instructions Docker expands them in;
`RUN` lines are left to the shell, with the `ENV` and `ARG` values in its environment.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

IGNORED = frozenset({"LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "VOLUME", "STOPSIGNAL", "HEALTHCHECK", "MAINTAINER"})
SUPPORTED = frozenset({"FROM", "RUN", "COPY", "ADD", "WORKDIR", "ENV", "ARG", "USER"})
_VAR = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:[-+])(?P<word>[^}]*))?\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")


class DockerfileError(ValueError):
    """A Dockerfile the local builder cannot replay; the message names the file, the line and why."""


@dataclass(frozen=True)
class Step:
    """One instruction to replay. `args` depend on `op`: RUN (the shell command), COPY/ADD (sources..., dest),
    WORKDIR (a path), ENV and ARG (name, value; an ARG is seen by RUN only), USER (a user[:group]). `options` holds COPY/ADD flags (`chown`, `chmod`)."""

    op: str
    args: tuple[str, ...]
    line: int
    options: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Dockerfile:
    base: str  # the FROM image, variables expanded
    steps: tuple[Step, ...]
    ignored: tuple[str, ...] = ()  # the metadata instructions read and ignored ("CMD (line 12)")


def parse_dockerfile(path: str | Path, build_args: dict[str, str] | None = None,
                     environment: dict[str, str] | None = None) -> Dockerfile:
    """Parse `path`; raise DockerfileError for what the local builder cannot do. `environment`: the base image's ENV
    (what `$PATH` means before the file sets it)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DockerfileError(f"{path}: cannot read it ({exc})") from None
    return parse_dockerfile_text(text, str(path), build_args, environment)


def parse_dockerfile_text(text: str, where: str = "Dockerfile", build_args: dict[str, str] | None = None,
                          environment: dict[str, str] | None = None) -> Dockerfile:
    variables: dict[str, str] = dict(environment or {})
    given = dict(build_args or {})
    base: str | None = None
    steps: list[Step] = []
    ignored: list[str] = []
    for line, op, rest in _instructions(text, where):
        def error(reason: str) -> DockerfileError:
            return DockerfileError(f"{where} line {line}: {op} {reason}")

        if op == "ARG":
            for name, default in _arg_pairs(rest, error):
                variables[name] = given.get(name, _expand(default, variables) if default is not None else "")
                if base is not None:  # an ARG after FROM is in the environment of the RUN steps after it
                    steps.append(Step("ARG", (name, variables[name]), line))
            continue
        if op == "FROM":
            if base is not None:
                raise error("a second FROM: multi-stage builds are not supported; build the stages into one")
            words = rest.split()
            words = [w for w in words if not w.startswith("--platform")]
            if not words or (len(words) not in (1, 3) or (len(words) == 3 and words[1].upper() != "AS")):
                raise error(f"has an unreadable image reference {rest!r}")
            base = _expand(words[0], variables)
            continue
        if base is None:
            raise error("comes before FROM")
        if op in IGNORED:
            ignored.append(f"{op} (line {line})")
            continue
        if op not in SUPPORTED:
            raise error("is not supported by the local builder (it replays FROM, RUN, COPY, ADD, WORKDIR, ENV, ARG, "
                        "USER and ignores metadata)")
        if op == "RUN":
            flags, rest = _leading_flags(rest)
            if flags:
                raise error(f"with flags {', '.join(flags)} is not supported")
            form = _is_json(rest)
            cmd = shlex.join(form) if form is not None else rest
            steps.append(Step("RUN", (cmd,), line))
        elif op in ("COPY", "ADD"):
            flags, rest = _leading_flags(rest)
            options: dict[str, str] = {}
            for flag in flags:
                name, _, value = flag[2:].partition("=")
                if name in ("chown", "chmod"):
                    options[name] = _expand(value, variables)
                elif name == "from":
                    raise error("--from copies out of another image or stage, which the local builder does not have")
                elif name not in ("link",):  # --link changes layer caching only
                    raise error(f"flag --{name} is not supported")
            form = _is_json(rest)
            words = form if form is not None else shlex.split(rest)
            words = [_expand(w, variables) for w in words]
            if len(words) < 2:
                raise error("needs at least one source and a destination")
            if op == "ADD" and any(re.match(r"^[a-z]+://", w) for w in words[:-1]):
                raise error("of a URL: the task's files must be in its directory (no network at build time)")
            steps.append(Step(op, tuple(words), line, options))
        elif op == "WORKDIR":
            steps.append(Step(op, (_expand(rest.strip(), variables),), line))
        elif op == "USER":
            steps.append(Step(op, (_expand(rest.strip(), variables),), line))
        elif op == "ENV":
            for name, value in _env_pairs(rest, error):
                value = _expand(value, variables)
                variables[name] = value
                steps.append(Step("ENV", (name, value), line))
    if base is None:
        raise DockerfileError(f"{where}: no FROM instruction")
    return Dockerfile(base, tuple(steps), tuple(ignored))


_HEREDOC = re.compile(r"<<-?\s*([\"']?)([A-Za-z_][A-Za-z0-9_]*)\1")


def _instructions(text: str, where: str):
    """(line number, INSTRUCTION, rest) per logical line: comments dropped, backslash continuations joined, a RUN's
    heredoc bodies kept (newline-separated) after its first line."""
    pending: list[str] = []
    start = 0
    lines = iter(enumerate(text.splitlines(), 1))
    for number, raw in lines:
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):  # a comment inside a continued instruction is dropped
            continue
        if not pending:
            start = number
        if raw.rstrip().endswith("\\"):
            pending.append(raw.rstrip()[:-1])
            continue
        pending.append(raw)
        logical = " ".join(p.strip() for p in pending if p.strip())
        pending = []
        op, _, rest = logical.partition(" ")
        if not re.fullmatch(r"[A-Za-z]+", op):
            raise DockerfileError(f"{where} line {start}: {op!r} is not an instruction")
        if op.upper() in ("RUN", "COPY") and (ends := [m.group(2) for m in _HEREDOC.finditer(rest)]):
            if op.upper() == "COPY":
                raise DockerfileError(f"{where} line {start}: COPY from a heredoc is not supported")
            body = []
            for end in ends:
                for _, more in lines:
                    body.append(more)
                    if more.strip() == end:
                        break
                else:
                    raise DockerfileError(f"{where} line {start}: the heredoc {end} never ends")
            rest = rest + "\n" + "\n".join(body)
        yield start, op.upper(), rest.strip()
    if pending:
        raise DockerfileError(f"{where} line {start}: the file ends inside a continued line")


def _is_json(rest: str) -> list[str] | None:
    if not rest.startswith("["):
        return None
    try:
        value = json.loads(rest)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def _leading_flags(rest: str) -> tuple[list[str], str]:
    flags = []
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        flags.append(flag)
        rest = rest.lstrip()
    return flags, rest


def _expand(text: str, variables: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        name = m.group("braced") or m.group("plain")
        value = variables.get(name, "")
        op = m.group("op")
        if op == ":-":
            return value or m.group("word")
        if op == ":+":
            return m.group("word") if value else ""
        return value

    return _VAR.sub(sub, text.replace("\\$", "\0")).replace("\0", "$")


def _env_pairs(rest: str, error) -> list[tuple[str, str]]:
    try:
        words = shlex.split(rest)
    except ValueError as exc:
        raise error(f"cannot be read ({exc})") from None
    if not words:
        raise error("names no variable")
    if "=" not in words[0]:  # the legacy form: ENV NAME value with spaces
        name, _, value = rest.partition(" ")
        return [(name, " ".join(shlex.split(value)) if value.strip() else "")]
    pairs = []
    for w in words:
        name, eq, value = w.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise error(f"has {w!r}, which is not NAME=value")
        pairs.append((name, value))
    return pairs


def _arg_pairs(rest: str, error) -> list[tuple[str, str | None]]:
    pairs = []
    for w in shlex.split(rest):
        name, eq, value = w.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise error(f"has {w!r}, which is not NAME or NAME=default")
        pairs.append((name, value if eq else None))
    return pairs


__all__ = ["Dockerfile", "DockerfileError", "Step", "parse_dockerfile", "parse_dockerfile_text"]
