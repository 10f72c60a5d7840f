"""`python -m rollout.experiment_report <experiment dir>`: the kept command name of the experiment report, which lives
in rollout/experiment/report.py (`python -m rollout.experiment.report` is the same command)."""

from rollout.experiment.report import main

if __name__ == "__main__":
    raise SystemExit(main())
