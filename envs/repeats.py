"""Warnings that can repeat thousands of times in a run (one per policy call, per env step, ...): said once, then counted.

`RepeatedWarning(log, counted_in)` logs its first warning in full at WARNING, saying that the ones after it are only
counted and where that count is reported (`counted_in`: a metrics key, the run summary); the later ones go to DEBUG
(`log_level=DEBUG` shows them all). It keeps `count` and the `largest` size passed (e.g. the longest prompt), for its
owner to report. It lives in the lowest layer so that every layer can use it; it is thread-safe.
"""

from __future__ import annotations

import logging
import threading


class RepeatedWarning:
    """One kind of warning: logged the first time, counted every time."""

    def __init__(self, logger: logging.Logger, counted_in: str):
        self.logger = logger
        self.counted_in = counted_in
        self.count = 0
        self.largest: float | None = None
        self._lock = threading.Lock()

    def warn(self, msg: str, *args: object, size: float | None = None) -> bool:
        """Count one occurrence (and its `size`); log it at WARNING if it is the first, else at DEBUG. True when it was
        logged at WARNING."""
        with self._lock:
            self.count += 1
            first = self.count == 1
            if size is not None and (self.largest is None or size > self.largest):
                self.largest = size
        if first:
            self.logger.warning(msg + " (further ones are not logged, only counted: %s)", *args, self.counted_in)
        else:
            self.logger.debug(msg, *args)
        return first


__all__ = ["RepeatedWarning"]
