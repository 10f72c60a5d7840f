from pathlib import Path


def test_revenue():
    assert Path("/app/revenue.txt").read_text().strip() == "380.00"


def test_best_region():
    assert Path("/app/best_region.txt").read_text().strip() == "south"

