"""env=mix: several env families in one run. The command-line forms (the weight map, one family's option), the plan
(each family's own env config, tasks, weight, sampling, farm), the pure rules (group shares, slot quotas, staleness
bounds), and runs: one family whose envs raise on every reset while the others train, and per-family staleness bounds
on a real mixed farm."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence

import pytest

import envs
from doubles import RecordingTrainer
from envs.base import AgentEnv, Transition
from envs.options import UnknownOptionError
from loop_support import ParityEnv, tiny_policy_and_model
from loop_support import register as register_parity
from prm.judge import RuleJudge
from rollout import build
from rollout import run as run_module
from rollout.build import compose_launch_config, plan_run
from rollout.config import open_dict_overrides
from rollout.farm.core import FarmConfig, MixFarm
from rollout.loop import FamilySampler, LoopConfig, RLLoop, RunWriter
from rollout.metrics import family_values
from rollout.mix import GroupShares, LoopFamily, slot_quotas, staleness_bounds
from rollout.policy.base import SamplingParams
from rollout.records import read_jsonl
from rollout.run import run
from train.backends.torch_backend import TorchTrainer
from train.batch import RewardConfig
from train.config import TorchTrainerConfig


# ----- the command line -----
def test_the_weight_map_says_which_families_run_and_a_family_option_merges_into_its_entry():
    cfg = compose_launch_config(["env=mix", "env.families={toolcall: 0.4, terminal: 0.3, gui: 0.2, swe: 0.1}",
                                 "env.families.gui.max_steps=10", "env.families.gui.sampling.max_new_tokens=32",
                                 "farm.families.gui.num_envs=4"])
    fams = {k: v for k, v in cfg.env.families.items() if v is not None}
    assert list(fams) == ["toolcall", "terminal", "gui", "swe"]
    assert fams["gui"] == {"weight": 0.2, "max_steps": 10, "sampling": {"max_new_tokens": 32}}
    plan = plan_run(cfg)
    gui = next(f for f in plan.env.families if f.family == "gui")
    assert gui.kwargs["max_steps"] == 10 and gui.sampling == {"max_new_tokens": 32} and gui.weight == 0.2
    assert plan.farms["gui"].num_envs == 4 and sum(f.num_envs for f in plan.farms.values()) == plan.farm.num_envs
    # each family keeps its own env config: configs/env/terminal.yaml's observation limit, swe's task sources
    terminal = next(f for f in plan.env.families if f.family == "terminal")
    assert terminal.kwargs["max_observation_chars"] == 4000 and len(terminal.train_tasks) > 0


def test_a_shorter_map_drops_the_other_families_and_the_rewrite_is_idempotent():
    once = open_dict_overrides(["env=mix", "env.families={toolcall: 0.5, terminal: 0.5}", "env.families.swe=0.2"])
    assert open_dict_overrides(once) == once
    cfg = compose_launch_config(["env=mix", "env.families={toolcall: 0.5, terminal: 0.5}"])
    assert [f.family for f in plan_run(cfg).env.families] == ["toolcall", "terminal"]
    cfg = compose_launch_config(["env=mix", "env.families.swe=null", "env.families.gui=0.5"])
    assert [(f.family, f.weight) for f in plan_run(cfg).env.families] == [
        ("toolcall", 0.25), ("terminal", 0.25), ("gui", 0.5)]


@pytest.mark.parametrize("overrides,message", [
    (["env.families.gui.max_stpes=10"], "unknown env.families.gui (gui env) option(s) max_stpes (did you mean max_steps?)"),
    (["env.families={toolcall: 0.5}", "env.families.gui.max_steps=3"], "env.families.gui sets max_steps but has no weight"),
    (["env.families={toolcall: 0.5, tool_chain: {name: toolcal, weight: 1}}"], "env.families.tool_chain: no env 'toolcal'"),
    (["env.families={toolcall: 0, terminal: 0}"], "every family of env=mix has weight 0"),
    (["env.families.gui.sampling.max_tokens=3"], "max_tokens"),
    (["farm.families.gu.num_envs=3"], "farm.families names ['gu']"),
    (["loop.max_staleness={gu: 0}"], "loop.max_staleness names ['gu']"),
])
def test_a_mistake_in_a_family_is_one_clear_error(overrides, message):
    cfg = compose_launch_config(["env=mix", *overrides])
    with pytest.raises((ValueError, LookupError, UnknownOptionError)) as err:
        plan = plan_run(cfg)
        staleness_bounds(plan.loop.max_staleness, [f.family for f in plan.env.families])
    assert message in str(err.value)


def test_env_families_outside_a_mix_is_an_error():
    with pytest.raises(ValueError, match="env.families is an option of env=mix, not of env=toolcall"):
        plan_run(compose_launch_config(["env=toolcall", "env.families.gui.max_steps=3"]))


# ----- the pure rules -----
def test_group_shares_follow_the_weights_over_iterations_and_sum_to_each_iteration():
    shares = GroupShares({"toolcall": 0.4, "terminal": 0.3, "gui": 0.2, "swe": 0.1})
    totals: Counter = Counter()
    for _ in range(10):
        got = shares.take(8)
        assert sum(got.values()) == 8
        totals.update(got)
    assert totals == {"toolcall": 32, "terminal": 24, "gui": 16, "swe": 8}  # 80 groups x the weights, exactly
    assert GroupShares({"a": 1.0, "b": 0.0}).take(3) == {"a": 3}  # weight 0: evaluated, never trained on
    with pytest.raises(ValueError, match="no family has a positive weight"):
        GroupShares({"a": 0.0})


def test_slot_quotas_split_by_weight_keep_fixed_ones_and_give_every_family_a_slot():
    assert slot_quotas(32, {"a": 0.4, "b": 0.3, "c": 0.2, "d": 0.1}) == {"a": 13, "b": 10, "c": 6, "d": 3}
    assert slot_quotas(10, {"a": 1.0, "b": 1.0, "c": 1.0}, {"c": 6}) == {"a": 2, "b": 2, "c": 6}
    assert slot_quotas(4, {"a": 100.0, "b": 0.0, "c": 0.001}) == {"a": 2, "b": 1, "c": 1}
    with pytest.raises(ValueError, match="at least one each"):
        slot_quotas(3, {"a": 1.0, "b": 1.0}, {"a": 3})


def test_staleness_bounds_a_number_or_a_map():
    assert staleness_bounds(2, ["a", "b"]) == {"a": 2, "b": 2}
    assert staleness_bounds({"b": 0}, ["a", "b"]) == {"a": 1, "b": 0}
    with pytest.raises(ValueError, match="must be >= 0"):
        LoopConfig(max_staleness={"a": -1})


def test_the_family_sampler_replays_to_its_position_by_iterations():
    """The shares carry fractions between iterations: a resume replays the draws iteration by iteration."""
    fams = [LoopFamily("a", [{"id": f"a{i}"} for i in range(5)], [], 0.55),
            LoopFamily("b", [{"id": f"b{i}"} for i in range(3)], [], 0.45)]
    straight = FamilySampler(fams, seed=7)
    draws = [straight.take(3) for _ in range(5)]
    resumed = FamilySampler(fams, seed=7)
    resumed.skip(12, groups_per_take=3)
    assert resumed.position == 12 and resumed.take(3) == draws[4]
    assert FamilySampler(fams, seed=7).digest() != FamilySampler(fams[:1], seed=7).digest()


# ----- runs -----
class BrokenDesktopEnv(AgentEnv):
    """A family whose every reset raises (a desktop that never starts)."""

    def __init__(self, **kw):
        super().__init__(max_steps=3, tasks=self.tasks(), **kw)

    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[dict]:
        return [{"id": f"broken-{split}-{i}"} for i in range(4)]

    def begin(self, task: dict) -> Transition:
        raise RuntimeError("the desktop did not start (injected)")

    def act(self, action: str) -> Transition:
        raise AssertionError("never reached")


@pytest.mark.slow  # a whole mixed run
def test_a_family_whose_envs_raise_on_every_reset_does_not_stop_the_others(tmp_path):
    envs.register("broken_desktop", BrokenDesktopEnv, overwrite=True)
    out = tmp_path / "run"
    cfg = compose_launch_config([
        "env=mix", "env.families={toolcall: 0.5, broken: {name: broken_desktop, weight: 0.5}}",
        "loop.iterations=2", "loop.tasks_per_iteration=4", "loop.samples_per_task=2", "loop.eval_tasks=2",
        "loop.max_retries=1", "loop.max_staleness=0", "policy.warm_start.enabled=false", "sampling.max_new_tokens=8",
        "reward.constant=zero",  # the untrained policy's equal outcomes still give samples (zero advantages)
        "farm.num_envs=6", f"run.out_dir={out}", "run.name=broken",
    ])
    assert asyncio.run(run(cfg)) == 0
    rows = read_jsonl(out / "metrics.jsonl")
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["weight_version"] for r in train] == [1, 2]  # the toolcall family trained every iteration
    for r in train:
        fam = family_values(r)
        assert fam["toolcall"]["episodes_ok"] == fam["toolcall"]["episodes"] == 4 and fam["toolcall"]["samples"] > 0
        # 2 groups x 2 samples, each tried twice (max_retries=1): every attempt aborted, counted under its family
        assert fam["broken"]["episodes_aborted"] == fam["broken"]["episodes"] == 8
        assert fam["broken"]["samples"] == 0 and fam["broken"]["accuracy"] == 0.0
        assert fam["toolcall"]["farm/env_errors"] == 0 and fam["broken"]["farm/env_errors"] >= 8
    evals = [r for r in rows if r["kind"] == "eval"]
    assert all(family_values(r)["broken"]["aborted"] == 2 and family_values(r)["toolcall"]["aborted"] == 0
               for r in evals)
    episodes = read_jsonl(out / "episodes.jsonl")
    assert {e["family"] for e in episodes if e["status"] == "aborted"} == {"broken"}
    assert "the desktop did not start" in next(e["reason"] for e in episodes if e["family"] == "broken")
    steps = read_jsonl(out / "trajectories.jsonl")
    assert steps and {s["family"] for s in steps} == {"toolcall"}
    families = json.loads((out / "families.json").read_text())
    assert families["broken"]["env"] == "broken_desktop" and families["broken"]["farm"]["num_envs"] == 3


@pytest.mark.slow  # a whole mixed run
def test_a_resumed_mix_run_draws_what_a_straight_run_draws(tmp_path, monkeypatch):
    """run.resume on env=mix: the run state's sampler position puts every family's sampler where the commit left it
    (iteration 1 of the resumed run trains on the tasks a straight 3-iteration run trains on there)."""
    register_parity()
    common = ["env=mix", "env.families={toolcall: 0.6, parity: {name: loop_parity, weight: 0.4}}",
              "loop.tasks_per_iteration=3", "loop.samples_per_task=2", "loop.eval_tasks=1", "loop.max_staleness=0",
              "policy.warm_start.enabled=false", "sampling.max_new_tokens=8", "reward.constant=zero",
              "farm.num_envs=4", "run.checkpoint_every=1"]
    straight, part = tmp_path / "straight", tmp_path / "part"
    assert asyncio.run(run(compose_launch_config([*common, "loop.iterations=3", f"run.out_dir={straight}"]))) == 0
    assert asyncio.run(run(compose_launch_config([*common, "loop.iterations=1", f"run.out_dir={part}"]))) == 0
    again = [f"run.resume={part}", "loop.iterations=3"]
    monkeypatch.setattr(run_module, "command_line_overrides", lambda: again)  # what Hydra hands a launch
    assert asyncio.run(run(compose_launch_config([*common, *again]))) == 0

    def drawn(out):
        return sorted((e["episode_id"], e["family"], e["task_id"]) for e in read_jsonl(out / "episodes.jsonl")
                      if e["split"] == "train")

    assert drawn(part) == drawn(straight) and {f for _, f, _ in drawn(part)} == {"toolcall", "parity"}
    state = json.loads((part / "run_state.json").read_text())
    assert state["iterations_done"] == 3 and state["resumes"] == 1 and state["sampler_position"] == 9
    train = [r for r in read_jsonl(part / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["iteration"] for r in train] == [0, 1, 2] and all(set(family_values(r)) >= {"toolcall", "parity"}
                                                                  for r in train)


@pytest.mark.slow  # a whole mixed run
def test_per_family_staleness_bounds_on_a_mixed_farm(tmp_path):
    """`fast` may run two versions ahead, `slow` stays on-policy: its part of batch k starts only once batch k-1 is
    trained, so every slow step is sampled by the weights that train on it."""
    register_parity()
    policy, model, tok = tiny_policy_and_model()
    trainer = RecordingTrainer(TorchTrainer(model, TorchTrainerConfig(lr=1e-3, kl_coef=0.0), tok))
    cfg = LoopConfig(iterations=4, tasks_per_iteration=4, samples_per_task=2, eval_tasks=1,
                     max_staleness={"fast": 2, "slow": 0})
    families = [LoopFamily("fast", ParityEnv.tasks(), ParityEnv.tasks()[:1], 1.0),
                LoopFamily("slow", ParityEnv.tasks(), ParityEnv.tasks()[:1], 1.0, {"max_new_tokens": 4})]

    async def main():
        farm = MixFarm({f.name: ("loop_parity", {}, FarmConfig(num_envs=4)) for f in families})
        await farm.start()
        writer = RunWriter(tmp_path)
        try:
            loop = RLLoop(farm=farm, policy=policy, judge=RuleJudge(), trainer=trainer, reward_cfg=RewardConfig(),
                          loop_cfg=cfg, sampling=SamplingParams(max_new_tokens=6), run_id="t", families=families,
                          writer=writer)
            return await loop.run()
        finally:
            writer.close()
            await farm.close()

    summary = asyncio.run(main())
    assert summary.iterations == 4 and set(summary.families) == {"fast", "slow"}
    steps = read_jsonl(tmp_path / "trajectories.jsonl")
    lag = {f: [int(s["episode_id"][2:].split("-")[0]) - s["weight_version"] for s in steps if s["family"] == f]
           for f in ("fast", "slow")}
    assert lag["slow"] and set(lag["slow"]) == {0}
    assert max(lag["fast"]) >= 1 and max(lag["fast"]) <= 2
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    assert all(family_values(r)["slow"]["dropped_stale"] == 0 for r in rows)
    assert {family_values(r)["slow"]["max_staleness"] for r in rows} == {0}
    # the slow family's own sampling budget: at most 4 output tokens per step
    assert max(s["output_tokens"] for s in steps if s["family"] == "slow") <= 4
    assert max(s["output_tokens"] for s in steps if s["family"] == "fast") <= 6


@pytest.mark.parametrize("eval_untrained", [True, False])
def test_a_family_of_weight_0_is_evaluated_unless_loop_eval_untrained_is_off(tmp_path, eval_untrained):
    """loop.eval_untrained=false: only the trained families are evaluated (an untrained family's envs never start);
    by default a family of weight 0 is evaluated too."""
    register_parity()
    policy, model, tok = tiny_policy_and_model()
    trainer = TorchTrainer(model, TorchTrainerConfig(lr=1e-3, kl_coef=0.0), tok)
    cfg = LoopConfig(iterations=1, tasks_per_iteration=2, samples_per_task=2, eval_tasks=2, max_staleness=0,
                     eval_untrained=eval_untrained)
    families = [LoopFamily("trained", ParityEnv.tasks(), ParityEnv.tasks()[:2], 1.0),
                LoopFamily("idle", ParityEnv.tasks(), ParityEnv.tasks()[:2], 0.0)]

    async def main():
        farm = MixFarm({f.name: ("loop_parity", {}, FarmConfig(num_envs=4)) for f in families})
        await farm.start()
        writer = RunWriter(tmp_path)
        try:
            loop = RLLoop(farm=farm, policy=policy, judge=RuleJudge(), trainer=trainer, reward_cfg=RewardConfig(),
                          loop_cfg=cfg, sampling=SamplingParams(max_new_tokens=6), run_id="t", families=families,
                          writer=writer)
            return await loop.run()
        finally:
            writer.close()
            await farm.close()

    asyncio.run(main())
    evals = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "eval"]
    assert len(evals) == 2 and all("family/trained/accuracy" in r for r in evals)
    assert all(("family/idle/accuracy" in r) == eval_untrained for r in evals)
    idle_steps = [s for s in read_jsonl(tmp_path / "eval_trajectories.jsonl") if s["family"] == "idle"]
    assert bool(idle_steps) == eval_untrained
    assert not [s for s in read_jsonl(tmp_path / "trajectories.jsonl") if s["family"] == "idle"]  # never trained


def test_the_dry_run_checks_every_family(tmp_path):
    from rollout.dry_run import check_config

    checks = check_config(compose_launch_config(["env=mix", "env.families={toolcall: 0.5, terminal: 0.5}",
                                                 "farm.families.terminal.max_starting=2"]))
    assert all(c.ok for c in checks), checks
    detail = " ".join(c.detail for c in checks)
    assert "each of the 2 families' envs constructed and closed" in detail
    assert "terminal 16 slots (start cap 2)" in detail
    assert build.MixSetup is type(plan_run(compose_launch_config(["env=mix"])).env)
