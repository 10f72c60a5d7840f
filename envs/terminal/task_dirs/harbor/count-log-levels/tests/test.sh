#!/bin/bash
# The reward: 1 when /app/counts.json holds the right count of every level, else 0 (no pytest needed).
python3 - <<'PY'
import collections, json, pathlib
want = collections.Counter(line.split()[0] for line in pathlib.Path("/tests/expected.log").read_text().splitlines() if line)
try:
    got = json.loads(pathlib.Path("/app/counts.json").read_text())
except (OSError, ValueError) as exc:
    print("counts.json is missing or not JSON:", exc)
    got = None
ok = isinstance(got, dict) and all(got.get(k) == want[k] for k in ("INFO", "WARN", "ERROR"))
print("PASS" if ok else f"FAIL: want {dict(want)}, got {got}")
pathlib.Path("/logs/verifier/reward.txt").write_text("1\n" if ok else "0\n")
PY
