"""The local desktop sandbox's root tree: the guest rootfs (`envs.runtime.guest_image`), unpacked once per recipe, with
its owners shifted into the sandbox's host uid range.

The sandbox maps its uids 0..65535 onto host uids DESKTOP_UID_BASE.. (`envs.runtime.nsroot`), so a file owned by uid
u in the rootfs must be owned by DESKTOP_UID_BASE + u on disk: then the sandbox sees `/usr/bin/sudo` as a setuid-root
binary it may run, `/etc/shadow` as root's, and `/home/user` as its user's, while on the host every one of those files
belongs to a uid no account has. The tree is the overlay's read-only lower layer, shared by every desktop; nothing inside
a sandbox writes to it. Built by `python -m envs.runtime.sandbox_root build` (or on first use), under the image cache,
keyed by the recipe (like the image tarballs it comes from).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from envs.runtime.guest_image import GuestRecipe
from envs.runtime.host_paths import file_lock, reachable_by_others
from envs.runtime.rootfs_image import RootfsRecipe, build_rootfs_tarball, default_cache_dir

log = logging.getLogger(__name__)

DESKTOP_UID_BASE = 1_600_000_000  # apart from the terminal sandbox's leases (envs.runtime.local.UID_BASE..+4096)


def shift_owners(root: Path, base: int) -> int:
    """Add `base` to the owner and group of every file under `root` (once per inode; setuid/setgid bits, which chown
    clears, are put back). Returns how many inodes changed."""
    seen: set[int] = set()
    changed = 0

    def one(path: str) -> None:
        nonlocal changed
        st = os.lstat(path)
        if st.st_ino in seen:
            return
        seen.add(st.st_ino)
        if st.st_uid >= base:
            return
        os.lchown(path, st.st_uid + base, st.st_gid + base)
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            os.chmod(path, stat.S_IMODE(st.st_mode))
        changed += 1

    for dirpath, dirnames, filenames in os.walk(root):
        one(dirpath)
        for name in filenames:
            one(os.path.join(dirpath, name))
        for name in dirnames:
            if os.path.islink(os.path.join(dirpath, name)):
                one(os.path.join(dirpath, name))
    return changed


def sandbox_root_dir(recipe: RootfsRecipe | None = None, cache_dir: Path | None = None,
                     uid_base: int = DESKTOP_UID_BASE) -> Path:
    """Where the root tree of `recipe` (default: the guest's) is unpacked: `<it>/root`, complete once `<it>/.complete`
    exists. Builds nothing."""
    recipe = recipe or GuestRecipe()
    cache = cache_dir or default_cache_dir()
    return cache / "sandbox-roots" / f"{recipe.tarball_prefix}-{recipe.suite}-{recipe.key}-u{uid_base}"


def ensure_sandbox_root(recipe: RootfsRecipe | None = None, cache_dir: Path | None = None,
                        uid_base: int = DESKTOP_UID_BASE) -> Path:
    """The unpacked, owner-shifted root tree of `recipe` (default: the guest's), built if missing. Needs root."""
    recipe = recipe or GuestRecipe()
    cache = cache_dir or default_cache_dir()
    done = sandbox_root_dir(recipe, cache, uid_base)
    return unpack_shifted(lambda: build_rootfs_tarball(recipe, cache), done, uid_base)


def unpack_shifted(tarball: Path | Callable[[], Path], done: Path, uid_base: int) -> Path:
    """`tarball` unpacked at `done/root` with its owners shifted by `uid_base`, once (under a lock; `.complete` marks
    a finished tree). `tarball` may be a function that builds it, called only when the tree is missing."""
    with file_lock(done.parent / f".{done.name}.lock"):
        if (done / ".complete").exists():
            return _reachable(done / "root")
        if os.geteuid() != 0:
            raise PermissionError("building a sandbox's root tree needs root (tar with owners, chown)")
        source = tarball() if callable(tarball) else tarball
        partial = done.with_name(done.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        (partial / "root").mkdir(parents=True)
        os.chmod(partial, 0o755)
        log.info("unpacking %s for the sandbox (once)", source)
        subprocess.run(["tar", "-C", str(partial / "root"), "--numeric-owner", "--same-owner", "-xpf", str(source)],
                       check=True)
        shift_owners(partial / "root", uid_base)
        shutil.rmtree(done, ignore_errors=True)
        partial.rename(done)
        (done / ".complete").touch()
    return _reachable(done / "root")


def _reachable(root: Path) -> Path:
    if not reachable_by_others(root):
        raise PermissionError(f"{root} must be reachable by the sandbox's uids: make its parents world-searchable, "
                              "or set NEXTSTATE_IMAGE_CACHE to a directory under /var/cache or /tmp")
    return root


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["build", "path"])
    p.add_argument("--cache-dir", type=Path, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.action == "path":
        print(sandbox_root_dir(cache_dir=args.cache_dir))
        return 0
    print(ensure_sandbox_root(cache_dir=args.cache_dir))
    return 0


__all__ = ["DESKTOP_UID_BASE", "ensure_sandbox_root", "sandbox_root_dir", "shift_owners", "unpack_shifted"]

if __name__ == "__main__":
    sys.exit(main())
