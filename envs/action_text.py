"""Reading an agent's text safely: what a process or file cannot receive, JSON with its size limits, printable output.

Everything here is pure and cheap; envs call it before anything runs, so a hostile action becomes a parse error that
says what is wrong instead of an exception somewhere below (subprocess, a socket, a JSON writer).
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

_SURROGATES = re.compile("[\ud800-\udfff]")


def unencodable(text: str) -> str | None:
    """Why `text` cannot be a process argument or file content, or None: "contains a NUL byte (character i)" or "is not
    valid Unicode text: ... lone surrogate ..." (text decoded from JSON escapes such as "\\u0000" can hold both)."""
    nul = text.find("\0")
    if nul >= 0:
        return f"contains a NUL byte (character {nul})"
    return not_utf8(text)


def not_utf8(text: str) -> str | None:
    """Why `text` cannot be encoded as UTF-8 (a lone surrogate, and where), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        i = exc.start
        return (
            f"is not valid Unicode text: character {i} is a lone surrogate (U+{ord(text[i]):04X}), "
            "which cannot be encoded as UTF-8"
        )
    return None


def printable_text(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD, so an observation can be encoded (records, sockets, judges)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATES.sub("\ufffd", text)


def loads_json(text: str, *, strict: bool = True) -> Any:
    """json.loads(text), raising json.JSONDecodeError (syntax) or ValueError (a size limit), nothing else.

    json.loads fails in three ways, not one: a syntax error, an integer of more digits than Python converts (a plain
    ValueError) and nesting deeper than the interpreter's stack (RecursionError). The last two get messages an agent can
    act on, so a parser needs one `except ValueError` after its `except json.JSONDecodeError`."""
    try:
        return json.loads(text, strict=strict)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise ValueError("it nests arrays or objects too deeply") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            raise ValueError(f"it holds an integer of more than {sys.get_int_max_str_digits()} digits") from None
        raise
