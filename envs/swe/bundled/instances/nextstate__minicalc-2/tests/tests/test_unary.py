import pytest

from minicalc import CalcError, evaluate


@pytest.mark.parametrize(
    "text, expected",
    [("2*-3", -6), ("-(1+2)", -3), ("--4", 4), ("-2^2", -4), ("2^-1", 0.5)],
)
def test_unary_minus(text, expected):
    assert evaluate(text) == expected


def test_lone_minus_is_an_error():
    with pytest.raises(CalcError):
        evaluate("-")
