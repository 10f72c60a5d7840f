"""`python -m rollout.view`: the data it writes (every step once, episodes never split across chunks, a torn line
skipped and counted), and the page in headless Chromium: a generated 100k-step run opens on its first page of
episodes, filters and pages, and an opened episode shows its steps, votes and screenshots (the timing is
benchmarks/viewer.py's); and the output of a real `env=gui` run shows its screenshots and votes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.viewer import CHROMIUM, headless_browser, write_synthetic_run
from rollout.records import read_jsonl
from rollout.view import build_viewer

REPO = Path(__file__).resolve().parent.parent


def _payload(path: Path, call: str):
    text = path.read_text()
    assert text.startswith(call + "(") and text.rstrip().endswith(");")
    return json.loads("[" + text[len(call) + 1: text.rstrip().rindex(")")] + "]")


def require_browser() -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (scripts/install.sh installs Debian's chromium)")
    import playwright.sync_api  # noqa: F401 (the dev extra, always installed: a broken one fails)


def test_export_writes_every_step_once_in_whole_episode_chunks(tmp_path):
    wrote = write_synthetic_run(tmp_path, 2_000, steps_per_episode=7)
    with (tmp_path / "trajectories.jsonl").open("a") as f:
        f.write('{"episode_id": "it9-g0-s0", "step_ind')  # a kill cut the last write short
    built = build_viewer(tmp_path, chunk_steps=100)
    run = _payload(tmp_path / "viewer" / "data" / "run.js", "NSV.run")[0]
    index = run["episodes"]
    assert run["counts"] == {"episodes": wrote["episodes"], "steps": wrote["steps"], "chunks": built.chunks}
    assert run["skipped_lines"] == {"trajectories.jsonl": 1} and run["prefix"] == "../"
    assert Counter(index["status"])["aborted"] == wrote["aborted"]
    seen: Counter = Counter()
    for chunk_file in sorted((tmp_path / "viewer" / "data" / "steps").iterdir()):
        number, steps = _payload(chunk_file, "NSV.chunk")
        for episode, rows in steps.items():
            i = index["episode_id"].index(episode)
            assert index["chunks"][i] == [number]  # an episode lives in one chunk
            assert [r["step_index"] for r in rows] == list(range(index["num_steps"][i]))
            seen[episode] += len(rows)
    assert sum(seen.values()) == wrote["steps"] and len(seen) == wrote["episodes"]
    assert built.chunks == pytest.approx(wrote["steps"] / 100, abs=2)
    # the same records as the run's: a step's judge and screenshot come through as written
    first = json.loads((tmp_path / "trajectories.jsonl").open().readline())
    number, steps = _payload(tmp_path / "viewer" / "data" / "steps" / "c00000.js", "NSV.chunk")
    shown = steps[first["episode_id"]][0]
    assert shown["judge"] == first["judge"] and shown["screenshot"] == first["screenshot"]


def test_view_command_reports_a_missing_run(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rollout.view", str(tmp_path / "nope")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "is not a run directory" in proc.stderr


@pytest.mark.slow  # experiment scale: a 100k-step run
def test_a_100k_step_run_opens_on_its_first_page_filters_and_opens_an_episode(tmp_path):
    require_browser()
    wrote = write_synthetic_run(tmp_path / "run", 100_000)
    built = build_viewer(tmp_path / "run")
    assert built.steps == 100_000
    with headless_browser() as ctx:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto((built.out_dir / "index.html").as_uri())
        page.wait_for_selector("body[data-ready=episodes]", timeout=60_000)
        assert page.locator("#episodes tr.ep").count() == 50
        assert f"page 1 of {-(-wrote['episodes'] // 50)}" in page.inner_text("#page")
        page.select_option("select[data-filter=status]", "aborted")
        page.wait_for_function(f"document.querySelector('#page').textContent.includes('({wrote['aborted']} episodes)')")
        statuses = page.locator("#episodes tr.ep td:nth-child(6)").all_inner_texts()
        assert statuses and set(statuses) == {"aborted"}
        page.select_option("select[data-filter=status]", "")
        page.select_option("select[data-filter=family]", "gui")
        page.wait_for_selector("body[data-ready=episodes]")
        page.click("#next")
        page.wait_for_function("document.querySelector('#page').textContent.startsWith('page 2 ')")
        page.locator("#episodes tr.ep").first.click()
        page.wait_for_selector("body[data-ready=episode]", timeout=60_000)
        assert page.locator(".step").count() == 10
        first = page.locator(".step").first
        assert first.locator(".vote").count() == 3 and first.locator(".raw").count() == 1
        assert "advantage" in first.inner_text() and "weight version" in first.inner_text()
        assert "latency" in first.inner_text() and "900 in / 120 out" in first.inner_text()  # the judge's cost
        shot = first.locator(".shots img").last
        shot.scroll_into_view_if_needed()
        page.wait_for_function("[...document.querySelectorAll('.step .shots img')].some(i => i.naturalWidth > 0)")
        page.go_back()  # the hash keeps the list's filters and page
        page.wait_for_selector("body[data-ready=episodes]")
        assert page.input_value("select[data-filter=family]") == "gui"
        page.click("nav a[data-tab=metrics]")
        page.wait_for_selector(".chart[data-metric='judge/unanimous_fraction']")
        assert page.locator(".chart[data-metric='judge/latency_p50_s']").count() == 1
        assert not errors, errors


@pytest.mark.integration
@pytest.mark.slow  # a whole GUI launch
def test_the_viewer_shows_screenshots_and_votes_of_a_real_gui_run(tmp_path):
    require_browser()
    from gui_support import require_desktop_tools

    require_desktop_tools()
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rollout.launch", "env=gui", f"run.out_dir={out}",
           f"policy.warm_start.cache_dir={tmp_path / 'cache'}", "policy.warm_start.enabled=false",
           "policy.warm_start.max_conversations=2", "loop.iterations=1", "loop.tasks_per_iteration=1",
           "loop.samples_per_task=2", "loop.eval_tasks=0", "env.max_steps=2", "farm.num_envs=2",
           "sampling.max_new_tokens=16"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"gui run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    steps = read_jsonl(out / "trajectories.jsonl")
    assert steps and all(s["screenshot"] and (out / s["screenshot"]).stat().st_size > 1000 for s in steps)
    view = subprocess.run([sys.executable, "-m", "rollout.view", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert view.returncode == 0 and "viewer:" in view.stdout
    with headless_browser() as ctx:
        page = ctx.new_page()
        page.goto((out / "viewer" / "index.html").as_uri())
        page.wait_for_selector("body[data-ready=episodes]")
        row = page.locator("#episodes tr.ep").first
        episode = row.get_attribute("data-episode")
        row.click()
        page.wait_for_selector("body[data-ready=episode]")
        page.wait_for_function("[...document.querySelectorAll('.step .shots img')].length > 0 && "
                               "[...document.querySelectorAll('.step .shots img')].every(i => i.complete && i.naturalWidth === 1280)")
        mine = sorted((s for s in steps if s["episode_id"] == episode), key=lambda s: s["step_index"])
        cards = page.locator(".step")
        assert cards.count() == len(mine)
        for card, s in zip(cards.all(), mine):
            assert card.locator(".vote").count() == len(s["judge"]["votes"]) >= 1
            assert s["next_state"]["content"][:40] in card.locator("pre.next-state").inner_text()
            assert card.locator(".shots img").last.get_attribute("src") == "../" + s["screenshot"]


@pytest.mark.integration
def test_the_metrics_tab_shows_the_logprob_mismatch_and_a_failed_sync(tmp_path):
    """A vLLM run's rollout-vs-trainer log-prob metrics are charted by default, and a run a parity check stopped says
    why (rollout/policy/parity.py)."""
    require_browser()
    write_synthetic_run(tmp_path, 200)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        for k in range(3):
            f.write(json.dumps({"kind": "train", "iteration": 10 + k, "logprobs/mismatch_max": 2e-6 * (k + 1),
                                "logprobs/ratio_std": 1e-6, "weight_sync/parity_max_diff": 3e-6}) + "\n")
        f.write(json.dumps({"kind": "error", "stage": "weight sync parity", "iteration": 13,
                            "error": "WeightParityError: log-prob parity failed after the weight sync of v14: server "
                                     "http://127.0.0.1:8000 differs from the trainer by 0.7"}) + "\n")
    built = build_viewer(tmp_path)
    with headless_browser() as ctx:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto((built.out_dir / "index.html").as_uri() + "#metrics")
        page.wait_for_selector(".chart[data-metric='logprobs/mismatch_max']")
        for key in ("logprobs/ratio_std", "weight_sync/parity_max_diff"):
            assert page.locator(f".chart[data-metric='{key}']").count() == 1
        assert "differs from the trainer by 0.7" in page.inner_text(".note.error")
        assert not errors, errors
