"""Every command the README and the docs quote runs as written.

`python -m rollout.launch ...` commands run with `run.dry_run=true` (configs composed by Hydra from exactly the quoted
overrides, task files loaded, an env built and closed, clients and trainer checked). The other quoted commands
(`python -m <module>`, `python benchmarks/<script>.py`, `python -m pytest <files>`) must name a module, script or test
file that exists and use only flags its `--help` lists. Placeholders (`<name>`, `path/to/...`, example hosts and model
folders) are replaced by real stand-ins listed in PLACEHOLDERS; a quoted command with a placeholder that is not listed
there fails, so a new one is either runnable or declared here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.tiers import first_fast  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "examples").glob("*/README.md"))]
# reports of finished runs quote the command that produced them (with that run's own folders): a record, not a recipe
RECORDS = ("docs/table4/", "docs/directive/", "docs/mix/", "docs/swe/")

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
INLINE = re.compile(r"`([^`\n]*python (?:-m [\w.]+|benchmarks/\w+\.py)[^`\n]*)`")
PYTHON_CMD = re.compile(r"((?:[A-Z_]+=\S+ )*)python (-m [\w.]+|benchmarks/\w+\.py)(.*)")
SYNOPSIS = re.compile(r"\[[^\]]*\.\.\.\]|\[key=value|\[group=")  # `[key=value ...]`: a usage line, not a command


@dataclass(frozen=True)
class Quoted:
    where: str  # file:line
    env: str  # VAR=value prefixes
    program: str  # "-m module" or "benchmarks/x.py"
    args: str

    def __str__(self) -> str:
        return f"{self.where}: {self.env}python {self.program}{self.args}"


def _logical_lines(block: str, first_line: int) -> list[tuple[int, str]]:
    """Lines of a code block with `\\` continuations joined and `# comments` removed."""
    out, buf, start = [], "", first_line
    for i, line in enumerate(block.splitlines()):
        if not buf:
            start = first_line + i
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        out.append((start, re.sub(r"\s+#\s.*$", "", buf + stripped).strip()))
        buf = ""
    return out


def documented_commands() -> list[Quoted]:
    found: list[Quoted] = []
    for path in DOCS:
        rel = str(path.relative_to(REPO))
        if rel.startswith(RECORDS):
            continue
        text = path.read_text()
        candidates: list[tuple[int, str]] = []
        for m in FENCE.finditer(text):
            candidates += _logical_lines(m.group(1), text.count("\n", 0, m.start(1)) + 1)
        candidates += [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in INLINE.finditer(text)]
        for line, cmd in candidates:
            m = PYTHON_CMD.search(cmd)
            if m and not SYNOPSIS.search(m.group(3)):
                found.append(Quoted(f"{rel}:{line}", m.group(1), m.group(2), m.group(3).rstrip()))
    return found


# ----- stand-ins for the placeholders the docs use -----
def _model_dir(path: Path, model: str = "qwen3_4b") -> str:
    """A model folder as the dry run reads it (Qwen3-4B's config.json, a real tiny tokenizer, weight files it never
    opens): tests/test_table4_gpu_configs.py's stand-in."""
    from tests.test_table4_gpu_configs import fake_model_dir

    return str(fake_model_dir(path, model))


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("documented")
    (root / "my_templates").mkdir()
    (root / "my_templates" / "generic.txt").write_text((REPO / "prm/templates/generic.txt").read_text())
    (root / "my_judge.txt").write_text((REPO / "prm/templates/generic.txt").read_text())
    # the GPU experiments read their model and data folders under these two roots (tests/test_table4_gpu_configs.py)
    models, data = root / "models", root / "data"
    _model_dir(models / "Qwen3-4B-Instruct-2507-ReTool-SFT")
    (data / "dapo-math-17k").mkdir(parents=True)
    shutil.copy(DATA / "dapo_math_sample.parquet", data / "dapo-math-17k" / "dapo-math-17k.parquet")
    (data / "aime-2024").mkdir(parents=True)
    shutil.copy(DATA / "aime2024_sample.jsonl", data / "aime-2024" / "aime-2024.jsonl")
    # ... and the mix experiment's (tests/test_mix_gpu_config.py): a VL policy, an OSWorld tree, terminal and SWE rows
    from tests.test_table4_gpu_configs import tiny_vl_model_dir

    tiny_vl_model_dir(models / "Qwen3-VL-8B-Thinking")  # a real (tiny) Qwen3-VL directory
    _model_dir(models / "Qwen3-32B", "qwen3_32b")  # experiment=swe_qwen3_32b
    shutil.copytree(DATA / "osworld_sample", data / "OSWorld" / "evaluation_examples")
    from envs.terminal.env import TerminalEnv

    (data / "terminal").mkdir()
    for split in ("train", "eval"):
        (data / "terminal" / f"{split}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TerminalEnv.tasks(split)[:4]))
    (data / "swe-bench-verified" / "repos").mkdir(parents=True)
    shutil.copy(REPO / "envs/swe/bundled/instances.jsonl", data / "swe-bench-verified" / "instances.jsonl")
    # a run and an experiment to resume: the dry run checks that the directory holds one (a run's saved config, an
    # experiment's experiment.json), not what they say
    (root / "run").mkdir()
    (root / "run" / "config.yaml").write_text("# stand-in for a run's saved config\n")
    (root / "experiment").mkdir()
    (root / "experiment" / "experiment.json").write_text("{}\n")
    # a local .deb for env.guest_packages (checked when the env is built: it must exist and be a Debian package)
    deb = "/path/to/code_amd64.deb"
    if shutil.which("dpkg-deb"):
        from tests.test_gui_guest_packages import tiny_deb

        (root / "deb").mkdir()
        deb = str(tiny_deb(root / "deb"))
    return {
        "/path/to/code_amd64.deb": deb,
        "NEXTSTATE_MODELS=/models": f"NEXTSTATE_MODELS={models}",
        "NEXTSTATE_DATA=/data": f"NEXTSTATE_DATA={data}",
        "env=myenv": "env=echo",  # the example plugin (installed by scripts/install.sh)
        "env=<name>": "env=echo",
        "experiment=<name>": "experiment=table4_toolcall",
        "/models/Qwen3-4B": _model_dir(root / "models" / "Qwen3-4B"),
        "path/to/swe-bench-lite.jsonl": str(REPO / "envs/swe/bundled/instances.jsonl"),
        "swe-validation/runnable.jsonl": str(REPO / "envs/swe/bundled/instances.jsonl"),  # envs.swe.validate's output
        "/var/cache/repos": str(root / "repos"),
        "judge.templates_dir=my_templates": f"judge.templates_dir={root / 'my_templates'}",
        "judge.template=my_judge.txt": f"judge.template={root / 'my_judge.txt'}",
        "outputs/<run>": str(root / "run"),
        "<experiment dir>": str(root / "experiment"),
        "/tmp/<you>-dockerd": str(root / "dockerd"),
        "<OSWorld>/evaluation_examples": str(DATA / "osworld_sample"),  # a clone's tree; the sample has its layout
        "<harbor tasks>": str(REPO / "envs/terminal/task_dirs/harbor"),  # a folder of task directories: the bundled
        "<terminal-bench tasks>": str(REPO / "envs/terminal/task_dirs/terminal_bench"),
        "<another checkout>": str(REPO),  # benchmarks/task_build_time.py --baseline: a checkout of another builder
    }


def _substitute(args: str, stand_ins: dict[str, str]) -> str:
    for placeholder, value in stand_ins.items():
        args = args.replace(placeholder, value)
    assert "<" not in args and "path/to" not in args, f"unlisted placeholder in a documented command: {args}"
    return args


LAUNCHES = [q for q in documented_commands() if q.program == "-m rollout.launch"]
OTHERS = [q for q in documented_commands() if q.program != "-m rollout.launch"]


def test_the_docs_quote_launch_commands():
    assert len(LAUNCHES) >= 10, [str(q) for q in LAUNCHES]  # the extraction itself is not silently broken


@pytest.mark.integration
@pytest.mark.parametrize("quoted", first_fast(sorted(set(LAUNCHES), key=str), ids=str))
def test_launch_command_dry_runs_as_written(quoted: Quoted, stand_ins, tmp_path):
    args = shlex.split(_substitute(quoted.args, stand_ins))
    if not any(a.startswith("run.dry_run=") for a in args):
        args.append("run.dry_run=true")
    # the GPU configs' roots: as the command sets them, else the stand-ins (a cluster would export them)
    roots = {k: stand_ins[f"{k}=/{v}"].split("=", 1)[1] for k, v in (("NEXTSTATE_MODELS", "models"),
                                                                    ("NEXTSTATE_DATA", "data"))}
    prefix = dict(kv.split("=", 1) for kv in shlex.split(_substitute(quoted.env, stand_ins)))
    env = {**os.environ, **roots, **prefix, "PYTHONPATH": str(REPO), "COLUMNS": "250"}
    cmd = [sys.executable, "-m", "rollout.launch", *args, f"run.out_dir={tmp_path / 'out'}"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{quoted}\n{out[-4000:]}"
    assert "all checks pass" in out, out[-3000:]


def _help_text(program: str) -> str:
    argv = [sys.executable, *program.split()] if program.startswith("-m") else [sys.executable, str(REPO / program)]
    proc = subprocess.run([*argv, "--help"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, f"python {program} --help failed:\n{proc.stderr[-2000:]}"
    return proc.stdout


@pytest.mark.parametrize("program", sorted({q.program for q in OTHERS}))
def test_other_documented_programs_exist_and_take_the_quoted_flags(program: str, stand_ins):
    quoted = [q for q in OTHERS if q.program == program]
    if program == "-m pytest":
        takes_value = {"-m", "-k", "-n", "-p", "--dist"}  # `-m slow`: a marker expression, not a test file
        for q in quoted:
            args = shlex.split(q.args)
            for prev, arg in zip(["", *args], args):
                if not arg.startswith("-") and prev not in takes_value:
                    assert (REPO / arg.split("::")[0]).exists(), f"{q}: no test file {arg}"
        return
    help_text = _help_text(program)
    for q in quoted:
        for flag in re.findall(r"(?<!\S)(--[\w-]+)", _substitute(q.args, stand_ins)):
            assert flag in help_text, f"{q}: {flag} is not an option of python {program} (see its --help)"
