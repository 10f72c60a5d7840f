"""`python -m envs.swe.bundle derive | build-repos`: rebuild the bundled instances from their sources.

`derive` rebuilds `instances.jsonl`: patches from the `fix/` and `tests/` trees, FAIL_TO_PASS and PASS_TO_PASS by
running the tests before and after the gold patch (needs bwrap and PyPI once). `build-repos` builds the bundled git
repositories. The sources and their layout: envs/swe/bundled/sources.py.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import yaml

from envs.swe.bundled.sources import BUNDLED_REPOS, INSTANCES_FILE, INSTANCES_SRC, instance_ids, source_instance
from envs.swe.env import SWEEnv
from envs.swe.repos import RepoStore

log = logging.getLogger(__name__)


def derive(env_kwargs: dict[str, Any] | None = None, ids: list[str] | None = None) -> list[dict[str, Any]]:
    """Rebuild the instances (`ids`, default all) from their sources and derive FAIL_TO_PASS / PASS_TO_PASS by running
    their tests."""
    env = SWEEnv(**(env_kwargs or {}))
    out = []
    try:
        for iid in ids or instance_ids():
            meta = yaml.safe_load((INSTANCES_SRC / iid / "instance.yaml").read_text(encoding="utf-8"))
            repo_path = env.repos.ensure(meta["repo"])
            inst = source_instance(iid, repo_path)
            before = env.test_statuses(inst, patch="")
            after = env.test_statuses(inst, patch=inst["patch"])
            inst["FAIL_TO_PASS"] = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) != "PASSED")
            inst["PASS_TO_PASS"] = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) == "PASSED")
            broken_by_gold = sorted(t for t, s in before.items() if s == "PASSED" and after.get(t) != "PASSED")
            if not inst["FAIL_TO_PASS"] or broken_by_gold:
                raise ValueError(
                    f"{iid}: FAIL_TO_PASS {inst['FAIL_TO_PASS']}, broken by the gold patch {broken_by_gold}"
                )
            log.info("%s: %d FAIL_TO_PASS, %d PASS_TO_PASS", iid, len(inst["FAIL_TO_PASS"]), len(inst["PASS_TO_PASS"]))
            out.append(inst)
    finally:
        env.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["derive", "build-repos"])
    p.add_argument("--repos-dir", default=None)
    p.add_argument("--out", type=Path, default=INSTANCES_FILE)
    p.add_argument("--ids", nargs="*", help="derive only these instances (the others' lines are kept)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.action == "build-repos":
        store = RepoStore(args.repos_dir)
        for repo in sorted(BUNDLED_REPOS):
            print(repo, store.ensure(repo))
        return 0
    instances = derive({"repos_dir": args.repos_dir} if args.repos_dir else {}, args.ids)
    if args.ids and args.out.exists():  # keep the other instances' lines, in id order
        kept = {json.loads(ln)["instance_id"]: json.loads(ln) for ln in args.out.read_text().splitlines() if ln}
        kept.update({i["instance_id"]: i for i in instances})
        instances = [kept[k] for k in sorted(kept)]
    with args.out.open("w", encoding="utf-8") as f:
        for inst in instances:
            f.write(json.dumps(inst, ensure_ascii=False) + "\n")
    print(f"wrote {len(instances)} instances to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
