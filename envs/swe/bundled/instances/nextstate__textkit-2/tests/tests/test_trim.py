import pytest

from textkit import truncate


def test_short_text_is_unchanged():
    assert truncate("hello", 10) == "hello"


def test_keeps_short_text_verbatim():
    assert truncate("  a  b  ", 8) == "  a  b  "


def test_negative_width_is_rejected():
    with pytest.raises(ValueError):
        truncate("hello", -1)


def test_result_fits_the_width():
    assert truncate("abcdefghij", 8) == "abcde..."
    assert len(truncate("x" * 100, 10)) == 10


def test_width_smaller_than_suffix():
    assert truncate("abcdef", 2) == ".."
    assert truncate("abcdef", 0) == ""
