"""Host directories a sandbox must see: whether a sandbox uid can reach them, and a reachable copy when it cannot.

Sandboxes run as a leased non-root host uid when we are root, so a bind source under a mode-700 directory (pyenv's
interpreters under /root, say) cannot be resolved by bubblewrap. `reachable_copy` mirrors such a tree once, with hard
links (seconds, no extra disk for the files), under a cache directory every uid can traverse, keyed by the tree's path
and its top-level modification times, so a package installed later gives a new mirror instead of a stale one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path


def reachable_by_others(path: str | Path) -> bool:
    """Whether a process of an unrelated uid can reach `path` (every parent directory world-searchable)."""
    p = Path(path).resolve()
    for parent in [*reversed(p.parents), p]:
        try:
            mode = parent.stat().st_mode
        except OSError:
            return False
        if parent.is_dir() and not mode & 0o001:
            return False
    return True


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive flock (released on exit and when the process dies): one builder per artifact across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def tree_key(path: Path) -> str:
    """Identity of a tree for its mirror: its path and the modification times of it and its direct subdirectories."""
    parts = [str(path)]
    for sub in sorted([path, *[p for p in path.iterdir() if p.is_dir()]]):
        parts.append(f"{sub.name}:{sub.stat().st_mtime_ns}")
    for site in sorted(path.glob("lib/python*/site-packages")):  # pip installs change this one, deeper down
        parts.append(f"{site}:{site.stat().st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def reachable_copy(path: str | Path, cache_root: Path | None = None, name: str | None = None) -> Path:
    """`path` itself when sandbox uids can reach it, else a hard-linked mirror of it (made once, under a lock) in a
    world-traversable cache directory: `cache_root`, by default the image cache (NEXTSTATE_IMAGE_CACHE, else
    /var/cache/nextstate/images: a mirror is keyed by what it copies, like an image by its recipe, so it may outlive a
    test's private NEXTSTATE_CACHE). Mount the result at `path` inside the sandbox."""
    from envs.runtime.rootfs_image import default_cache_dir as image_cache_dir

    src = Path(path).resolve()
    if os.geteuid() != 0 or reachable_by_others(src):
        return src
    root = (cache_root or image_cache_dir()) / "mirrors"
    mirror = root / f"{name or src.name}-{tree_key(src)}"
    with file_lock(root / f".{mirror.name}.lock"):
        if not (mirror / ".complete").exists():
            shutil.rmtree(mirror, ignore_errors=True)
            root.mkdir(parents=True, exist_ok=True)
            os.chmod(root, 0o755)
            if not reachable_by_others(root):
                raise PermissionError(
                    f"{root} is not reachable by the sandbox's uid (a parent directory is not world-searchable); "
                    "set NEXTSTATE_CACHE to a directory under /var/cache or /tmp"
                )
            cp = subprocess.run(["cp", "-al", str(src), str(mirror)], capture_output=True)
            if cp.returncode != 0:  # another filesystem: hard links are impossible, copy
                shutil.rmtree(mirror, ignore_errors=True)
                subprocess.run(["cp", "-a", str(src), str(mirror)], check=True)
            (mirror / ".complete").touch()
    return mirror


def read_beneath(base: int | str | Path, path: str, limit: int = 1 << 20) -> bytes | None:
    """The first `limit` bytes of the regular file at `path` under the directory `base` (an open descriptor or a host
    path), None when there is none. The walk never follows a symlink and never leaves `base`, so a tree that a sandbox
    wrote cannot make the host read anything else (a link, a FIFO, a device is None too)."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"{path!r}: a path beneath the directory, without '..'")
    try:
        fd = os.open(".", os.O_PATH | os.O_DIRECTORY, dir_fd=base) if isinstance(base, int) \
            else os.open(base, os.O_PATH | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        for name in parts[:-1]:
            try:
                nxt = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                return None
            os.close(fd)
            fd = nxt
        try:
            f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        except OSError:
            return None
        try:
            return os.read(f, limit) if stat.S_ISREG(os.fstat(f).st_mode) else None
        finally:
            os.close(f)
    finally:
        os.close(fd)
