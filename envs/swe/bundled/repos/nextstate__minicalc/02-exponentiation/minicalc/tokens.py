import re

from minicalc.errors import CalcError

OPERATORS = "+-*/^()"
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def tokenize(text):
    """Split `text` into numbers (int or float) and operator characters."""
    tokens = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        match = _NUMBER.match(text, i)
        if match:
            literal = match.group()
            tokens.append(float(literal) if "." in literal else int(literal))
            i = match.end()
            continue
        if ch in OPERATORS:
            tokens.append(ch)
            i += 1
            continue
        raise CalcError(f"invalid character {ch!r} at position {i}")
    return tokens
