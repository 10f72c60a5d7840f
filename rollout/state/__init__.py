"""What a run has committed and how it continues: `run_state` (run_state.json, written atomically), `checkpoint`
(commits: trainer checkpoint + RNG states, then the run state) and `resume` (`run.resume=<dir>`: the run's config,
its records after the last commit set aside)."""
