"""The CI-sized Table 4 tool-call experiment: the overrides tests/test_table4_experiments.py launches, and
benchmarks/kill_experiment.py kills at random moments (both need the same experiment: 2 workers, a tuning stage, an
SFT start)."""

TOOLCALL_SMOKE = [
    "experiment=table4_toolcall", "experiment.seeds=[1,2]", "experiment.workers=2",
    "experiment.arms.dense_integrated=null", "experiment.arms.dense_outcome_only=null",
    "loop.iterations=2", "loop.tasks_per_iteration=3", "loop.samples_per_task=3", "loop.eval_tasks=6",
    "loop.eval_every=1", "policy.warm_start.max_conversations=40", "policy.warm_start.sft.epochs=1",
    "policy.warm_start.stages.0.max_conversations=20", "policy.warm_start.stages.0.offset=40",
    "sampling.max_new_tokens=24", "env.max_steps=4", "farm.num_envs=16",
    # the learning-rate tuning stage, shrunk: two values, one tuning seed, one iteration
    "experiment.tune={arm: outcome_only, key: trainer.lr, values: [1.0e-4, 1.0e-3], seeds: [101], min_gain: 0.02, "
    "overrides: ['loop.iterations=1']}",
]
