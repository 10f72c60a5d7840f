"""minicalc: a tiny arithmetic expression evaluator."""

from minicalc.errors import CalcError
from minicalc.parser import evaluate

__all__ = ["CalcError", "evaluate"]
