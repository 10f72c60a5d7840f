import pytest

from minicalc import CalcError, evaluate


def test_addition():
    assert evaluate("1 + 2 + 3") == 6


def test_multiplication():
    assert evaluate("2 * 3 * 4") == 24


def test_precedence():
    assert evaluate("2 + 3 * 4") == 14


def test_parentheses():
    assert evaluate("(2 + 3) * 4") == 20


def test_floats():
    assert evaluate("1.5 * 2") == 3.0


def test_power_is_right_associative():
    assert evaluate("2 ^ 3 ^ 2") == 512


def test_power_binds_tighter_than_multiplication():
    assert evaluate("3 * 2 ^ 2") == 12


def test_leading_minus():
    assert evaluate("-3 + 5") == 2


def test_division_by_zero_raises():
    with pytest.raises(CalcError):
        evaluate("1 / 0")


def test_invalid_character_raises():
    with pytest.raises(CalcError):
        evaluate("2 $ 3")


def test_unbalanced_parentheses_raise():
    with pytest.raises(CalcError):
        evaluate("(1 + 2")
