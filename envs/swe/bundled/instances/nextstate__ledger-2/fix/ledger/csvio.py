import csv


def read_rows(path):
    """The rows of the CSV file at `path` as dicts keyed by its header; blank lines are skipped."""
    with open(path, encoding="utf-8", newline="") as f:
        return [row for row in csv.DictReader(f) if any((value or "").strip() for value in row.values())]
