"""SWE-bench instance dicts: validation and normalization (the `id` key, test lists stored as JSON strings), and the
bundled set. Files load through envs.taskfile (JSON, JSONL, parquet)."""

from __future__ import annotations

import json
from typing import Any

from envs.swe.bundled.sources import load_bundled_instances

REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "test_patch", "version")
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")


def validate_swe_instance(instance: dict[str, Any]) -> dict[str, Any]:
    """Check an instance and normalize it: `id` = instance_id, test lists as lists, version as a string."""
    missing = [k for k in REQUIRED if not instance.get(k)]
    if missing:
        name = instance.get("instance_id") or instance.get("id") or "?"
        raise ValueError(f"SWE instance {name!r} lacks {', '.join(missing)} (fields: {sorted(instance)})")
    out = dict(instance)
    out["id"] = str(instance["instance_id"])
    out["version"] = str(instance["version"])
    for key in TEST_LISTS:
        value = instance.get(key, [])
        if isinstance(value, str):  # the HF datasets store these lists as JSON text
            try:
                value = json.loads(value) if value.strip() else []
            except json.JSONDecodeError:
                raise ValueError(f"SWE instance {out['id']!r}: {key} is neither a list nor JSON text") from None
        if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
            raise ValueError(f"SWE instance {out['id']!r}: {key} must be a list of test names")
        out[key] = value
    if not out["FAIL_TO_PASS"]:
        raise ValueError(f"SWE instance {out['id']!r} has no FAIL_TO_PASS tests: it cannot be graded")
    return out


def bundled_instances(split: str = "train") -> list[dict[str, Any]]:
    """The bundled instances of `split` ("train", "eval" or "all")."""
    if split not in ("train", "eval", "all"):
        raise ValueError(f"split {split!r}: use 'train', 'eval' or 'all'")
    rows = [validate_swe_instance(r) for r in load_bundled_instances()]
    return [r for r in rows if split == "all" or r.get("split", "train") == split]
