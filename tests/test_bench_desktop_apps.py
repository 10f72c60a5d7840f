"""benchmarks/desktop.py's app arms: the files they open are real documents, the tasks load, memory is read right.

The measurements themselves are the benchmark's (docs/benchmarks/desktop_apps.json); this checks its inputs.
"""

from __future__ import annotations

import os

import pytest

from benchmarks.desktop import APPS, app_task, make_app_files, smaps_kib
from envs.gui.tasks import validate_task


def test_the_generated_files_are_what_the_apps_open(tmp_path):
    import openpyxl
    from docx import Document
    from PIL import Image
    from pptx import Presentation

    files = make_app_files(tmp_path)
    assert set(files) == {a for a, spec in APPS.items() if spec["file"]}
    sheet = openpyxl.load_workbook(files["calc"]).active
    assert sheet["A1"].value == "Region" and sheet["F2"].value == "=SUM(B2:E2)" and sheet.max_row == 41
    assert Document(str(files["writer"])).paragraphs[0].text == "Quarterly report"
    assert len(Presentation(str(files["impress"])).slides) == 5
    assert Image.open(files["gimp"]).size == (800, 600)
    head = files["vlc"].read_bytes()[:64]
    assert head.startswith(b"YUV4MPEG2 W320 H240 F25:1") and files["vlc"].stat().st_size == len(
        b"YUV4MPEG2 W320 H240 F25:1 Ip A1:1 C420jpeg\n") + 100 * (6 + 320 * 240 * 3 // 2)
    assert "<title>Benchmark page</title>" in files["chromium"].read_text()


@pytest.mark.parametrize("app", list(APPS))
def test_each_app_task_loads_and_opens_its_file(app, tmp_path):
    files = make_app_files(tmp_path)
    task = validate_task(app_task(app, files))
    launch = task["config"][-1]
    assert launch["type"] == "launch" and launch["parameters"]["command"][0] == APPS[app]["command"][0]
    if APPS[app]["file"]:
        download = task["config"][0]["parameters"]["files"][0]
        assert download["url"] == files[app].as_uri() and launch["parameters"]["command"][-1] == download["path"]
    assert task["nextstate"]["ready"]["window"] == APPS[app]["window"]


def test_smaps_reads_this_process():
    m = smaps_kib(os.getpid())
    assert 0 < m["uss"] <= m["pss"] <= m["rss"]
    assert smaps_kib(2**22 + 12345) == {"pss": 0, "uss": 0, "rss": 0}  # no such process: zeros
