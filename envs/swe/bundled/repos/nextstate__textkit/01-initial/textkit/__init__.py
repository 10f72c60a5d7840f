"""textkit: small text helpers."""

from textkit.slug import slugify
from textkit.trim import truncate

__all__ = ["slugify", "truncate"]
