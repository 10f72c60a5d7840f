"""Byte-for-byte reproducible office files: the format libraries stamp zip members and the document's own
creation / modification dates (openpyxl: at save) with the current time."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Any

EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip member can carry
FIXED_DATE = b"2024-01-01T00:00:00Z"
# OOXML's docProps/core.xml (dcterms:created / modified) and ODF's meta.xml (meta:creation-date, dc:date)
DATES = re.compile(rb"(<(dcterms:created|dcterms:modified|meta:creation-date|dc:date)\b[^>]*>)[^<]*(</\2>)")


def normalize_zip(path: Path) -> None:
    """Rewrite the zip at `path` with every member dated EPOCH and the document's dates FIXED_DATE, in the same order
    and with the same compression (an ODF file's uncompressed `mimetype` stays first)."""
    with zipfile.ZipFile(path) as z:
        members = [(info, z.read(info)) for info in z.infolist()]
    members = [(info, DATES.sub(rb"\g<1>" + FIXED_DATE + rb"\g<3>", data)
                if info.filename in ("docProps/core.xml", "meta.xml") else data) for info, data in members]
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w") as z:
        for info, data in members:
            fixed = zipfile.ZipInfo(info.filename, date_time=EPOCH)
            fixed.compress_type = info.compress_type
            fixed.external_attr = info.external_attr
            z.writestr(fixed, data)
    tmp.replace(path)


def save_reproducible(document: Any, path: Path) -> None:
    """Save an openpyxl workbook, python-docx document or python-pptx deck at `path` (its folder made), then make its
    bytes reproducible (normalize_zip)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document.save(path)
    normalize_zip(path)
