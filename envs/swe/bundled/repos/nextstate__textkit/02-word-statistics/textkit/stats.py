from collections import Counter


def word_frequencies(text):
    """How often each word occurs in `text`, ignoring case and punctuation."""
    return Counter(text.split())


def top_words(text, n):
    """The `n` most frequent words, most frequent first; ties in alphabetical order."""
    counts = word_frequencies(text)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [word for word, _ in ranked[:n]]
