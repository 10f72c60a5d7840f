from pathlib import Path

from ledger import Inventory

DATA = Path(__file__).parent / "data"


def test_load_basic_csv():
    inv = Inventory.from_csv(DATA / "basic.csv")
    assert (inv.count("A1"), inv.count("B2"), inv.count("C3")) == (3, 10, 1)
    assert inv.names == {"A1": "Bolt", "B2": "Nut"}


def test_load_quoted_names():
    inv = Inventory.from_csv(DATA / "quoted.csv")
    assert inv.count("W1") == 4
    assert inv.names["W1"] == "Widget, large"
    assert inv.names["W2"] == 'Say "hi"'
