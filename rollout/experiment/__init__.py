"""Experiments: several arms over paired seeds, each a full launcher run (`core`), their report from the run
directories' files (`report`, also `python -m rollout.experiment_report <experiment dir>`), and resuming one
(`resume`)."""
