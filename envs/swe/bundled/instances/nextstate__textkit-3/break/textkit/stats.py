import re
from collections import Counter

_WORD = re.compile(r"[a-z0-9']+")


def word_frequencies(text):
    """How often each word occurs in `text`, ignoring case and punctuation."""
    return Counter(_WORD.findall(text.lower()))


def top_words(text, n):
    """The `n` most frequent words, most frequent first; ties in alphabetical order."""
    counts = word_frequencies(text)
    ranked = sorted(counts.items(), key=lambda item: -item[1])
    return [word for word, _ in ranked[:n]]
