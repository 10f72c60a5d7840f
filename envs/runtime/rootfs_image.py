"""Build a docker image from a recipe, locally: no registry is reachable, so debootstrap Debian and `docker import` it.

One builder for every image recipe (the sandbox's `envs.runtime.images`, the GUI guest's `envs.runtime.guest_image`):
debootstrap the recipe's packages, pip-install its pure-Python wheels into the rootfs, tar it. The tarball is cached on
disk under a name keyed by the recipe, and the image is tagged with the same key, so a second build is a no-op and a
fresh engine (new data root) only re-imports the cached tarball.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RootfsRecipe:
    """What goes into an image. Subclasses (the recipes) give every field a default, so `Recipe()` is the image."""

    repository: str  # the image is tagged `{repository}:{suite}-{key}`
    tarball_prefix: str  # the cached rootfs is `{cache_dir}/{tarball_prefix}-{suite}-{key}.tar`
    packages: tuple[str, ...]  # debootstrap --include
    env: dict[str, str]  # ENV of the imported image
    wheels: tuple[str, ...] = ()  # pure-Python wheels, installed by the host's pip into python_site
    python_site: str = "usr/local/lib/python3.11/dist-packages"
    # empty directories made in the rootfs. Not hashed (so the caches built before this module stay valid): a change
    # here must change a hashed field too, or the old tarball is reused
    dirs: tuple[str, ...] = ()
    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"
    variant: str = "minbase"
    # packages downloaded (with the dependencies the rootfs lacks) into an offline apt repository inside the rootfs, so
    # `apt-get install` of them works without a network; the rootfs's apt then knows only that repository
    offline_packages: tuple[str, ...] = ()
    revision: str = ""  # bump when `customize` changes what it makes (hashed when set)
    # installed by the rootfs's own apt-get (dependencies resolved, recommends off) from the mirror after debootstrap:
    # big applications whose dependency trees (alternatives, virtual packages) debootstrap's resolver does not handle
    apt_packages: tuple[str, ...] = ()
    # local .deb files (absolute paths) installed the same way, their dependencies from the mirror (hashed by content)
    local_debs: tuple[str, ...] = ()
    # extra apt source lines (`deb [trusted=yes] https://host/repo suite component`) used while installing
    # apt_packages, then removed (a connected machine's vendor repository, e.g. VS Code's)
    apt_sources: tuple[str, ...] = ()

    def customize(self, root: Path) -> None:
        """Recipe-specific changes to the rootfs after debootstrap, as root, before it is packed (default: none)."""

    @property
    def key(self) -> str:
        # wheels and python_site only enter the hash when there are wheels (python_site means nothing without them);
        # this keeps the keys, hence the tags and cached tarballs, of the recipes as they were before they shared this
        parts: list[object] = [self.suite, self.mirror, sorted(self.packages)]
        if self.wheels:
            parts.append(sorted(self.wheels))
        parts.append(self.variant)
        if self.wheels:
            parts.append(self.python_site)
        parts.append(sorted(self.env.items()))
        if self.offline_packages or self.revision:  # absent from the keys of the recipes made before these fields
            parts += [sorted(self.offline_packages), self.revision]
        if self.apt_packages or self.local_debs or self.apt_sources:
            parts += [sorted(self.apt_packages), sorted(_file_digest(d) for d in self.local_debs),
                      sorted(self.apt_sources)]
        return hashlib.sha256(repr(tuple(parts)).encode()).hexdigest()[:12]

    @property
    def tag(self) -> str:
        return f"{self.repository}:{self.suite}-{self.key}"

    def tarball(self, cache_dir: Path) -> Path:
        return cache_dir / f"{self.tarball_prefix}-{self.suite}-{self.key}.tar"


@dataclass(frozen=True)
class LayerRecipe:
    """`base`'s rootfs with more packages: built from the base's cached tarball (unpacked, the packages installed by
    its own apt-get from the base's mirror and `apt_sources`, packed again), so adding a package costs its install, not
    a new debootstrap, and everything of the base stays as it was built. Keyed by the base's key and the additions, so
    it gets its own tarball, image tag and sandbox root, and the base's are never touched."""

    base: RootfsRecipe
    apt_packages: tuple[str, ...] = ()
    local_debs: tuple[str, ...] = ()  # absolute paths, hashed by content
    apt_sources: tuple[str, ...] = ()

    @property
    def repository(self) -> str:
        return self.base.repository

    @property
    def tarball_prefix(self) -> str:
        return f"{self.base.tarball_prefix}-plus"

    @property
    def suite(self) -> str:
        return self.base.suite

    @property
    def env(self) -> dict[str, str]:
        return self.base.env

    @property
    def key(self) -> str:
        parts = ("layer", self.base.key, sorted(self.apt_packages), sorted(_file_digest(d) for d in self.local_debs),
                 sorted(self.apt_sources))
        return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]

    @property
    def tag(self) -> str:
        return f"{self.repository}:{self.suite}-{self.key}"

    def tarball(self, cache_dir: Path) -> Path:
        return cache_dir / f"{self.tarball_prefix}-{self.suite}-{self.key}.tar"


class PackageInstallError(RuntimeError):
    """A recipe's packages could not be installed; the message is one line naming them and apt's reason."""


def _file_digest(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError as e:
        raise FileNotFoundError(f"the guest package {path} cannot be read ({e.strerror})") from None
    return _digest(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file, once per (path, size, mtime): a recipe's key is computed at every sandbox start."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def default_cache_dir() -> Path:
    if "NEXTSTATE_IMAGE_CACHE" in os.environ:
        return Path(os.environ["NEXTSTATE_IMAGE_CACHE"])
    return Path("/var/cache/nextstate/images") if os.geteuid() == 0 else Path.home() / ".cache" / "nextstate" / "images"


def find_debootstrap() -> str | None:
    """debootstrap's path: it lives in /usr/sbin, which a root shell's PATH may leave out (`su`, some containers)."""
    return shutil.which("debootstrap", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def debootstrap_command(recipe: RootfsRecipe, root: Path, debs: Path) -> list[str]:
    return [
        find_debootstrap() or "debootstrap",
        f"--variant={recipe.variant}",
        f"--include={','.join(recipe.packages)}",
        f"--cache-dir={debs}",
        recipe.suite,
        str(root),
        recipe.mirror,
    ]


def build_rootfs_tarball(recipe: RootfsRecipe | LayerRecipe, cache_dir: Path) -> Path:
    """debootstrap `recipe` (+ its wheels) into a tarball under `cache_dir`, reused when it exists. Needs root."""
    if isinstance(recipe, LayerRecipe):
        return build_layer_tarball(recipe, cache_dir)
    out = recipe.tarball(cache_dir)
    if out.exists():
        return out
    if find_debootstrap() is None:
        raise FileNotFoundError("debootstrap not found: apt-get install debootstrap")
    if os.geteuid() != 0:
        raise PermissionError(f"debootstrap needs root to build the {recipe.repository} rootfs")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"nextstate-{recipe.tarball_prefix}-", dir=cache_dir) as tmp:
        root = Path(tmp) / "rootfs"
        debs = cache_dir / "debs"  # downloaded packages survive a failed build and are shared by the recipes
        debs.mkdir(exist_ok=True)
        cmd = debootstrap_command(recipe, root, debs)
        log.info("building the %s rootfs (several minutes): %s", recipe.repository, " ".join(cmd))
        _run(cmd, "debootstrap", root / "debootstrap" / "debootstrap.log")
        if recipe.wheels:
            site = root / recipe.python_site
            site.mkdir(parents=True, exist_ok=True)
            # pure-Python wheels only, so the host's pip can install them for the guest's Python
            _run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--no-deps",
                    "--no-compile",
                    "--target",
                    str(site),
                    *recipe.wheels,
                ],
                "pip install into the rootfs",
            )
        for d in recipe.dirs:
            (root / d).mkdir(parents=True, exist_ok=True)
        if recipe.apt_packages or recipe.local_debs:
            install_apt_packages(root, recipe)
        if recipe.offline_packages:
            build_offline_repo(root, recipe.offline_packages)
        recipe.customize(root)
        # drop package caches: smaller image, same behaviour (the offline repository's own lists stay)
        _drop_apt_caches(root, lists=not recipe.offline_packages)
        partial = out.with_suffix(".tar.partial")
        _run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], "tar")
        partial.rename(out)
    return out


def build_layer_tarball(layer: LayerRecipe, cache_dir: Path) -> Path:
    """`layer`'s tarball: the base's (built if missing) unpacked, the layer's packages installed, packed again; reused
    when it exists, built once (under a lock). Needs root. A package that cannot be installed raises
    PackageInstallError (one line), and a process does not try the same layer twice."""
    out = layer.tarball(cache_dir)
    if out.exists():
        return out
    if layer.key in _failed_layers:
        raise PackageInstallError(_failed_layers[layer.key])
    if os.geteuid() != 0:
        raise PermissionError(f"adding packages to the {layer.repository} rootfs needs root (chroot, apt-get)")
    base = build_rootfs_tarball(layer.base, cache_dir)
    with open(cache_dir / f".{out.name}.lock", "a") as lock:  # one builder across processes (released on exit)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists():
            return out
        with tempfile.TemporaryDirectory(prefix=f"nextstate-{layer.tarball_prefix}-", dir=cache_dir) as tmp:
            root = Path(tmp) / "rootfs"
            root.mkdir()
            _run(["tar", "-C", str(root), "--numeric-owner", "--same-owner", "-xpf", str(base)], "unpacking the base")
            mirror = f"deb {layer.base.mirror} {layer.base.suite} main"  # the base's own sources may be offline only
            try:
                install_apt_packages(root, layer, sources=(mirror, *layer.apt_sources))
            except PackageInstallError as e:
                _failed_layers[layer.key] = str(e)
                raise
            # apt's view back to the base's own sources (the offline repository, or none) and its caches dropped
            _drop_apt_caches(root, lists=not layer.base.offline_packages)
            if layer.base.offline_packages:
                in_root(root, ["apt-get", "update", "-q"], "apt-get update (the base's sources)")
            partial = out.with_suffix(".tar.partial")
            _run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], "tar")
            partial.rename(out)
    return out


def _drop_apt_caches(root: Path, *, lists: bool) -> None:
    """Remove the downloaded .deb files (and, with `lists`, apt's package lists) from a rootfs."""
    dirs = ["var/cache/apt/archives"] + (["var/lib/apt/lists"] if lists else [])
    for d in dirs:
        for p in (root / d).glob("*"):
            if p.is_file():
                p.unlink()


_failed_layers: dict[str, str] = {}  # layer key -> its one-line error (a farm's envs do not each retry a failed build)

OFFLINE_REPO = "srv/offline-apt"  # in the rootfs


def _chroot(root: Path, argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    """`argv` run chrooted into `root` (as root, at build time: the rootfs is ours, not yet anyone's sandbox)."""
    return subprocess.run(["chroot", str(root), *argv], input=stdin, capture_output=True, text=True,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
                               "DEBIAN_FRONTEND": "noninteractive"})


def in_root(root: Path, argv: list[str], what: str, stdin: str | None = None) -> None:
    """Run `argv` chrooted into `root`; a failure raises RuntimeError with its output."""
    proc = _chroot(root, argv, stdin)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


@contextlib.contextmanager
def host_resolver(root: Path):
    """The host's /etc/resolv.conf in the rootfs while the block runs (downloads at build time), removed after."""
    resolv = root / "etc" / "resolv.conf"
    had_resolv = resolv.exists() or resolv.is_symlink()
    if not had_resolv:
        shutil.copyfile("/etc/resolv.conf", resolv)
    try:
        yield
    finally:
        if not had_resolv:
            resolv.unlink()


HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def install_apt_packages(root: Path, recipe: RootfsRecipe | LayerRecipe, sources: Sequence[str] | None = None) -> None:
    """apt-get install the recipe's apt_packages and local_debs inside the rootfs (no daemon started: policy-rc.d
    refuses), with `sources` (default: its apt_sources) only for the install. The host's CA bundle verifies https
    sources (the rootfs may have no ca-certificates). A source that cannot be reached or a package that cannot be
    installed raises PackageInstallError, one line naming the packages and apt's reason."""
    sources = recipe.apt_sources if sources is None else sources
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    extra = root / "etc/apt/sources.list.d/nextstate-build.list"
    staged = root / "tmp/nextstate-debs"
    staged.mkdir(parents=True, exist_ok=True)
    debs = []
    for i, deb in enumerate(recipe.local_debs):
        name = f"{i}-{Path(deb).name}"
        shutil.copyfile(deb, staged / name)
        debs.append(f"/tmp/nextstate-debs/{name}")
    ca = staged / "host-ca.crt"
    options = []
    if HOST_CA_BUNDLE.exists():
        shutil.copyfile(HOST_CA_BUNDLE, ca)
        options.append("-o=Acquire::https::CaInfo=/tmp/nextstate-debs/host-ca.crt")
    names = " ".join([*recipe.apt_packages, *recipe.local_debs])
    try:
        if sources:
            extra.write_text("".join(line.strip() + "\n" for line in sources))
        with host_resolver(root):
            # --error-on=any: an unreachable source fails here (apt only warns by default), saying which
            _apt(root, ["apt-get", *options, "update", "-q", "--error-on=any"], names, recipe.repository)
            _apt(root, ["apt-get", *options, "install", "-y", "-q", "--no-install-recommends", *recipe.apt_packages,
                        *debs], names, recipe.repository)
    finally:
        extra.unlink(missing_ok=True)
        shutil.rmtree(staged, ignore_errors=True)
        policy.unlink(missing_ok=True)


def _apt(root: Path, argv: list[str], names: str, repository: str) -> None:
    proc = _chroot(root, argv)
    if proc.returncode != 0:
        log.warning("%s failed (%d):\n%s\n%s", " ".join(argv), proc.returncode, proc.stdout[-3000:],
                    proc.stderr[-3000:])
        reason = apt_failure_reason(proc.stdout + "\n" + proc.stderr)
        raise PackageInstallError(f"installing {names} into the {repository} rootfs failed: {reason}")


def apt_failure_reason(output: str) -> str:
    """apt's reason for failing, in one line: the source it could not fetch, else the broken dependency, else its
    error lines."""
    lines = output.splitlines()
    for line in lines:
        if line.startswith(("E: Failed to fetch ", "W: Failed to fetch ")):
            url, _, why = line[len("E: Failed to fetch "):].partition("  ")
            return f"cannot reach {url.strip()}: {why.strip() or 'failed to fetch'}"
    depends = [" ".join(line.split()) for line in lines if " : Depends: " in line or " : PreDepends: " in line]
    errors = list(dict.fromkeys(line[3:].strip() for line in lines if line.startswith("E: ")))
    if depends:
        return "; ".join([depends[0], *errors[:1]])
    if errors:
        return "; ".join(errors)
    rest = [line.strip() for line in lines if line.strip()]
    return rest[-1] if rest else "apt-get failed without a message"


def build_offline_repo(root: Path, packages: tuple[str, ...]) -> None:
    """Download `packages` and the dependencies the rootfs lacks into a flat apt repository in the rootfs, index it, and
    make it the rootfs's only apt source (lists included), so they install offline and nothing else resolves."""
    repo = root / OFFLINE_REPO
    (repo / "partial").mkdir(parents=True, exist_ok=True)
    with host_resolver(root):  # name resolution for the download only
        in_root(root, ["apt-get", "update", "-q"], "apt-get update (for the offline repository)")
        in_root(root, ["apt-get", "install", "-y", "-q", "--download-only", "--no-install-recommends",
                       f"-o=Dir::Cache::Archives=/{OFFLINE_REPO}", *packages], "downloading the offline packages")
    shutil.rmtree(repo / "partial", ignore_errors=True)
    (repo / "lock").unlink(missing_ok=True)
    entries = []
    for deb in sorted(repo.glob("*.deb")):
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
        data = deb.read_bytes()
        entries.append(
            control.rstrip("\n") + f"\nFilename: ./{deb.name}\nSize: {len(data)}\n"
            f"MD5sum: {hashlib.md5(data).hexdigest()}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    (repo / "Packages").write_text("\n".join(entries))
    for p in (root / "var/lib/apt/lists").glob("*"):
        if p.is_file():
            p.unlink()
    (root / "etc/apt/sources.list").write_text(f"deb [trusted=yes] file:/{OFFLINE_REPO} ./\n")
    for extra in (root / "etc/apt/sources.list.d").glob("*"):
        extra.unlink()
    in_root(root, ["apt-get", "update", "-q"], "apt-get update (offline repository)")


def _run(cmd: list[str], what: str, log_file: Path | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        detail = log_file.read_text(errors="replace")[-3000:] if log_file is not None and log_file.exists() else ""
        raise RuntimeError(
            f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{detail}"
        )


def ensure_image(client, recipe: RootfsRecipe, cache_dir: Path | None = None) -> str:
    """Return `recipe`'s tag in the engine behind `client` (a docker.DockerClient), building it if missing."""
    import docker

    try:
        client.images.get(recipe.tag)
        return recipe.tag
    except docker.errors.ImageNotFound:
        pass
    tarball = build_rootfs_tarball(recipe, cache_dir or default_cache_dir())
    return import_tarball(client, tarball, recipe.tag, recipe.env)


def import_tarball(client, tarball: Path, tag: str, env: dict[str, str], workdir: str | None = None) -> str:
    """`docker import` a rootfs tarball as `tag` (repository:tag) with its ENV (and WORKDIR); returns the tag."""
    changes = [f"ENV {k}={v}" for k, v in env.items()]
    changes += [f"WORKDIR {workdir}"] if workdir else []
    changes.append('CMD ["/bin/bash"]')
    repo, name = tag.split(":")
    client.api.import_image_from_file(str(tarball), repository=repo, tag=name, changes=changes)
    client.images.get(tag)  # raises if the import did not produce it
    log.info("imported %s from %s", tag, tarball)
    return tag


def main(recipe: RootfsRecipe, description: str | None, argv: list[str] | None = None) -> int:
    """The CLI of a recipe module: `build` (the image), `rootfs` (only the tarball), `tag` (print the tag)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["build", "rootfs", "tag"])
    p.add_argument("--docker-host", default=os.environ.get("DOCKER_HOST"))
    p.add_argument("--cache-dir", type=Path, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.action == "tag":
        print(recipe.tag)
        return 0
    if args.action == "rootfs":
        print(build_rootfs_tarball(recipe, args.cache_dir or default_cache_dir()))
        return 0
    import docker

    client = docker.DockerClient(base_url=args.docker_host) if args.docker_host else docker.from_env()
    try:
        print(ensure_image(client, recipe, args.cache_dir))
    finally:
        client.close()
    return 0


__all__ = ["LayerRecipe", "PackageInstallError", "RootfsRecipe", "apt_failure_reason", "build_layer_tarball",
           "build_offline_repo", "host_resolver", "install_apt_packages", "build_rootfs_tarball", "in_root",
           "debootstrap_command", "default_cache_dir", "find_debootstrap", "ensure_image", "import_tarball", "main"]
