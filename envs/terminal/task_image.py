"""Build a Terminal-Bench / Harbor task's environment from its Dockerfile, without a registry, once per content hash.

No registry is reachable, so `FROM` is mapped to a base the project builds itself (`BASES`, chosen by `base_images`
patterns): Debian bookworm from debootstrap (the sandbox image's rootfs, `envs.runtime.images`), and for `python:*`
images the Python version the tag asks for in /usr/local (`envs.terminal.python_bases`), first on PATH as `python`,
`python3` and `pip`, with pip's permission to install system-wide, as those images have (the tests' runner is never
in an image: the verifier binds it in, `envs.terminal.test_runner`). Then the Dockerfile's steps are replayed
in a `BuildSandbox` (`envs.terminal.build_sandbox`): each `RUN` in a fresh user-namespace root over the build's
layers (uid 0 inside is an unprivileged host uid, a minimal /dev, no host path, nothing it starts outlives it), its
writes on a disk capped at the task's `storage_mb`, its only way out a proxy to the package registries (never the
host's loopback or its other addresses; the host's CA bundle at build time only, never left in the image), with the
Dockerfile's ENV / ARG; `COPY` / `ADD` of the task's files (archives unpacked) read on the host and extracted by tar
inside, so neither a symlink in the root nor a step reaches the build context; `WORKDIR`, `ENV`, `USER` recorded as the
image's config.

The result is a tarball plus its config (`BuiltEnvironment`), tarred inside and checked member by member on the
host, cached by a hash of the base (its Python version included), the Dockerfile and every file of the build
context, under `$NEXTSTATE_TASK_ENV_CACHE` (default: `<image cache>/task-envs`). One build serves both backends:
`local_root` unpacks it with its owners shifted for the namespace sandbox (`envs.runtime.rootfs_runtime`),
`docker_image` imports it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import shlex
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from envs.runtime.host_paths import file_lock
from envs.runtime.rootfs_image import build_rootfs_tarball, default_cache_dir, import_tarball
from envs.terminal.build_sandbox import BUILD_UID_BASE, BuildError, BuildSandbox, StepResult, StepSandbox, \
    host_ca_bundle
from envs.terminal.dockerfile import Dockerfile, Step, parse_dockerfile
from envs.terminal.python_bases import DEBIAN_PYTHON, Interpreter, asked_python, choose_python, install_python

log = logging.getLogger(__name__)

BUILDER_REVISION = "11"  # bump when the replay of a step changes what it makes (hashed into every key)
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_STORAGE_MB = 10240  # a build's writes when the task names no storage_mb (Harbor's default)
BASES = ("debian", "debian-python")
#: images whose own Dockerfile ends in a WORKDIR, so their tasks start there (Terminal-Bench's base images: /app)
BASE_WORKDIRS: dict[str, str] = {"ghcr.io/laude-institute/t-bench/*": "/app"}
#: `FROM` patterns (fnmatch, first match wins) -> base; `env.base_images` entries come before these
DEFAULT_BASE_IMAGES: dict[str, str] = {
    "python:*": "debian-python",
    "*/python:*": "debian-python",
    "ghcr.io/laude-institute/t-bench/python-*": "debian-python",
    "ghcr.io/laude-institute/t-bench/*": "debian",
    "ubuntu*": "debian",
    "*/ubuntu*": "debian",
    "debian*": "debian",
    "*/debian*": "debian",
    "buildpack-deps*": "debian",
}


def task_cache_dir() -> Path:
    """Where built task environments, their bases and their unpacked roots live."""
    if os.environ.get("NEXTSTATE_TASK_ENV_CACHE"):
        return Path(os.environ["NEXTSTATE_TASK_ENV_CACHE"])
    return default_cache_dir() / "task-envs"


@dataclass(frozen=True)
class BuiltEnvironment:
    key: str
    tarball: str
    base: str  # the local base it was built on
    from_image: str  # the Dockerfile's FROM
    env: dict[str, str]  # the image's environment (ENV steps over the base's)
    workdir: str
    user: str  # the Dockerfile's last USER, as written
    uid_gid: str  # that user as "uid:gid" in the built root's /etc/passwd and /etc/group
    home: str  # its home directory there (HOME, as docker sets it)
    size_bytes: int
    build_s: float  # 0.0 when it came from the cache
    python: str = ""  # a python:* image's interpreter ("3.12.1", "3.11 (Debian)"); "" for the others

    @property
    def docker_tag(self) -> str:
        return f"nextstate/task-env:{self.key}"


def resolve_base(image: str, base_images: Mapping[str, str] | None = None) -> str | None:
    """The local base for `FROM image`, or None when no pattern maps it."""
    for pattern, base in [*(base_images or {}).items(), *DEFAULT_BASE_IMAGES.items()]:
        if fnmatch.fnmatchcase(image, pattern):
            if base not in BASES:
                raise ValueError(f"env.base_images maps {pattern!r} to {base!r}; the local bases are "
                                 f"{', '.join(BASES)}")
            return base
    return None


def environment_key(task: Mapping[str, Any], base_key: str) -> str:
    """Hash of what the build reads: the builder, the base, the Dockerfile and every file under the build context."""
    h = hashlib.sha256(f"{BUILDER_REVISION}\0{base_key}\0".encode())
    context = Path(task["context"])
    h.update(Path(task["dockerfile"]).read_bytes())
    for p in sorted(context.rglob("*")):
        rel = p.relative_to(context).as_posix()
        st = p.lstat()
        h.update(f"\0{rel}\0{st.st_mode:o}\0".encode())
        if p.is_symlink():
            h.update(os.readlink(p).encode())
        elif p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def build_task_environment(task: Mapping[str, Any], *, base_images: Mapping[str, str] | None = None,
                           cache_dir: Path | None = None) -> BuiltEnvironment:
    """The task's built environment, from the cache when its key is there. Needs root (a uid range, a loop device)."""
    cache = cache_dir or task_cache_dir()
    base = resolve_base(parse_dockerfile(task["dockerfile"]).base, base_images)
    if base is None:
        raise BuildError(f"terminal task {task['id']!r}: FROM {task['base_image']} has no local base; map it with "
                         f"env.base_images (a pattern -> one of {', '.join(BASES)})")
    spec = parse_dockerfile(task["dockerfile"], environment=base_env(base))  # `$PATH` in ENV means the base's
    python = task_python(task, spec.base) if base == "debian-python" else None
    base_tar = ensure_base(base, cache, python)
    key = environment_key(task, base_tar.name)
    out_dir = cache
    meta_path = out_dir / f"{key}.json"
    with file_lock(out_dir / f".{key}.lock"):
        if meta_path.exists():
            return BuiltEnvironment(**{**json.loads(meta_path.read_text()), "build_s": 0.0})
        if os.geteuid() != 0:
            raise PermissionError(f"building terminal task {task['id']!r}'s environment needs root (a uid range)")
        t0 = time.monotonic()
        deadline = t0 + float(task.get("build_timeout_s") or 900.0)
        storage = int(float((task.get("resources") or {}).get("storage_mb") or DEFAULT_STORAGE_MB)) << 20
        tarball = out_dir / f"{key}.tar"
        with BuildSandbox(build_lower(base_tar, cache), storage_bytes=storage, work_dir=cache / ".building" / key,
                          ca_bundle=host_ca_bundle()) as box:
            config = _replay(task, spec, box, base_env(base), deadline)
            limit = base_tar.stat().st_size + storage + (storage >> 2) + (64 << 20)
            config.update(_export(task, box, config["user"], tarball, limit, deadline))
        built = BuiltEnvironment(key=key, tarball=str(tarball), base=base, from_image=spec.base,
                                 size_bytes=tarball.stat().st_size, build_s=round(time.monotonic() - t0, 2),
                                 python=python.full_version if python else "", **config)
        meta_path.write_text(json.dumps(asdict(built), indent=1))
        log.info("built terminal task %s's environment in %.1f s (%d MiB): %s", task["id"], built.build_s,
                 built.size_bytes >> 20, tarball)
        return built


def task_python(task: Mapping[str, Any], image: str) -> Interpreter:
    """The interpreter of a python:* image: the version chosen when the task was loaded (`task["python"]`, see
    `envs.terminal.task_dirs`), else the one its tag asks for (an image mapped to the base by a pattern: 3.11)."""
    try:
        return choose_python(str(task.get("python") or asked_python(image) or DEBIAN_PYTHON))[0]
    except ValueError as exc:
        raise BuildError(f"terminal task {task['id']!r}: FROM {image} {exc}") from None


def build_lower(base_tar: Path, cache: Path) -> Path:
    """The base unpacked once, its owners shifted into the builds' uid range: every build's read-only lower layer."""
    from envs.runtime.sandbox_root import unpack_shifted

    return unpack_shifted(base_tar, cache / "roots" / f"{base_tar.stem}-u{BUILD_UID_BASE}", BUILD_UID_BASE)


# ----- the bases -----
def base_env(base: str) -> dict[str, str]:
    env = {"PATH": DEBIAN_PATH, "LANG": "C.UTF-8"}  # HOME comes from the user's passwd entry, as in docker
    if base == "debian-python":
        env["PIP_BREAK_SYSTEM_PACKAGES"] = "1"  # a python:* image's pip installs system-wide
    return env


def ensure_base(base: str, cache: Path, python: Interpreter | None = None) -> Path:
    """The base's tarball: the sandbox image's debootstrapped rootfs (from the image cache, where `python -m
    envs.runtime.images rootfs` builds it) with a python image's interpreter. (The tests' runner is never in an
    image: the verifier binds it in, `envs.terminal.test_runner`.)"""
    from envs.runtime.images import ImageRecipe

    rootfs = build_rootfs_tarball(ImageRecipe(), default_cache_dir())
    interpreter = python.full_version if python else ""
    digest = hashlib.sha256(f"{rootfs.name}\0{BUILDER_REVISION}\0{interpreter}".encode()).hexdigest()[:12]
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"base-{base}{python.version if python else ''}-{digest}.tar"
    with file_lock(out.with_name(f".{out.name}.lock")):
        if out.exists():
            return out
        with tempfile.TemporaryDirectory(prefix="nextstate-task-base-", dir=out.parent) as tmp:
            root = Path(tmp) / "root"
            root.mkdir()
            _untar(rootfs, root)
            # what docker writes into every container: localhost resolves (tests talk to servers the agent started)
            (root / "etc/hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                                            "127.0.1.1\tsandbox\n")
            if python is not None:
                install_python(root, python)
            _tar(root, out)
        return out


# ----- replaying the steps -----
def _replay(task: Mapping[str, Any], spec: Dockerfile, box: BuildSandbox, env: dict[str, str], deadline: float
            ) -> dict[str, Any]:
    context = Path(task["context"]).resolve()
    workdir = next((w for pattern, w in BASE_WORKDIRS.items() if fnmatch.fnmatchcase(spec.base, pattern)), "/")
    user = "root"
    args: dict[str, str] = {}
    if workdir != "/":
        _run(box, f"mkdir -p {shlex.quote(workdir)}", "root", "/", env, deadline, "the base's WORKDIR")
    for step in spec.steps:
        where = f"terminal task {task['id']!r}: Dockerfile line {step.line} ({step.op})"
        if step.op == "ENV":
            env[step.args[0]] = step.args[1]
        elif step.op == "ARG":
            args[step.args[0]] = step.args[1]
        elif step.op == "USER":
            user = step.args[0]
        elif step.op == "WORKDIR":
            workdir = os.path.normpath(os.path.join(workdir, step.args[0]))
            with _step(box, where, deadline) as s:
                script = _workdir_script(workdir, None if _is_root(user) else _ids(s, user, deadline, where))
                _check(s.run(["/bin/sh", "-c", script], env=env, deadline=deadline), where, script)
        elif step.op == "RUN":
            _run(box, step.args[0], user, workdir, {**args, **env}, deadline, where, network=True)
        else:  # COPY / ADD
            _copy(step, context, box, workdir, deadline, where)
    return {"env": env, "workdir": workdir, "user": user}


def _step(box: BuildSandbox, where: str, deadline: float, *, network: bool = False):
    if time.monotonic() >= deadline:
        raise BuildError(f"{where}: the build ran past the task's build_timeout_sec")
    return box.step(network=network)


def _run(box: BuildSandbox, command: str, user: str, workdir: str, env: Mapping[str, str], deadline: float,
         where: str, *, network: bool = False) -> None:
    """`/bin/sh -c command` in a fresh step sandbox as `user` in `workdir` (a RUN step: with the network)."""
    with _step(box, where, deadline, network=network) as s:
        uid, gid = _ids(s, user, deadline, where)
        result = s.run(["/bin/sh", "-c", command], env=env, deadline=deadline, uid=uid, gid=gid, cwd=workdir)
    _check(result, where, command)


def _check(result: StepResult, where: str, command: str) -> None:
    refused = "".join(f"\n(build proxy) {line}" for line in result.refused)
    if result.exit_code is None:
        raise BuildError(f"{where}: timed out (the task's build_timeout_sec)\n{_tail(result.output)}{refused}")
    if result.exit_code != 0:
        raise BuildError(f"{where} failed (exit {result.exit_code}):\n$ {command}\n{_tail(result.output)}{refused}")


def _workdir_script(workdir: str, owner: tuple[int, int] | None) -> str:
    """`mkdir -p` of WORKDIR, the directories it creates owned by the current USER (`owner`; None: root), as BuildKit
    makes them (the classic builder made them root's; a task that sets USER before WORKDIR relies on writing there)."""
    q = shlex.quote(workdir)
    if owner is None:
        return f"mkdir -p {q}"
    return (f'set -f; first=; p=; IFS=/; for c in $(printf %s {q}); do [ -n "$c" ] || continue; p="$p/$c"; '
            f'[ -n "$first" ] || [ -e "$p" ] || first=$p; done; unset IFS; '
            f'mkdir -p {q} && {{ [ -z "$first" ] || chown -R {owner[0]}:{owner[1]} "$first"; }}')


def _copy(step: Step, context: Path, box: BuildSandbox, workdir: str, deadline: float, where: str) -> None:
    """COPY / ADD: the context's files read here (the step sandbox never sees the context), extracted by tar inside."""
    *sources, dest = step.args
    dest = os.path.normpath(os.path.join(workdir, dest)) + ("/" if dest.endswith("/") else "")
    matches: list[Path] = []
    for src in sources:
        found = sorted(context.glob(src.lstrip("/"))) if any(c in src for c in "*?[") else [context / src.lstrip("/")]
        for p in found:
            if not p.resolve().is_relative_to(context):
                raise BuildError(f"{where}: {src} is outside the build context {context}")
            if not (p.exists() or p.is_symlink()):
                raise BuildError(f"{where}: {src} is not in the build context {context}")
            matches.append(p)
    mode = int(step.options["chmod"], 8) if "chmod" in step.options else None
    with _step(box, where, deadline) as s:
        uid = gid = 0
        if "chown" in step.options:
            uid, gid = _ids(s, step.options["chown"], deadline, where)
        add = step.op == "ADD"

        def write(pipe: IO[bytes]) -> None:
            _context_tar(pipe, matches, dest, uid, gid, mode, add, where)

        command = "tar -x --numeric-owner --same-owner -p -f - -C /"
        _check(s.run(command.split(), env={"PATH": DEBIAN_PATH}, deadline=deadline, stdin=write), where, command)


def _context_tar(pipe: IO[bytes], matches: list[Path], dest: str, uid: int, gid: int, mode: int | None, add: bool,
                 where: str) -> None:
    """The COPY's files as a tar stream into `pipe`, named where they land (absolute paths, made relative to /)."""
    into_dir = dest.endswith("/") or len(matches) > 1 or any(p.is_dir() for p in matches)
    with tarfile.open(fileobj=pipe, mode="w|", format=tarfile.GNU_FORMAT) as tar:
        for p in matches:
            if add and p.is_file() and tarfile.is_tarfile(p):
                with tarfile.open(p, "r:*") as archive:  # ADD unpacks a local archive into dest
                    for member in archive.getmembers():
                        member.name = _under(dest, member.name, p, where)
                        if member.islnk():
                            member.linkname = _under(dest, member.linkname, p, where)
                        tar.addfile(member, archive.extractfile(member) if member.isfile() else None)
                continue
            top = f"{dest.rstrip('/')}/{p.name}" if into_dir and not p.is_dir() else dest.rstrip("/") or "/"
            for item in [p, *sorted(p.rglob("*"))] if p.is_dir() else [p]:
                arc = top if item == p else f"{top.rstrip('/')}/{item.relative_to(p).as_posix()}"
                info = tar.gettarinfo(str(item), arcname=arc.lstrip("/") or ".")
                info.uid, info.gid, info.uname, info.gname = uid, gid, "", ""
                if mode is not None and not info.issym():
                    info.mode = mode
                if info.isreg():
                    with item.open("rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)


def _under(dest: str, name: str, archive: Path, where: str) -> str:
    path = os.path.normpath(name).lstrip("/")
    if path.startswith(".."):
        raise BuildError(f"{where}: {archive.name} holds a path outside its root ({name})")
    return f"{dest.rstrip('/')}/{path}".lstrip("/")


def _export(task: Mapping[str, Any], box: BuildSandbox, user: str, tarball: Path, limit: int, deadline: float
            ) -> dict[str, str]:
    """The built root tarred to `tarball`, with `/logs/verifier` and `/logs/agent` (Harbor mounts them at run time; the
    image need not have them); the last USER as uid:gid and its home, from the image's own passwd and group."""
    where = f"terminal task {task['id']!r}: the built image"
    with _step(box, where, deadline) as s:
        uid, gid = _ids(s, user, deadline, where)
        entry = _passwd_entry(s.read("/etc/passwd", deadline), user.partition(":")[0])
        command = "mkdir -p /logs/verifier /logs/agent"
        _check(s.run(command.split(), env={"PATH": DEBIAN_PATH}, deadline=deadline), where, command)
        s.export(tarball, deadline, limit)
    return {"uid_gid": f"{uid}:{gid}", "home": entry[5] if entry else "/"}


def _is_root(user: str) -> bool:
    return user in ("root", "0", "0:0")


def _ids(s: StepSandbox, spec: str, deadline: float, where: str) -> tuple[int, int]:
    """USER (or COPY --chown) `spec`, user[:group] by name or number, as (uid, gid) in the image: its own group, else
    the user's primary group (a bare uid with no entry: itself)."""
    if _is_root(spec):
        return 0, 0
    name, _, group = spec.partition(":")
    if name.isdigit() and group.isdigit():
        return int(name), int(group)
    entry = _passwd_entry(s.read("/etc/passwd", deadline), name)
    if entry is None and not name.isdigit():
        raise BuildError(f"{where}: no user {name!r} in the image's /etc/passwd")
    try:
        uid = int(name) if name.isdigit() else int(entry[2])  # type: ignore[index]
        if not group:
            gid = int(entry[3]) if entry is not None else uid
        else:
            gid = int(group) if group.isdigit() else _group_id(s.read("/etc/group", deadline), group, where)
    except ValueError:
        raise BuildError(f"{where}: the image's /etc/passwd or /etc/group has an unreadable entry for {spec!r}"
                         ) from None
    return uid, gid


def _passwd_entry(passwd: bytes | None, name: str) -> list[str] | None:
    """The passwd fields of the user named (or numbered) `name`, None when the file has none."""
    lines = (passwd or b"").decode(errors="replace").splitlines()
    return next((f for f in (line.split(":") for line in lines) if len(f) > 5 and name in (f[0], f[2])), None)


def _group_id(group_file: bytes | None, group: str, where: str) -> int:
    for line in (group_file or b"").decode(errors="replace").splitlines():
        parts = line.split(":")
        if parts[0] == group and len(parts) > 2:
            return int(parts[2])
    raise BuildError(f"{where}: no group {group!r} in the image's /etc/group")


def _untar(tarball: Path, root: Path) -> None:
    subprocess.run(["tar", "-C", str(root), "--numeric-owner", "--same-owner", "-xpf", str(tarball)], check=True)


def _tar(root: Path, out: Path) -> None:
    partial = out.with_name(out.name + ".partial")
    subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], check=True)
    partial.rename(out)


def _tail(out: str, n: int = 3000) -> str:
    return out[-n:]


# ----- what each backend runs over -----
TASK_UID_BASE = 1_700_000_000  # the task sandboxes' uid range (apart from the desktops' and the bwrap leases')


def local_root(built: BuiltEnvironment, cache_dir: Path | None = None) -> Path:
    """The built root unpacked, owners shifted into the task sandbox's uid range: the overlay's read-only lower layer."""
    from envs.runtime.sandbox_root import unpack_shifted

    cache = cache_dir or task_cache_dir()
    return unpack_shifted(Path(built.tarball), cache / "roots" / f"{built.key}-u{TASK_UID_BASE}", TASK_UID_BASE)


def docker_image(client: Any, built: BuiltEnvironment) -> str:
    """The built root as a local image (docker import), tagged by its key; imported once per engine."""
    import docker

    try:
        client.images.get(built.docker_tag)
        return built.docker_tag
    except docker.errors.ImageNotFound:
        return import_tarball(client, Path(built.tarball), built.docker_tag, built.env, built.workdir)


__all__ = ["BASES", "DEFAULT_BASE_IMAGES", "TASK_UID_BASE", "BuildError", "BuiltEnvironment",
           "build_task_environment", "docker_image", "environment_key", "local_root", "resolve_base",
           "task_cache_dir"]
