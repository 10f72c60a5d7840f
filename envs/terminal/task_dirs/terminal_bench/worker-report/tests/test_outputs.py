import os
from pathlib import Path

REPORT = Path("/home/worker/report.txt")


def test_report_lists_urgent_files():
    assert REPORT.read_text().split() == ["b.txt", "d.txt"]


def test_report_owned_by_worker():
    import pwd

    assert pwd.getpwuid(os.stat(REPORT).st_uid).pw_name == "worker"
