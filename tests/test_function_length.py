"""Functions fit on a screen: no function or method in envs/, prm/, train/ or rollout/ is longer than 100 lines (from its
`def` to its last line, nested functions counted in their parent too), unless ALLOWED names it with the reason it
reads better whole."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("envs", "prm", "train", "rollout")
MAX_LINES = 100

#: "path::qualified.name" -> why it may be longer. Keep it short: a function here reads better whole (say why).
ALLOWED: dict[str, str] = {}


def long_functions(root: Path = REPO, packages: tuple[str, ...] = PACKAGES,
                   limit: int = MAX_LINES) -> dict[str, int]:
    """'path::qualified.name' -> lines, for every function or method over `limit` lines."""
    out: dict[str, int] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()

            def visit(node: ast.AST, prefix: str) -> None:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        name = prefix + child.name
                        if child.end_lineno - child.lineno + 1 > limit:
                            out[f"{rel}::{name}"] = child.end_lineno - child.lineno + 1
                        visit(child, name + ".")
                    elif isinstance(child, ast.ClassDef):
                        visit(child, prefix + child.name + ".")
                    else:
                        visit(child, prefix)

            visit(ast.parse(path.read_text(), filename=rel), "")
    return out


def test_no_function_is_over_the_limit_unless_allowed():
    found = long_functions()
    over = {k: n for k, n in found.items() if k not in ALLOWED}
    assert not over, ("functions over 100 lines: split them where their parts have names of their own, or add them "
                      f"to ALLOWED with the reason they read better whole: {over}")


def test_the_allow_list_has_no_stale_entries():
    """An entry whose function is gone or now fits is removed, so the list stays the list of what is long."""
    found = long_functions()
    assert [k for k in ALLOWED if k not in found] == []


def test_the_count_is_of_the_whole_function(tmp_path):
    """100 lines from `def` to the last line pass; 101 do not, for a method too (named with its class)."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    fits = "def fits():\n" + "\n".join(f"    x{i} = {i}" for i in range(99))
    long = "class C:\n    def long(self):\n" + "\n".join(f"        x{i} = {i}" for i in range(100))
    (pkg / "m.py").write_text(f"{fits}\n\n\n{long}\n")
    assert long_functions(tmp_path, ("pkg",)) == {"pkg/m.py::C.long": 101}
