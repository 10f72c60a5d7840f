"""The libreoffice_calc tasks' workbooks (xlsx, openpyxl): each task's input and, where its check compares books, the
expected result. Values are the numbers a person would type; expected books hold the values LibreOffice computes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envs.gui.app_files._zip import save_reproducible

DOMAIN = "libreoffice_calc"

# ns-libreoffice_calc-fill-totals: Total = Qty x Price per row
SALES_HEADER = ["Item", "Qty", "Price", "Total"]
SALES = [("Apples", 12, 0.5), ("Bananas", 30, 0.25), ("Cherries", 8, 3), ("Dates", 5, 4.5), ("Figs", 9, 1.5),
         ("Grapes", 14, 2)]

# ns-libreoffice_calc-sum-row: a Total row under the monthly columns
STOCK_HEADER = ["Warehouse", "Jan", "Feb", "Mar"]
STOCK = [("North", 120, 95, 130), ("South", 80, 110, 75), ("East", 64, 72, 90), ("West", 150, 140, 160),
         ("Central", 45, 60, 52)]

# ns-libreoffice_calc-bold-header and -two-decimals: formatting only
GRADES_HEADER = ["Student", "Maths", "Physics", "History"]
GRADES = [("Ana", 81, 74, 90), ("Ben", 67, 88, 72), ("Chen", 93, 91, 85), ("Dora", 58, 63, 77), ("Eli", 75, 80, 69)]
PRICES_HEADER = ["Product", "Units", "Unit price", "Discount"]
PRICES = [("Desk", 4, 149.5, 0.1), ("Chair", 12, 45.25, 0.05), ("Lamp", 7, 19.9, 0), ("Shelf", 3, 89, 0.15),
          ("Rug", 2, 120.75, 0.2), ("Clock", 9, 24.4, 0)]


def _book(title: str, header: list[str], rows: list[tuple[Any, ...]]) -> Any:
    import openpyxl

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = title
    ws.append(header)
    for row in rows:
        ws.append(list(row))
    wb.properties.creator = "NextState"
    return wb



def build(out: Path) -> None:
    d = out / DOMAIN
    save_reproducible(_book("Sales", SALES_HEADER, SALES), d / "sales.xlsx")
    save_reproducible(_book("Sales", SALES_HEADER, [(*r, r[1] * r[2]) for r in SALES]), d / "sales_expected.xlsx")

    save_reproducible(_book("Stock", STOCK_HEADER, STOCK), d / "stock.xlsx")
    totals = ("Total", *(sum(r[i] for r in STOCK) for i in (1, 2, 3)))
    save_reproducible(_book("Stock", STOCK_HEADER, [*STOCK, totals]), d / "stock_expected.xlsx")

    save_reproducible(_book("Grades", GRADES_HEADER, GRADES), d / "grades.xlsx")
    save_reproducible(_book("Prices", PRICES_HEADER, PRICES), d / "prices.xlsx")
