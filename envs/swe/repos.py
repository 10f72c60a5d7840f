"""Where SWE repositories come from: `<repos_dir>/<owner>__<name>` (a git clone), built from the bundled sources for the
bundled repos, else cloned from GitHub when it is reachable (it is not on this machine: the error says what to do)."""

from __future__ import annotations

import logging
import os
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


def _is_repo(path: Path) -> bool:
    return (path / ".git").exists() or (path / "HEAD").is_file() and (path / "objects").is_dir()
