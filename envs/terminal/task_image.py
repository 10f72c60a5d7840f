"""Build a Terminal-Bench / Harbor task's environment from its Dockerfile, offline-capable, once per content hash.

No registry is reachable, so `FROM` is mapped to a base the project builds itself (`BASES`, chosen by `base_images`
patterns): Debian bookworm from debootstrap (the sandbox image's rootfs, `envs.runtime.images`) plus the test runner
(`nextstate-pytest`: pytest from the host's pip, outside the task's own site-packages; while tests run it is also
`pytest` at the end of PATH, for test scripts that call pytest without installing it), and for `python:*` images the
`python` / `pip` names and pip's permission to install system-wide, as those images have. Then the Dockerfile's steps
are replayed on an unpacked copy: `RUN` under `/bin/sh -c` chrooted into the root, in private mount and pid
namespaces (so nothing it starts outlives it), with the host's network (package registries, build time only: its CA
bundle and proxies too, never left in the image) and the Dockerfile's ENV / ARG; `COPY` / `ADD` of the task's files (archives unpacked) extracted by tar inside the root, so a
symlink in the root cannot send them outside it; `WORKDIR`, `ENV`, `USER` recorded as the image's config.

The result is a tarball plus its config (`BuiltEnvironment`), cached by a hash of the base, the Dockerfile and every
file of the build context, under `$NEXTSTATE_TASK_ENV_CACHE` (default: `<image cache>/task-envs`). One build serves
both backends: `local_root` unpacks it with its owners shifted for the namespace sandbox
(`envs.runtime.rootfs_runtime`), `docker_image` imports it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envs.runtime.host_paths import file_lock
from envs.runtime.rootfs_image import build_rootfs_tarball, default_cache_dir, import_tarball
from envs.terminal.dockerfile import Dockerfile, Step, parse_dockerfile

log = logging.getLogger(__name__)

BUILDER_REVISION = "9"  # bump when the replay of a step changes what it makes (hashed into every key)
TEST_RUNNER = "/usr/local/bin/nextstate-pytest"
TEST_RUNNER_SITE = "/opt/nextstate/pytest"
TEST_PATH_TAIL = "/opt/nextstate/bin"  # appended to PATH while tests run: `pytest` there when the image has none
#: the runner's wheels (pure Python, the versions Terminal-Bench's own test scripts ask for)
TEST_RUNNER_WHEELS = ("pytest==8.4.1", "pluggy==1.6.0", "iniconfig==2.1.0", "packaging==25.0", "pygments==2.19.2")
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
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


class BuildError(RuntimeError):
    """A task environment that could not be built; the message names the task, the step and its output."""


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
    """The task's built environment, from the cache when its key is there. Needs root (chroot, tar with owners)."""
    cache = cache_dir or task_cache_dir()
    base = resolve_base(parse_dockerfile(task["dockerfile"]).base, base_images)
    if base is None:
        raise BuildError(f"terminal task {task['id']!r}: FROM {task['base_image']} has no local base; map it with "
                         f"env.base_images (a pattern -> one of {', '.join(BASES)})")
    spec = parse_dockerfile(task["dockerfile"], environment=base_env(base))  # `$PATH` in ENV means the base's
    base_tar = ensure_base(base, cache)
    key = environment_key(task, base_tar.name)
    out_dir = cache
    meta_path = out_dir / f"{key}.json"
    with file_lock(out_dir / f".{key}.lock"):
        if meta_path.exists():
            return BuiltEnvironment(**{**json.loads(meta_path.read_text()), "build_s": 0.0})
        if os.geteuid() != 0:
            raise PermissionError(f"building terminal task {task['id']!r}'s environment needs root (chroot)")
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="nextstate-task-env-", dir=out_dir) as tmp:
            root = Path(tmp) / "root"
            root.mkdir()
            _untar(base_tar, root)
            config = _replay(task, spec, root, base_env(base), float(task.get("build_timeout_s") or 900.0))
            for logs in ("logs/verifier", "logs/agent"):  # Harbor mounts them at run time; the image need not have them
                (root / logs).mkdir(parents=True, exist_ok=True)
            entry = _passwd_entry(root, config["user"].partition(":")[0])
            config["uid_gid"] = f"{_uid(root, config['user'])}:{_gid(root, config['user'])}"
            config["home"] = entry[5] if entry else "/"
            tarball = out_dir / f"{key}.tar"
            _tar(root, tarball)
        built = BuiltEnvironment(key=key, tarball=str(tarball), base=base, from_image=spec.base,
                                 size_bytes=tarball.stat().st_size, build_s=round(time.monotonic() - t0, 2), **config)
        meta_path.write_text(json.dumps(asdict(built), indent=1))
        log.info("built terminal task %s's environment in %.1f s (%d MiB): %s", task["id"], built.build_s,
                 built.size_bytes >> 20, tarball)
        return built


# ----- the bases -----
def base_env(base: str) -> dict[str, str]:
    env = {"PATH": DEBIAN_PATH, "LANG": "C.UTF-8"}  # HOME comes from the user's passwd entry, as in docker
    if base == "debian-python":
        env["PIP_BREAK_SYSTEM_PACKAGES"] = "1"  # a python:* image's pip installs system-wide
    return env


def ensure_base(base: str, cache: Path) -> Path:
    """The base's tarball: the sandbox image's debootstrapped rootfs (from the image cache, where `python -m
    envs.runtime.images rootfs` builds it) with the test runner (and the python names)."""
    from envs.runtime.images import ImageRecipe

    rootfs = build_rootfs_tarball(ImageRecipe(), default_cache_dir())
    digest = hashlib.sha256(f"{rootfs.name}\0{TEST_RUNNER_WHEELS}\0{BUILDER_REVISION}".encode()).hexdigest()[:12]
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"base-{base}-{digest}.tar"
    with file_lock(out.with_name(f".{out.name}.lock")):
        if out.exists():
            return out
        with tempfile.TemporaryDirectory(prefix="nextstate-task-base-", dir=out.parent) as tmp:
            root = Path(tmp) / "root"
            root.mkdir()
            _untar(rootfs, root)
            site = root / TEST_RUNNER_SITE.lstrip("/")
            site.mkdir(parents=True)
            _host(["pip", "install", "--quiet", "--no-deps", "--no-compile", "--target", str(site),
                   *TEST_RUNNER_WHEELS], "installing the test runner into the task base")
            runner = root / TEST_RUNNER.lstrip("/")
            runner.write_text(f'#!/bin/sh\n# pytest for the tests of a task, kept out of its own site-packages\n'
                              f'PYTHONPATH={TEST_RUNNER_SITE}${{PYTHONPATH:+:$PYTHONPATH}} exec python3 -m pytest '
                              f'-p no:cacheprovider "$@"\n')
            runner.chmod(0o755)
            (root / TEST_PATH_TAIL.lstrip("/")).mkdir(parents=True)
            (root / TEST_PATH_TAIL.lstrip("/") / "pytest").symlink_to(TEST_RUNNER)
            # what docker writes into every container: localhost resolves (tests talk to servers the agent started)
            (root / "etc/hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                                            "127.0.1.1\tsandbox\n")
            if base == "debian-python":
                for name, target in (("python", "/usr/bin/python3"), ("pip", "/usr/bin/pip3")):
                    (root / "usr/local/bin" / name).symlink_to(target)
            _tar(root, out)
        return out


# ----- replaying the steps -----
def _replay(task: Mapping[str, Any], spec: Dockerfile, root: Path, env: dict[str, str], budget_s: float
            ) -> dict[str, Any]:
    context = Path(task["context"]).resolve()
    deadline = time.monotonic() + budget_s
    workdir = next((w for pattern, w in BASE_WORKDIRS.items() if fnmatch.fnmatchcase(spec.base, pattern)), "/")
    user = "root"
    args: dict[str, str] = {}
    resolv = root / "etc/resolv.conf"
    saved = resolv.read_bytes() if resolv.is_file() and not resolv.is_symlink() else None
    _replace_file(resolv, Path("/etc/resolv.conf").read_bytes() if Path("/etc/resolv.conf").exists() else b"")
    build_env = _build_network_env(root)
    try:
        if workdir != "/":
            _in_root(root, f"mkdir -p {shlex.quote(workdir)}", "root", "/", env, deadline, "the base's WORKDIR")
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
                _in_root(root, _workdir_script(root, workdir, user), "root", "/", env, deadline, where)
            elif step.op == "RUN":
                _in_root(root, step.args[0], user, workdir, {**args, **env, **build_env}, deadline, where)
            else:  # COPY / ADD
                _copy(step, context, root, workdir, deadline, where)
    finally:
        if saved is None:
            resolv.unlink(missing_ok=True)
        else:
            _replace_file(resolv, saved)
        shutil.rmtree(root / BUILD_CA.lstrip("/").rsplit("/", 1)[0], ignore_errors=True)
    return {"env": env, "workdir": workdir, "user": user}


def _workdir_script(root: Path, workdir: str, user: str) -> str:
    """`mkdir -p` of WORKDIR, the directories it creates owned by the current USER, as BuildKit makes them (the
    classic builder made them root's; a task that sets USER before WORKDIR relies on writing there)."""
    q = shlex.quote(workdir)
    if user in ("root", "0", "0:0"):
        return f"mkdir -p {q}"
    owner = f"{_uid(root, user)}:{_gid(root, user)}"
    return (f'set -f; first=; p=; IFS=/; for c in $(printf %s {q}); do [ -n "$c" ] || continue; p="$p/$c"; '
            f'[ -n "$first" ] || [ -e "$p" ] || first=$p; done; unset IFS; '
            f'mkdir -p {q} && {{ [ -z "$first" ] || chown -R {owner} "$first"; }}')


BUILD_CA = "/run/nextstate-build/ca-certificates.crt"  # in the root while RUN steps run, never in the image
_CA_VARS = ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS")
_PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")


def _build_network_env(root: Path) -> dict[str, str]:
    """The host's way out, for RUN steps only: its CA bundle (a machine whose egress re-signs TLS trusts a CA the image
    does not) copied into the root and named by the variables pip, requests, curl, git and uv read, and its proxies."""
    env = {k: os.environ[k] for k in _PROXY_VARS if k in os.environ}
    bundle = next((Path(os.environ[k]) for k in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE") if os.environ.get(k)),
                  Path("/etc/ssl/certs/ca-certificates.crt"))
    if bundle.is_file():
        target = root / BUILD_CA.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bundle, target)
        env.update({k: BUILD_CA for k in _CA_VARS})
    return env


def _replace_file(path: Path, data: bytes) -> None:
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_bytes(data)


def _in_root(root: Path, command: str, user: str, workdir: str, env: Mapping[str, str], deadline: float,
             where: str, stdin: bytes | None = None) -> None:
    """`/bin/sh -c command` chrooted into `root` as `user`, in fresh mount + pid namespaces with /proc and /dev."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise BuildError(f"{where}: the build ran past the task's build_timeout_sec")
    inner = f"cd {shlex.quote(workdir)} && exec /bin/sh -c {shlex.quote(command)}"
    if user not in ("root", "0", "0:0"):
        drop = f"setpriv --reuid={_uid(root, user)} --regid={_gid(root, user)} --clear-groups"
        inner = f"exec {drop} /bin/sh -c {shlex.quote(inner)}"
    r = shlex.quote(str(root))
    outer = (f"mount --make-rprivate / && mount -t proc proc {r}/proc && mount --rbind /dev {r}/dev && "
             f"exec chroot {r} /bin/sh -c {shlex.quote(inner)}")
    proc = subprocess.Popen(["unshare", "--mount", "--pid", "--fork", "--kill-child", "/bin/sh", "-c", outer],
                            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(env), start_new_session=True)
    try:
        out, _ = proc.communicate(stdin, timeout=left)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise BuildError(f"{where}: timed out (the task's build_timeout_sec)\n{_tail(out)}") from None
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if proc.returncode != 0:
        raise BuildError(f"{where} failed (exit {proc.returncode}):\n$ {command}\n{_tail(out)}")


def _copy(step: Step, context: Path, root: Path, workdir: str, deadline: float, where: str) -> None:
    *sources, dest = step.args
    dest = os.path.normpath(os.path.join(workdir, dest)) + ("/" if dest.endswith("/") else "")
    uid = gid = 0
    if "chown" in step.options:
        owner, _, group = step.options["chown"].partition(":")
        uid, gid = _uid(root, owner), _gid(root, group or owner)
    mode = int(step.options["chmod"], 8) if "chmod" in step.options else None
    matches: list[Path] = []
    for src in sources:
        found = sorted(context.glob(src.lstrip("/"))) if any(c in src for c in "*?[") else [context / src.lstrip("/")]
        for p in found:
            if not p.resolve().is_relative_to(context):
                raise BuildError(f"{where}: {src} is outside the build context {context}")
            if not (p.exists() or p.is_symlink()):
                raise BuildError(f"{where}: {src} is not in the build context {context}")
            matches.append(p)
    into_dir = dest.endswith("/") or len(matches) > 1 or any(p.is_dir() for p in matches)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for p in matches:
            if step.op == "ADD" and p.is_file() and tarfile.is_tarfile(p):
                with tarfile.open(p, "r:*") as archive:  # ADD unpacks a local archive into dest
                    for member in archive.getmembers():
                        name = os.path.normpath(member.name).lstrip("/")
                        if name.startswith(".."):
                            raise BuildError(f"{where}: {p.name} holds a path outside its root ({member.name})")
                        member.name = f"{dest.rstrip('/')}/{name}".lstrip("/")
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
    _in_root(root, "tar -x --numeric-owner --same-owner -p -f - -C /", "root", "/", {"PATH": DEBIAN_PATH},
             deadline, where, stdin=buf.getvalue())


def _passwd_entry(root: Path, name: str) -> list[str] | None:
    """The image's /etc/passwd fields of the user named (or numbered) `name`, None when it has none."""
    try:
        lines = (root / "etc" / "passwd").read_text().splitlines()
    except OSError:
        return None
    return next((f for f in (line.split(":") for line in lines) if len(f) > 5 and name in (f[0], f[2])), None)


def _uid(root: Path, spec: str) -> int:
    name = spec.partition(":")[0]
    if name.isdigit():
        return int(name)
    entry = _passwd_entry(root, name)
    if entry is None:
        raise BuildError(f"no user {name!r} in the image's /etc/passwd")
    return int(entry[2])


def _gid(root: Path, spec: str) -> int:
    """The group of USER `spec`: its own `:group`, else the user's primary group (a bare uid with no entry: itself)."""
    user, _, group = spec.partition(":")
    if not group:
        entry = _passwd_entry(root, user)
        if entry is not None:
            return int(entry[3])
        if user.isdigit():
            return int(user)
        raise BuildError(f"no user {user!r} in the image's /etc/passwd")
    if group.isdigit():
        return int(group)
    try:
        for fields in ((root / "etc" / "group").read_text().splitlines()):
            parts = fields.split(":")
            if parts[0] == group and len(parts) > 2:
                return int(parts[2])
    except OSError:
        pass
    raise BuildError(f"no group {group!r} in the image's /etc/group")


def _untar(tarball: Path, root: Path) -> None:
    subprocess.run(["tar", "-C", str(root), "--numeric-owner", "--same-owner", "-xpf", str(tarball)], check=True)


def _tar(root: Path, out: Path) -> None:
    partial = out.with_name(out.name + ".partial")
    subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], check=True)
    partial.rename(out)


def _host(argv: list[str], what: str) -> None:
    proc = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{what} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")


def _tail(out: bytes | None, n: int = 3000) -> str:
    return (out or b"").decode(errors="replace")[-n:]


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


__all__ = ["BASES", "DEFAULT_BASE_IMAGES", "TASK_UID_BASE", "TEST_PATH_TAIL", "TEST_RUNNER", "BuildError", "BuiltEnvironment",
           "build_task_environment", "docker_image", "environment_key", "local_root", "resolve_base",
           "task_cache_dir"]
