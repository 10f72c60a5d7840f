def truncate(text, width, suffix="..."):
    """Shorten `text` to at most `width` characters, ending with `suffix` when something was cut."""
    if width < 0:
        raise ValueError("width must be >= 0")
    text = text.strip()
    if len(text) <= width:
        return text
    if width <= len(suffix):
        return suffix[:width]
    return text[: width - len(suffix)] + suffix
