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


def test_equal_versions():
    assert parse("1.0.0") == parse("v1.0.0")


def test_build_metadata_is_ignored_in_comparisons():
    assert parse("1.0.0+linux") == parse("1.0.0+mac")


def test_patch_ordering():
    assert parse("1.0.1") > parse("1.0.0")
    assert parse("2.0.0") > parse("1.9.9")


def test_numbers_are_integers():
    v = parse("1.20.3")
    assert (v.major, v.minor, v.patch) == (1, 20, 3)


def test_numeric_ordering():
    assert parse("1.10.0") > parse("1.9.0")
    assert parse("0.0.10") > parse("0.0.9")
    texts = ["1.10.0", "1.2.0", "1.9.0", "10.0.0", "2.0.0"]
    assert [str(v) for v in sorted(map(parse, texts))] == ["1.2.0", "1.9.0", "1.10.0", "2.0.0", "10.0.0"]
