"""textkit: small text helpers."""

from textkit.slug import slugify
from textkit.stats import top_words, word_frequencies
from textkit.trim import truncate

__all__ = ["slugify", "top_words", "truncate", "word_frequencies"]
