"""The chained-calculator task set (toolcall `task_set=chain`): tasks, step verdicts, the rule judge's votes, and the
clean / noisy demonstrations (real calculator calls through the env)."""

import asyncio
from collections import Counter

import pytest

import envs
from envs.toolcall import chain
from envs.toolcall.env import ToolCallEnv
from prm.judge import RuleJudge, StepContext


@pytest.fixture
def env():
    e = envs.make("toolcall", tools=["calculator"], task_set="chain")
    yield e
    e.close()


def call(expr: str) -> str:
    return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>' % expr


TASK = chain.chain_task("t", [12, 5, 3, 9], ["+", "-", "+"])  # 17, 14, 23


def vote(signals) -> int:
    ctx = StepContext("toolcall", "t", "", [], "", {"role": "tool", "content": ""}, signals)
    return RuleJudge().score_now(ctx).votes[0]


def play(env, actions):
    env.reset(options={"task": TASK})
    out = []
    for a in actions:
        obs, reward, term, trunc, info = env.step(a)
        out.append((info["signals"]["mistake"], vote(info["signals"]), obs["content"], reward))
    return out


def test_tasks_are_deterministic_disjoint_and_in_range():
    sets = chain.generate_chain_tasks(seed=3, n_train=300, n_eval=50)
    assert sets == chain.generate_chain_tasks(seed=3, n_train=300, n_eval=50)
    train, evals = sets["train"], sets["eval"]
    assert not {t["prompt"] for t in train} & {t["prompt"] for t in evals}
    for t in train + evals:
        ops, operands = t["chain"]["ops"], t["chain"]["operands"]
        assert len(operands) == 4 and all(0 <= x <= 29 for x in operands) and set(ops) <= {"+", "-"}
        assert t["prompt"] == f"Q {operands[0]} {ops[0]} {operands[1]} {ops[1]} {operands[2]} {ops[2]} {operands[3]} ?"
        assert all(v >= 0 for v in t["intermediates"]) and t["answer"] == str(t["intermediates"][-1])
    bundled = ToolCallEnv.tasks("eval", task_set="chain")
    assert len(bundled) == 512 and len(ToolCallEnv.tasks("train", task_set="chain")) == 10_000
    with pytest.raises(ValueError, match="task_set"):
        ToolCallEnv(task_set="nope")
    with pytest.raises(ValueError, match="calculator"):
        ToolCallEnv(task_set="chain", tools=["python"])


def test_the_right_chain_scores_plus_one_every_step(env):
    steps = play(env, [call("12 + 5"), call("17 - 3"), call("14 + 9"), "\\boxed{23}"])
    assert [(m, v) for m, v, _, _ in steps] == [("ok", 1)] * 4
    assert [c for _, _, c, _ in steps[:3]] == ["17", "14", "23"] and steps[-1][3] == 1.0


def test_a_consistent_step_on_a_wrong_value_scores_zero_and_mistakes_minus_one(env):
    # flipped op first (12 - 5 = 7), then the right ops on the wrong values, then that value as the answer
    steps = play(env, [call("12 - 5"), call("7 - 3"), call("4 + 9"), "\\boxed{13}"])
    assert [(m, v) for m, v, _, _ in steps] == [("flipped_op", -1), ("propagated", 0), ("propagated", 0),
                                                 ("propagated", 0)]
    assert steps[-1][3] == -1.0
    # an operand of the question instead of the last result; then a stale answer
    steps = play(env, [call("12 + 5"), call("5 - 3"), call("2 + 9"), "\\boxed{2}"])
    assert [m for m, *_ in steps] == ["ok", "reused_operand", "propagated", "stale_answer"]
    assert [v for _, v, *_ in steps] == [1, -1, 0, -1]


def test_malformed_extra_early_and_other_wrong_steps_score_minus_one(env):
    steps = play(env, [call("12 + 5"), "not a call", call("17 - 3"), call("14 + 9"), call("23 + 0"), "\\boxed{23}"])
    assert [(m, v) for m, v, *_ in steps] == [("ok", 1), ("malformed", -1), ("ok", 1), ("ok", 1),
                                               ("extra_call", -1), ("ok", 1)]
    steps = play(env, [call("12 * 5"), call("12 +"), "\\boxed{17}"])
    assert [(m, v) for m, v, *_ in steps] == [("wrong_call", -1), ("tool_error", -1), ("early_answer", -1)]


def test_demonstrations_replay_through_the_env_with_the_same_observations_and_labels(env):
    noise = {"rates": [0.5, 0.5, 0.5, 0.5], "seed": 7}
    tasks = ToolCallEnv.tasks("train", task_set="chain")[:300]
    counts = Counter()
    for t in tasks:
        clean = env.demonstration(t)
        noisy = env.demonstration(t, noise=noise)
        assert noisy == env.demonstration(t, noise=noise)  # deterministic per (seed, task)
        assert ToolCallEnv.demonstration_labels(t, clean) == ["ok"] * 4
        labels = ToolCallEnv.demonstration_labels(t, noisy)
        obs, info = env.reset(options={"task": t})
        assert info["system_prompt"] == noisy[0]["content"] and obs["content"] == noisy[1]["content"]
        replayed = []
        for i, m in enumerate(noisy[2:]):
            if m["role"] == "assistant":
                obs, *_, info = env.step(m["content"])
                replayed.append(info["signals"]["mistake"])
            else:
                assert obs["content"] == m["content"]
        assert replayed == labels
        counts.update((i, lab) for i, lab in enumerate(labels))
    # each step's dominant mistake appears at about its rate (a flip of "+ 0" is harmless, hence the slack)
    for i, mistake in enumerate(chain.DEFAULT_MISTAKES):
        assert 0.35 < counts[(i, mistake)] / len(tasks) < 0.62, (i, mistake, counts)
    rates = chain.label_rates([ToolCallEnv.demonstration_labels(t, env.demonstration(t, noise=noise)) for t in tasks])
    assert set(rates) == {0, 1, 2, 3} and all(abs(sum(r.values()) - 1) < 1e-9 for r in rates.values())


def test_hinted_demonstrations_carry_the_hint_the_env_and_judge_give_for_that_alternative(env):
    """A hint-following demonstration stops at a step whose context ends with the hint the rule judge writes when the
    env is played up to that step and the demonstration's wrong alternative is taken there; the step is the right one."""
    from envs.base import HINT_SIGNALS
    from prm.hints import HINT_LABEL
    from rollout.policy.build import with_written_hints

    noise, hints = {"rates": [0.5] * 4, "seed": 3}, {"rate": 0.5, "seed": 1}
    tasks = ToolCallEnv.tasks("train", task_set="chain")[:200]
    judge = RuleJudge(hints=True)
    cut = Counter()
    for t in tasks:
        full = env.demonstration(t, noise=noise)
        raw = env.demonstration(t, noise=noise, hints=hints)
        assert raw == env.demonstration(t, noise=noise, hints=hints)  # deterministic per (seed, task)
        assert env.demonstration(t, noise=noise, hints={"rate": 0.0}) == full
        marked = [i for i, m in enumerate(raw) if HINT_SIGNALS in m]
        if not marked:
            assert raw == full
            continue
        (i,) = marked
        assert i == len(raw) - 2 and raw[-1]["role"] == "assistant" and raw[:i] == full[:i]
        k = sum(m["role"] == "assistant" for m in raw[:i])
        cut[k] += 1
        assert ToolCallEnv.demonstration_labels(t, raw)[-1] == "ok"  # the hinted step is the right one
        shown = raw[i][HINT_SIGNALS]["shown"]
        wrong = call(shown[len("calculator("): shown.index(")")]) if shown.startswith("calculator(") else shown
        env.reset(options={"task": t})
        for m in raw[2:i + 1]:
            if m["role"] == "assistant":
                env.step(m["content"])
        obs, *_, info = env.step(wrong)  # the alternative, played for real
        assert info["signals"]["mistake"] != "ok"
        ctx = StepContext("toolcall", t["id"], "", [], wrong, obs, info["signals"])
        hint = judge.score_now(ctx).hint
        written = with_written_hints(raw)
        assert HINT_SIGNALS not in written[i] and written[i]["content"] == f"{raw[i]['content']}\n\n{HINT_LABEL} {hint}"
        assert written[:i] == raw[:i] and written[-1] == raw[-1]
    assert sorted(cut) == [0, 1, 2, 3] and 60 < sum(cut.values()) < 140, cut  # every step, at about the rate


def test_right_step_hinted_demonstrations_carry_the_hint_the_directive_judge_gives_that_step(env):
    """With `hints.right`, a share of the hinted demonstrations stop at a call whose context ends with the hint the
    rule judge gives under judge.hint_steps=directive when that (right) call is played: "<call> is right; the next
    step is ..."; the step after it is that call. The final answer has no next step, so its hint stays a wrong one."""
    from envs.base import HINT_SIGNALS
    from prm.hints import HINT_LABEL
    from rollout.policy.build import with_written_hints

    tasks = ToolCallEnv.tasks("train", task_set="chain")[:120]
    judge = RuleJudge(hints=True, hint_steps="directive")
    kinds = Counter()
    for t in tasks:
        raw = env.demonstration(t, hints={"rate": 1.0, "seed": 2, "right": 0.5})
        marked = [i for i, m in enumerate(raw) if HINT_SIGNALS in m]
        if not marked:  # a wrong hint with no wrong alternative (e.g. x + 0)
            continue
        (i,) = marked
        right_hint = "confirmed" in raw[i][HINT_SIGNALS]
        kinds[right_hint] += 1
        if not right_hint:
            continue
        env.reset(options={"task": t})
        for m in raw[2:i + 1]:
            if m["role"] == "assistant":
                env.step(m["content"])
        obs, *_, info = env.step(raw[-1]["content"])  # the demonstrated step, played for real: a right call
        assert info["signals"]["mistake"] == "ok"
        hint = judge.score_now(StepContext("toolcall", t["id"], "", [], raw[-1]["content"], obs, info["signals"])).hint
        assert hint and "is right; the next step is" in hint
        assert with_written_hints(raw)[i]["content"] == f"{raw[i]['content']}\n\n{HINT_LABEL} {hint}"
    assert 30 < kinds[True] < 75 and kinds[False] > 30, kinds  # about half of the calls' hints, none of the answers'
    with pytest.raises(ValueError, match="hint right"):
        chain.ChainHints(rate=0.5, right=2.0)


def test_noise_options_are_checked():
    with pytest.raises(ValueError, match="one rate per step"):
        chain.ChainNoise(rates=(0.5,))
    with pytest.raises(ValueError, match="cannot be injected"):
        chain.ChainNoise(rates=(0.5,), mistakes=("malformed",))
    with pytest.raises(ValueError, match="chain tasks only"):
        ToolCallEnv.demonstration(ToolCallEnv.tasks("train")[0], noise={"rates": [0.5] * 4})
    with pytest.raises(ValueError, match="hint rate"):
        chain.ChainHints(rate=1.5)
    with pytest.raises(ValueError, match="chain tasks only"):
        ToolCallEnv.demonstration(ToolCallEnv.tasks("train")[0], hints={"rate": 0.5})
    from envs.base import HINT_SIGNALS
    from rollout.policy.build import with_written_hints

    with pytest.raises(ValueError, match="give no hint"):
        with_written_hints([{"role": "tool", "content": "3", HINT_SIGNALS: {"expected": "x", "shown": "x"}}])


def test_the_launcher_picks_the_bundled_set_from_the_env_options():
    from omegaconf import OmegaConf

    from rollout.build import plan_env

    cfg = OmegaConf.create({"name": "toolcall", "tasks": None, "eval_tasks": None, "task_set": "chain",
                            "tools": ["calculator"]})
    setup = plan_env(cfg)
    name, kwargs, train, evals = setup.name, setup.kwargs, setup.train_tasks, setup.eval_tasks
    assert kwargs["task_set"] == "chain" and train[0]["id"].startswith("chain-train") and len(evals) == 512
    e = envs.make(name, **kwargs)
    obs, info = e.reset(seed=0)
    assert obs["content"].startswith("Q ") and info["system_prompt"] == chain.SYSTEM_PROMPT
    # a farm-style episode: the task dict is handed in
    assert asyncio.run(RuleJudge().score(StepContext("toolcall", "x", "", [], "", {}, {"wrong": True}))).score == -1
