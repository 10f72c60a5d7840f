"""Where SWE repositories come from: `<repos_dir>/<owner>__<name>` (a git clone), built from the bundled sources for the
bundled repos, else cloned from GitHub when it is reachable (it is not on this machine: the error says what to do).

A clone holds the repository's future too: the commits that fixed each instance and added its hidden tests. No sandbox
ever sees it: `instance_store` copies out, once per instance, only the objects reachable from the instance's base commit
(as SWE-bench's instance image keeps its history up to the base commit and nothing after it), and every checkout of that
instance borrows from that store alone."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from envs.cache import cache_dir
from envs.runtime.host_paths import file_lock, reachable_by_others
from envs.swe.bundled.sources import BUNDLED_REPOS, build_repo

log = logging.getLogger(__name__)


class RepoStore:
    """Clones of SWE repositories, one per repo, shared read-only by every episode (checkouts borrow their objects)."""

    def __init__(self, repos_dir: str | Path | None = None, *, github_timeout_s: float = 600.0):
        self.repos_dir = Path(repos_dir) if repos_dir else cache_dir("swe") / "repos"
        self.github_timeout_s = github_timeout_s

    def path(self, repo: str) -> Path:
        if repo.count("/") != 1:
            raise ValueError(f"repo {repo!r} is not of the form owner/name")
        return self.repos_dir / repo.replace("/", "__")

    def ensure(self, repo: str, commit: str | None = None) -> Path:
        """The clone of `repo` (built or cloned on first use), checked to hold `commit` when given."""
        path = self.path(repo)
        if not _is_repo(path):
            with file_lock(self.repos_dir / f".{path.name}.lock"):
                if not _is_repo(path):
                    self._create(repo, path)
        if (
            commit
            and subprocess.run(
                ["git", "-C", str(path), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
            ).returncode
            != 0
        ):
            raise LookupError(f"commit {commit} is not in {path}; fetch it (git -C {path} fetch --all) or re-clone")
        if os.geteuid() == 0 and not reachable_by_others(str(path)):
            raise PermissionError(
                f"{path} is not reachable by the sandbox's uid (a parent directory is not world-searchable); use a "
                "repos_dir under /var/cache or /tmp, or set NEXTSTATE_CACHE"
            )
        return path

    def _create(self, repo: str, path: Path) -> None:
        self.repos_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.repos_dir, 0o755)
        if repo in BUNDLED_REPOS:
            build_repo(repo, path)
            return
        url = f"https://github.com/{repo}.git"
        log.info("cloning %s into %s", url, path)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=self.repos_dir))
        try:
            proc = subprocess.run(
                ["git", "clone", "-q", url, str(tmp / "repo")],
                capture_output=True,
                text=True,
                timeout=self.github_timeout_s,
            )
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr.strip())
            (tmp / "repo").rename(path)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            raise FileNotFoundError(
                f"repository {repo} is not at {path} and cloning {url} failed ({exc}). Clone it there yourself "
                f"(git clone {url} {path}) on a machine that reaches GitHub, then copy it here."
            ) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


HISTORIES = ("full", "shallow")


def instance_store(clone: Path, commit: str, dest: Path, history: str = "full") -> Path:
    """A bare repository at `dest` holding `commit` and what it reaches (its whole history, or with `history="shallow"`
    its tree only) and nothing else: no other ref, no later commit. Built once (atomically); returns `dest`."""
    if history not in HISTORIES:
        raise ValueError(f"history={history!r}: use one of {', '.join(HISTORIES)}")
    if (dest / "nextstate-store.json").exists():
        return dest
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        subprocess.run(["git", "init", "-q", "--bare", str(tmp)], check=True)
        # a local fetch by commit id: the clone's upload-pack (our child) must allow unadvertised wants
        env = {**os.environ, "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "uploadpack.allowAnySHA1InWant",
               "GIT_CONFIG_VALUE_0": "true"}
        depth = ["--depth", "1"] if history == "shallow" else []
        # the tags on the base commit's history come along (version files are computed from them, by setuptools_scm
        # and the like), as SWE-bench's image keeps the tags older than the base commit
        tags = [] if history == "shallow" else subprocess.run(
            ["git", "-C", str(clone), "for-each-ref", "--format=%(refname)", "--merged", commit, "refs/tags"],
            capture_output=True, text=True, check=True,
        ).stdout.split()
        proc = subprocess.run(
            ["git", "-C", str(tmp), "fetch", "-q", "--no-tags", *depth, f"file://{clone}", f"{commit}:refs/heads/base",
             *(f"{t}:{t}" for t in tags)],
            capture_output=True, text=True, env=env,
        )
        if proc.returncode != 0:
            missing = re.search(r"unable to read ([0-9a-f]{40})", proc.stderr)
            if missing:  # e.g. a snapshot without its largest files
                raise LookupError(f"{clone} lacks object {missing.group(1)} that commit {commit} needs; fetch the "
                                  "repository whole (git -C ... fetch --all) or use another clone")
            raise RuntimeError(f"copying {commit} out of {clone} failed: {proc.stderr.strip()[-2000:]}")
        subprocess.run(["git", "-C", str(tmp), "symbolic-ref", "HEAD", "refs/heads/base"], check=True)
        (tmp / "nextstate-store.json").write_text(f'{{"commit": "{commit}", "history": "{history}"}}\n')
        subprocess.run(["chmod", "-R", "a+rX", str(tmp)], check=True)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _is_repo(path: Path) -> bool:
    return (path / ".git").exists() or (path / "HEAD").is_file() and (path / "objects").is_dir()
