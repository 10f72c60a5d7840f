"""`python -m envs.swe.validate INSTANCES --repos-dir DIR`: which SWE-bench instances can be trained on here.

As SWE-bench's own harness validation does, each instance's gold patch and an empty patch are graded once, in the
environment it would train in: an instance is runnable when the gold patch resolves it and the empty patch does not.
Every other instance is refused with a one-line reason: its spec is unknown, its repository or commit is missing, its
environment or install failed (and why), its tests need the network (the eval log shows it: envs.swe.network), the
gold patch does not resolve it here (which tests fail), the empty patch resolves it, or the eval timed out.

Writes to --out (default `swe-validation/`):
- `validation.json`: the configuration, one record per instance (backend, build and grade times, both verdicts or the
  reason), and a summary; re-running resumes: instances already decided under the same configuration are kept.
- `runnable.jsonl`: the runnable instances' rows (as read: test lists as lists), each with `nextstate_runtime` (the
  backend it was validated
  on; `env.runtime=auto` uses it), ready for `python -m rollout.launch env=swe env.instances=.../runnable.jsonl`.
- `table.md`: the per-instance table.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envs.swe import grading
from envs.swe.backend import LAYOUT
from envs.swe.cutoff import DEFAULT_CUTOFF
from envs.swe.env import ROW_RUNTIME, SWEEnv
from envs.swe.instances import validate_swe_instance
from envs.swe.repos import HISTORIES
from envs.taskfile import load_tasks

log = logging.getLogger(__name__)

RUNNABLE, REFUSED = "runnable", "refused"


@dataclass
class Verdict:
    """One graded patch."""

    resolved: bool
    status: str
    eval_s: float  # the grading: a fresh checkout, the patch, the eval script
    checkout_s: float = 0.0  # of which the checkout (what an episode's reset costs)
    fail_to_pass_failed: list[str] = field(default_factory=list)
    pass_to_pass_failed: list[str] = field(default_factory=list)
    network_error: str | None = None
    timed_out: bool = False


@dataclass
class Record:
    instance_id: str
    repo: str
    version: str
    backend: str
    verdict: str  # RUNNABLE | REFUSED
    reason: str = ""  # one line, for a refusal
    cause: str = ""  # the reason's kind: install, network, gold, empty, timeout, repository, spec
    environment_build_s: float = 0.0  # the (repo, version) environment, when it was built for this instance
    instance_build_s: float = 0.0  # the instance's store and install
    python_used: str = ""
    gold: Verdict | None = None
    empty: Verdict | None = None
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0


@dataclass
class Options:
    runtime: str = "local"
    runtime_for: dict[str, str] = field(default_factory=dict)  # repo -> backend, overriding `runtime`
    history: str = "full"
    pypi_cutoff: str = DEFAULT_CUTOFF
    eval_timeout: float = 1800.0
    cache_dir: str | None = None
    runtime_options: dict[str, Any] = field(default_factory=dict)

    def backend_for(self, repo: str) -> str:
        return self.runtime_for.get(repo, self.runtime)

    def signature(self) -> dict[str, Any]:
        """What a record depends on besides the instance: a change re-validates it."""
        return {"history": self.history, "pypi_cutoff": self.pypi_cutoff, "eval_timeout": self.eval_timeout,
                "swebench": grading.swebench_version(), "layout": LAYOUT}


def _verdict(report: dict[str, Any]) -> Verdict:
    return Verdict(
        resolved=bool(report["resolved"]),
        status=report["status"],
        eval_s=round(report["timings"]["eval_s"], 1),
        checkout_s=round(report["timings"].get("checkout_s", 0.0), 2),
        fail_to_pass_failed=list(report["FAIL_TO_PASS"].get("failure", [])),
        pass_to_pass_failed=list(report["PASS_TO_PASS"].get("failure", [])),
        network_error=report.get("network_error"),
        timed_out=bool(report.get("eval_timed_out")),
    )


def _failing(v: Verdict) -> str:
    parts = []
    for name, tests in (("FAIL_TO_PASS", v.fail_to_pass_failed), ("PASS_TO_PASS", v.pass_to_pass_failed)):
        if tests:
            parts.append(f"{name} failing {len(tests)}: {', '.join(tests[:3])}{' ...' if len(tests) > 3 else ''}")
    return "; ".join(parts) or f"status {v.status}"


def decide(rec: Record) -> Record:
    """The verdict from the two graded patches (pure: the rules of this module's docstring)."""
    gold, empty = rec.gold, rec.empty
    assert gold is not None
    if gold.timed_out:
        rec.verdict, rec.cause, rec.reason = REFUSED, "timeout", "timed out: the gold patch's eval ran past the limit"
    elif not gold.resolved and gold.network_error:
        rec.verdict, rec.cause = REFUSED, "network"
        rec.reason = f"tests need the network: {gold.network_error}"
    elif not gold.resolved:
        rec.verdict, rec.cause = REFUSED, "gold"
        rec.reason = f"gold does not resolve here: {_failing(gold)}"
    elif empty is not None and empty.resolved:
        rec.verdict, rec.cause = REFUSED, "empty"
        rec.reason = "the empty patch resolves it: its tests do not test the issue here"
    else:
        rec.verdict, rec.cause, rec.reason = RUNNABLE, "", ""
    return rec


class Validator:
    """Grades instances on worker threads, one SWEEnv per thread (builds are serialized by their own file locks)."""

    def __init__(self, repos_dir: str | None, options: Options):
        self.repos_dir = repos_dir
        self.options = options
        self._local = threading.local()
        self._envs: list[SWEEnv] = []
        self._lock = threading.Lock()

    def _env(self) -> SWEEnv:
        env = getattr(self._local, "env", None)
        if env is None:
            o = self.options
            env = SWEEnv(runtime="auto", repos_dir=self.repos_dir, cache_dir=o.cache_dir, history=o.history,
                         pypi_cutoff=o.pypi_cutoff, eval_timeout=o.eval_timeout, runtime_options=o.runtime_options)
            self._local.env = env
            with self._lock:
                self._envs.append(env)
        return env

    def validate(self, row: dict[str, Any]) -> Record:
        t0 = time.monotonic()
        inst = validate_swe_instance(row)
        backend = self.options.backend_for(inst["repo"])
        rec = Record(inst["instance_id"], inst["repo"], inst["version"], backend, REFUSED)
        task = dict(inst, **{ROW_RUNTIME: backend})
        env = self._env()
        try:
            spec = grading.repo_spec(task)
        except grading.SpecNotFound as exc:
            rec.cause, rec.reason = "spec", f"no spec: {str(exc).splitlines()[0][:200]}"
            return self._done(rec, t0)
        try:
            environment = env.backend_for(task).environment(task, spec)
        except (LookupError, FileNotFoundError) as exc:
            rec.cause, rec.reason = "repository", f"repository unavailable: {str(exc).splitlines()[0][:200]}"
            return self._done(rec, t0)
        except RuntimeError as exc:
            rec.cause, rec.reason = "install", f"install failed: {_install_error(str(exc))}"
            return self._done(rec, t0)
        info, inst_info = environment.info, environment.instance
        rec.python_used, rec.notes = info.python_used, list(info.notes)
        rec.environment_build_s = round(info.build_s, 1)
        rec.instance_build_s = round(inst_info.store_s + inst_info.install_s, 1)
        rec.gold = _verdict(env.grade_patch(task, inst["patch"]))
        if rec.gold.resolved:
            rec.empty = _verdict(env.grade_patch(task, ""))
        return self._done(decide(rec), t0)

    @staticmethod
    def _done(rec: Record, t0: float) -> Record:
        rec.wall_s = round(time.monotonic() - t0, 1)
        return rec

    def close(self) -> None:
        for env in self._envs:
            env.close()


def _install_error(text: str) -> str:
    """The informative line of a failed build's output (pip's ERROR line, else the last non-empty one)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(("ERROR:", "error:")) or "Error:" in ln]
    first = lines[0][:120] if lines else ""
    return f"{(errors[-1] if errors else lines[-1] if lines else '?')[:200]} ({first})"


def table(records: list[Record]) -> str:
    """The per-instance markdown table (times in seconds)."""
    rows = ["| instance | backend | environment build (once per repo, version) | instance build | gold | "
            "grade (gold) | empty | grade (empty) | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(records, key=lambda r: r.instance_id):
        gold = "resolved" if r.gold and r.gold.resolved else ("not resolved" if r.gold else "-")
        empty = "resolved" if r.empty and r.empty.resolved else ("not resolved" if r.empty else "-")
        verdict = r.verdict if r.verdict == RUNNABLE else f"refused: {r.reason}"
        rows.append(
            f"| {r.instance_id} | {r.backend} | {r.environment_build_s:g} | {r.instance_build_s:g} | {gold} | "
            f"{r.gold.eval_s if r.gold else '-'} | {empty} | {r.empty.eval_s if r.empty else '-'} | "
            f"{verdict.replace('|', '/')} |"
        )
    return "\n".join(rows) + "\n"


def summary(records: list[Record]) -> dict[str, Any]:
    refused: dict[str, int] = {}
    for r in records:
        if r.verdict == REFUSED:
            refused[r.cause] = refused.get(r.cause, 0) + 1
    graded = [r for r in records if r.gold is not None and r.cause != "network" and r.cause != "timeout"]
    gold_ok = sum(1 for r in graded if r.gold and r.gold.resolved)
    return {
        "instances": len(records),
        "runnable": sum(1 for r in records if r.verdict == RUNNABLE),
        "refused_by_cause": refused,
        "gold_resolved_of_graded": f"{gold_ok}/{len(graded)}",
        "empty_resolved": sum(1 for r in records if r.empty and r.empty.resolved),
    }


def _load(path: Path, signature: dict[str, Any]) -> dict[str, Record]:
    if not path.exists():
        return {}
    doc = json.loads(path.read_text())
    if doc.get("signature") != signature:
        log.info("%s was made under another configuration (%s): validating again", path, doc.get("signature"))
        return {}
    out = {}
    for d in doc["records"]:
        gold, empty = d.pop("gold"), d.pop("empty")
        out[d["instance_id"]] = Record(**d, gold=Verdict(**gold) if gold else None,
                                       empty=Verdict(**empty) if empty else None)
    return out


def write(out: Path, records: dict[str, Record], rows: dict[str, dict[str, Any]], options: Options) -> None:
    out.mkdir(parents=True, exist_ok=True)
    recs = sorted(records.values(), key=lambda r: r.instance_id)
    doc = {"signature": options.signature(), "options": asdict(options), "summary": summary(recs),
           "records": [asdict(r) for r in recs]}
    tmp = out / "validation.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out / "validation.json")
    with (out / "runnable.jsonl").open("w", encoding="utf-8") as f:
        for r in recs:
            if r.verdict == RUNNABLE and r.instance_id in rows:
                f.write(json.dumps(dict(rows[r.instance_id], **{ROW_RUNTIME: r.backend}), ensure_ascii=False) + "\n")
    (out / "table.md").write_text(table(recs))


def run(rows: list[dict[str, Any]], repos_dir: str | None, out: Path, options: Options, workers: int = 1,
        redo: bool = False, all_rows: list[dict[str, Any]] | None = None) -> dict[str, Record]:
    """Validate `rows` (SWE-bench instance dicts), resuming from `out` (`redo`: validate them again); the records of
    other instances of `all_rows` (the whole instance file) already in `out` are kept. Returns every record."""
    from tqdm import tqdm

    by_id = {str(r["instance_id"]): r for r in all_rows or rows}
    records = {k: v for k, v in _load(out / "validation.json", options.signature()).items() if k in by_id}
    if redo:
        records = {k: v for k, v in records.items() if k not in {str(r["instance_id"]) for r in rows}}
    todo = [r for r in rows if str(r["instance_id"]) not in records]
    log.info("%d instances: %d decided already, %d to validate", len(rows), len(rows) - len(todo), len(todo))
    validator = Validator(repos_dir, options)
    try:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool, tqdm(total=len(todo), unit="instance") as bar:
            futures = {pool.submit(validator.validate, r): str(r["instance_id"]) for r in todo}
            for fut in as_completed(futures):
                rec = fut.result()
                records[rec.instance_id] = rec
                write(out, records, by_id, options)  # after every instance: an interrupted run resumes
                bar.set_postfix_str(f"{rec.instance_id}: {rec.verdict}")
                bar.update()
    finally:
        validator.close()
    write(out, records, by_id, options)
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m envs.swe.validate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("instances", help="instance file (JSON, JSONL or parquet rows, SWE-bench's format)")
    p.add_argument("--repos-dir", help="where <owner>__<name> clones live (default: the cache's swe/repos)")
    p.add_argument("--out", type=Path, default=Path("swe-validation"))
    p.add_argument("--ids", nargs="*", help="validate only these instance ids")
    p.add_argument("--workers", type=int, default=1, help="instances graded at once")
    p.add_argument("--runtime", choices=["local", "docker"], default="local")
    p.add_argument("--runtime-for", action="append", default=[], metavar="OWNER/NAME=local|docker",
                   help="the backend of one repository (repeatable)")
    p.add_argument("--docker-host", help="the docker engine (default: $DOCKER_HOST)")
    p.add_argument("--history", choices=HISTORIES, default="full")
    p.add_argument("--pypi-cutoff", default=DEFAULT_CUTOFF, help="resolve PyPI as of this date ('' for today)")
    p.add_argument("--eval-timeout", type=float, default=1800.0)
    p.add_argument("--cache-dir", help="environments and instances (default: the cache's swe/)")
    p.add_argument("--redo", action="store_true", help="validate the instances again (with --ids: those)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    runtime_for = {}
    for item in args.runtime_for:
        repo, _, kind = item.partition("=")
        if kind not in ("local", "docker") or repo.count("/") != 1:
            p.error(f"--runtime-for {item!r}: use OWNER/NAME=local or OWNER/NAME=docker")
        runtime_for[repo] = kind
    options = Options(runtime=args.runtime, runtime_for=runtime_for, history=args.history,
                      pypi_cutoff=args.pypi_cutoff, eval_timeout=args.eval_timeout, cache_dir=args.cache_dir,
                      runtime_options={"docker_host": args.docker_host} if args.docker_host else {})
    all_rows = load_tasks(Path(args.instances), validate_swe_instance)
    rows = all_rows
    if args.ids:
        missing = set(args.ids) - {str(r["instance_id"]) for r in rows}
        if missing:
            p.error(f"not in {args.instances}: {', '.join(sorted(missing))}")
        rows = [r for r in rows if str(r["instance_id"]) in set(args.ids)]
    records = run(rows, args.repos_dir, args.out, options, args.workers, args.redo, all_rows)
    s = summary(list(records.values()))
    print(json.dumps(s, indent=1))
    print(f"wrote {args.out / 'validation.json'}, {args.out / 'runnable.jsonl'}, {args.out / 'table.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
