"""Process reward models: judges that score each step from its next state."""

from prm.judge import Judge, Judgement, RuleJudge, StepContext

__all__ = ["Judge", "Judgement", "RuleJudge", "StepContext"]
