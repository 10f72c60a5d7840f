class InsufficientStock(Exception):
    """A removal asked for more units than are in stock."""


class Inventory:
    def __init__(self):
        self._stock = {}
        self.names = {}

    def add(self, sku, qty, name=None):
        if qty <= 0:
            raise ValueError("quantity must be positive")
        self._stock[sku] = self._stock.get(sku, 0) + qty
        if name is not None:
            self.names[sku] = name

    def remove(self, sku, qty):
        if qty <= 0:
            raise ValueError("quantity must be positive")
        if sku not in self._stock:
            raise KeyError(sku)
        self._stock[sku] -= qty

    def count(self, sku):
        return self._stock.get(sku, 0)

    def total_value(self, prices):
        """Sum of count * price over every SKU in stock; `prices` maps SKU to unit price."""
        return sum(qty * prices[sku] for sku, qty in self._stock.items())
