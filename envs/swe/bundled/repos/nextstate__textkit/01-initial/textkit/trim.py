def truncate(text, width, suffix="..."):
    """Shorten `text` to at most `width` characters, ending with `suffix` when something was cut."""
    if width < 0:
        raise ValueError("width must be >= 0")
    if len(text) <= width:
        return text
    return text[:width] + suffix
