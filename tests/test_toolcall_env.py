"""ToolCallEnv end to end: real interpreter, real math-verify, every bundled demonstration replayed."""

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import envs
from envs.toolcall.env import ToolCallEnv
from envs.toolcall.grading import _worker, answers_match
from envs.toolcall.tasks import bundled_tasks

TASK = {
    "id": "t",
    "prompt": "Compute 12 + 7 - 3 * 2 from left to right.",
    "answer": "32",
    "intermediates": [19, 16, 32],
}


def call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call>"


@pytest.fixture
def env():
    e = ToolCallEnv(timeout_s=30, cpu_s=1, memory_mb=512)
    yield e
    e.close()


def test_check_env_passes():
    for e in (envs.make("toolcall"), envs.make("toolcall", tools=["python", "calculator"])):
        check_env(e, skip_render_check=True)
        e.close()
    g = gymnasium.make("nextstate/toolcall", max_steps=3)
    check_env(g.unwrapped, skip_render_check=True)
    g.close()


def test_reset_gives_system_prompt_and_tool_schemas(env):
    obs, info = env.reset(seed=3)
    assert obs["role"] == "user" and obs["content"] == env.task["prompt"]
    assert info["family"] == "toolcall" and info["task_id"].startswith("toolcall-train-")
    prompt = info["system_prompt"]
    assert len(prompt) < 400 and "<tool_call>" in prompt and "\\boxed{" in prompt and "python(code)" in prompt
    (schema,) = info["tools"]
    assert schema["type"] == "function" and schema["function"]["name"] == "python"
    assert schema["function"]["parameters"]["required"] == ["code"]
    two = ToolCallEnv(tools=["python", "calculator"])
    assert len(two.system_prompt) < 400 and "calculator(expression)" in two.system_prompt
    assert [t["function"]["name"] for t in two.reset(seed=0)[1]["tools"]] == ["python", "calculator"]


def test_unknown_tool_in_config_is_rejected():
    with pytest.raises(ValueError, match="choose from python, calculator"):
        ToolCallEnv(tools=["python", "bash"])


def test_progress_follows_the_intermediates(env):
    env.reset(options={"task": TASK})
    _, _, _, _, info = env.step(call("print(12 + 7)"))
    s = info["signals"]
    assert (s["progress"], s["error"], s["parse_error"], s["tool_name"], s["exit_code"]) == (
        True,
        False,
        False,
        "python",
        0,
    )
    _, _, _, _, info = env.step(call("print(12 + 7)"))  # already seen: no new progress
    assert info["signals"]["progress"] is False
    _, _, _, _, info = env.step(call("print(100)"))
    assert info["signals"]["progress"] is False
    _, _, _, _, info = env.step(call("print(16, 32)"))
    assert info["signals"]["progress"] is True
    obs, reward, terminated, truncated, info = env.step("So the answer is \\boxed{32}.")
    assert (reward, terminated, truncated, info["outcome"]) == (1.0, True, False, 1.0)
    assert info["signals"]["answer"] == "32" and info["signals"]["correct"] is True
    assert obs["content"] == "Final answer 32 received: correct."


def test_progress_without_intermediates_is_a_clean_printing_call(env):
    env.reset(options={"task": {"id": "x", "prompt": "p", "answer": "5"}})
    assert env.step(call("print('hi')"))[4]["signals"]["progress"] is True
    assert env.step(call("x = 1"))[4]["signals"]["progress"] is False  # printed nothing
    assert env.step(call("print(1)\n1/0"))[4]["signals"]["progress"] is False  # failed


def test_wrong_answer_and_configurable_rewards():
    e = ToolCallEnv(correct_reward=2.0, wrong_reward=-0.5)
    e.reset(options={"task": TASK})
    obs, reward, terminated, _, info = e.step("\\boxed{31}")
    assert (reward, terminated, info["signals"]["correct"]) == (-0.5, True, False)
    assert "incorrect" in obs["content"]
    e.reset(options={"task": TASK})
    assert e.step("\\boxed{32.0}")[1] == 2.0


def test_step_limit_truncates_with_the_wrong_reward():
    e = ToolCallEnv(max_steps=2)
    e.reset(options={"task": TASK})
    assert e.step("thinking...")[2:4] == (False, False)
    obs, reward, terminated, truncated, info = e.step("still thinking")
    assert (reward, terminated, truncated, info["outcome"]) == (-1.0, False, True, -1.0)
    assert "step limit of 2" in obs["content"]
    with pytest.raises(RuntimeError, match="after the episode ended"):
        e.step("\\boxed{32}")


@pytest.mark.parametrize(
    "action, message",
    [
        ('<tool_call>{"name": "python", "arguments": {"code": "print(1)"</tool_call>', "invalid: Expecting"),
        (
            '<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}</tool_call>',
            "unknown tool 'shell'; the tools are: python",
        ),
        ('<tool_call>{"name": "python", "arguments": {}}</tool_call>', "needs the argument 'code'"),
        ("The answer is 32.", "neither a <tool_call> nor a final answer"),
        (call("print(1)") + "\\boxed{1}", "both a tool call and a \\boxed{} answer"),
    ],
)
def test_malformed_turns_are_observations_not_exceptions(env, action, message):
    env.reset(options={"task": TASK})
    obs, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["signals"]["parse_error"] is True and info["signals"]["progress"] is False
    assert message in obs["content"] and "Expected format: <tool_call>" in obs["content"]
    assert obs["role"] == "user"
    assert env.step("\\boxed{32}")[1] == 1.0  # the episode goes on


def test_non_text_action_is_a_parse_error(env):
    env.reset(options={"task": TASK})
    assert env.step(None)[4]["signals"]["parse_error"] is True


@pytest.mark.integration
def test_tool_failures_are_reported_and_the_env_stays_usable(env):
    env.reset(options={"task": TASK})
    cases = [
        ("while True:\n    pass", "[killed: CPU time limit of 1 s exceeded]"),
        ("x = bytearray(10 * 1024**3)", "MemoryError"),
        ("import sys\nsys.stdout.write('y' * 100_000_000)", "bytes of output truncated"),
        ("1 / 0", "ZeroDivisionError"),
        ("open('big', 'wb').write(b'x' * 50_000_000)", "[file size limit of 16 MB reached]"),
    ]
    for code, expected in cases:
        obs, reward, terminated, truncated, info = env.step(call(code))
        s = info["signals"]
        assert obs["role"] == "tool" and expected in obs["content"], obs["content"][-300:]
        assert not terminated and not truncated
        if "truncated" in expected:
            assert not s["error"] and "[output truncated to 4000 bytes per stream]" in obs["content"]
            assert len(obs["content"]) < 10_000
        else:
            assert s["error"] is True and s["error_reason"]
    out = ToolCallEnv(memory_mb=512).tools["python"].run({"code": "bytearray(10 * 1024**3)"})
    assert "[memory limit of 512 MB reached]" in out.content
    assert out.error == "exit code 1: memory limit of 512 MB reached"
    env.reset(options={"task": TASK})
    obs, *_ = env.step(call("print(19)"))
    assert obs["content"] == "19"


def test_wall_timeout_is_reported():
    e = ToolCallEnv(timeout_s=0.5)
    e.reset(options={"task": TASK})
    obs, _, _, _, info = e.step(call("import time\ntime.sleep(30)"))
    assert info["signals"]["timed_out"] is True and info["signals"]["error"] is True
    assert "[killed: wall-clock timeout: still running after 0.5 s]" in obs["content"]


def test_calculator_tool():
    e = ToolCallEnv(tools=["calculator"])
    e.reset(options={"task": TASK})
    a = '<tool_call>{"name": "calculator", "arguments": {"expression": "(12 + 7 - 3) * 2"}}</tool_call>'
    obs, _, _, _, info = e.step(a)
    assert obs["content"] == "32" and info["signals"]["progress"] is True
    bad = '<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(\'os\')"}}</tool_call>'
    obs, _, _, _, info = e.step(bad)
    assert info["signals"]["error"] is True and "unsupported syntax" in obs["content"]
    huge = '<tool_call>{"name": "calculator", "arguments": {"expression": "9 ** 9 ** 9"}}</tool_call>'
    assert "larger than" in e.step(huge)[0]["content"]


@pytest.mark.parametrize(
    "answer, gold, expected",
    [
        ("42", "42", True),
        ("42.0", "42", True),
        ("42", "42.0", True),
        ("0.5", "\\frac{1}{2}", True),
        ("\\frac{1}{2}", "0.5", True),
        ("\\dfrac{3}{4}", "0.75", True),
        ("2^{10}", "1024", True),
        ("41", "42", False),
        ("x", "42", False),
        ("", "42", False),
    ],
)
def test_math_verify_equivalences(answer, gold, expected):
    assert answers_match(answer, gold) is expected


def test_grading_from_a_worker_thread_uses_the_helper_process():
    # math-verify's SIGALRM timeouts only work in the main thread: elsewhere a helper process runs it.
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(answers_match, "\\frac{1}{2}", "0.5").result() is True
        assert pool.submit(answers_match, "\\frac{1}{3}", "0.5").result() is False
        assert threading.current_thread() is threading.main_thread()
    assert _worker.pid is not None
    _worker.stop()
    assert _worker.pid is None


def test_demonstration_on_class_and_instance(env):
    task = bundled_tasks("train")[0]
    demo = ToolCallEnv.demonstration(task)
    assert [m["role"] for m in demo] == ["system", "user", "assistant", "tool", "assistant"]
    assert demo == env.demonstration(task)
    assert demo[4]["content"] == f"\\boxed{{{task['answer']}}}"
    other = ToolCallEnv(tools=["python", "calculator"]).demonstration(task)
    assert other[0]["content"] != demo[0]["content"] and "calculator" in other[0]["content"]
    with pytest.raises(ValueError, match="no 'solution_code'"):
        ToolCallEnv.demonstration({"id": "x", "prompt": "p", "answer": "1"})


def test_demonstration_runs_the_code_when_no_output_is_stored():
    task = {"id": "x", "prompt": "2*21?", "answer": "42", "solution_code": "print(2 * 21)"}
    assert ToolCallEnv.demonstration(task)[3]["content"] == "42"


def _replay(split: str, tasks: list[dict]) -> list[str]:
    """Play each task's demonstration through a real env; return the problems found."""
    env = ToolCallEnv(split=split)
    problems = []
    try:
        for task in tasks:
            demo = env.demonstration(task)
            obs, info = env.reset(options={"task": task["id"]})
            if info["system_prompt"] != demo[0]["content"] or obs["content"] != demo[1]["content"]:
                problems.append(f"{task['id']}: the first messages differ")
            turns = demo[2:]
            for i in range(0, len(turns), 2):
                obs, reward, terminated, truncated, info = env.step(turns[i]["content"])
                if i + 1 < len(turns):
                    if obs != {"role": turns[i + 1]["role"], "content": turns[i + 1]["content"]}:
                        problems.append(f"{task['id']}: observation {obs!r} != demonstration {turns[i + 1]!r}")
                    if not info["signals"]["progress"] or info["signals"]["error"]:
                        problems.append(f"{task['id']}: tool step signals {info['signals']}")
            if not (terminated and reward == env.config.correct_reward):
                problems.append(f"{task['id']}: ended with reward {reward}, terminated={terminated}")
    finally:
        env.close()
    return problems


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "eval"])
def test_every_demonstration_replays_to_the_correct_reward(split):
    tasks = list(bundled_tasks(split))
    env_for_ids = ToolCallEnv(split=split)
    assert [t["id"] for t in env_for_ids.task_pool()] == [t["id"] for t in tasks]
    shards = [tasks[i::4] for i in range(4)]  # 4 envs in threads: the interpreter runs in child processes
    with ThreadPoolExecutor(4) as pool:
        problems = [p for found in pool.map(_replay, [split] * len(shards), shards) for p in found]
    assert not problems, problems[:5]


def test_the_env_config_group_matches_the_constructor():
    from rollout.build import compose_launch_config, plan_env

    setup = plan_env(compose_launch_config(["env=toolcall"]).env)
    env = envs.make("toolcall", **setup.kwargs)
    assert env.max_steps == 6 and env.config.tools == ("python",) and env.config.limits.memory_mb == 1024
    env.close()


@pytest.mark.integration
def test_episodes_in_the_local_farm_threads():
    """Many envs stepped concurrently from the farm's worker threads (interpreter and grading included)."""
    import asyncio

    from rollout.farm.core import FarmConfig, make_farm

    tasks = bundled_tasks("eval")[:24]
    fraction = {"id": "half", "prompt": "What is 1/2?", "answer": "0.5"}

    async def play(farm, task, actions):
        async with farm.lease() as slot:
            await farm.reset(slot, task)
            for action in actions:
                result = await farm.step(slot, action)
            return result

    async def main():
        farm = make_farm("toolcall", {}, FarmConfig(backend="local", num_envs=8))
        await farm.start()
        try:
            demos = [ToolCallEnv.demonstration(t) for t in tasks]
            jobs = [play(farm, t, [d[2]["content"], d[4]["content"]]) for t, d in zip(tasks, demos)]
            jobs.append(play(farm, fraction, ["\\boxed{\\frac{1}{2}}"]))
            return await asyncio.gather(*jobs)
        finally:
            await farm.close()

    results = asyncio.run(main())
    assert all(r.terminated and r.reward == 1.0 for r in results), [r.info["signals"] for r in results if r.reward != 1]
