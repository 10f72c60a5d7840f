import pytest

from semverlite import InvalidVersion, parse


def test_roundtrip():
    assert str(parse("1.2.3-rc.1+build.5")) == "1.2.3-rc.1+build.5"


def test_accepts_v_prefix():
    assert str(parse("v0.9.1")) == "0.9.1"


@pytest.mark.parametrize("text", ["1.2", "1.2.3.4", "a.b.c", "", "1.2.3-"])
def test_invalid_versions_raise(text):
    with pytest.raises(InvalidVersion):
        parse(text)
