"""Whether an eval log shows tests that failed for want of the network (every sandbox here is offline).

SWE-bench's own harness runs the tests in containers that reach the internet, and some instances' tests need it
(requests' against httpbin.org, say). Offline, no patch can make those pass: such a task must be refused or flagged,
never scored as the policy's failure. The signatures are the errors Python's socket and HTTP stacks raise when a host
name cannot be resolved or an outside host cannot be reached; a refused connection to the loopback is left out (tests
start local servers on purpose).
"""

from __future__ import annotations

import re

from envs.swe.grading import END_MARK, START_MARK

SIGNATURES = (
    r"socket\.gaierror",
    r"gaierror: \[Errno -[235]\]",
    r"Temporary failure in name resolution",
    r"Name or service not known",
    r"No address associated with hostname",
    r"nodename nor servname provided",
    r"Failed to resolve '[^']+'",
    r"NameResolutionError",
    r"Failed to establish a new connection: \[Errno -?\d+\] "
    r"(?:Network is unreachable|Temporary failure|Name or service)",
    r"\[Errno 101\] Network is unreachable",
    r"urlopen error \[Errno -[235]\]",
    r"Could not resolve host",
)
_PATTERN = re.compile("|".join(f"(?:{s})" for s in SIGNATURES))
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def network_failure(log_text: str) -> str | None:
    """The first line of the tests' output in `log_text` (between swebench's start and end markers when it has them:
    an install step's retries are not the tests') that shows a network failure (stripped, at most 200 characters),
    or None."""
    text = _ANSI.sub("", log_text)  # test runners color their output
    start, end = text.find(START_MARK), text.rfind(END_MARK)
    if 0 <= start < end:
        text = text[start:end]
    m = _PATTERN.search(text)
    if m is None:
        return None
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.end())
    return text[start : end if end >= 0 else len(text)].strip()[:200]
