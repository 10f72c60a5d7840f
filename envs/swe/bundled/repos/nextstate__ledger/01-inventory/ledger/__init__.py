"""ledger: stock counts for a small shop."""

from ledger.inventory import InsufficientStock, Inventory

__all__ = ["InsufficientStock", "Inventory"]
