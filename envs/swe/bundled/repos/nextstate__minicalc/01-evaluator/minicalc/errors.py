class CalcError(ValueError):
    """The expression is malformed or cannot be evaluated."""
