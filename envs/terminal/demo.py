"""`demonstration` callable on an env class (a default-configured env is built, used and closed) or on an instance."""

from __future__ import annotations

import functools
from typing import Any


class class_or_instance:
    def __init__(self, func):
        self.func = func
        functools.update_wrapper(self, func)

    def __get__(self, obj: Any, cls: type):
        if obj is not None:
            return functools.partial(self.func, obj)

        @functools.wraps(self.func)
        def on_a_fresh_env(*args: Any, **kwargs: Any):
            env = cls()
            try:
                return self.func(env, *args, **kwargs)
            finally:
                env.close()

        return on_a_fresh_env
