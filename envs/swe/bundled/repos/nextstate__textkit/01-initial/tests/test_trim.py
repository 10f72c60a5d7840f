import pytest

from textkit import truncate


def test_short_text_is_unchanged():
    assert truncate("hello", 10) == "hello"


def test_keeps_short_text_verbatim():
    assert truncate("  a  b  ", 8) == "  a  b  "


def test_negative_width_is_rejected():
    with pytest.raises(ValueError):
        truncate("hello", -1)
