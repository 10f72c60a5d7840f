import pytest

from ledger import InsufficientStock, Inventory


def test_add_and_remove():
    inv = Inventory()
    inv.add("A1", 5, name="Bolt")
    inv.remove("A1", 2)
    assert inv.count("A1") == 3
    assert inv.names["A1"] == "Bolt"


def test_remove_unknown_sku_raises():
    with pytest.raises(KeyError):
        Inventory().remove("nope", 1)


@pytest.mark.parametrize("qty", [0, -3])
def test_add_rejects_non_positive(qty):
    with pytest.raises(ValueError):
        Inventory().add("A1", qty)


def test_total_value():
    inv = Inventory()
    inv.add("A1", 2)
    inv.add("B2", 3)
    assert inv.total_value({"A1": 1.5, "B2": 10}) == 33


def test_remove_more_than_stock_raises():
    inv = Inventory()
    inv.add("A1", 2)
    with pytest.raises(InsufficientStock):
        inv.remove("A1", 5)


def test_failed_remove_keeps_stock():
    inv = Inventory()
    inv.add("A1", 2)
    try:
        inv.remove("A1", 3)
    except InsufficientStock:
        pass
    assert inv.count("A1") == 2
    inv.remove("A1", 2)
    assert inv.count("A1") == 0
