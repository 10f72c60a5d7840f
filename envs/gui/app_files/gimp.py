"""The gimp tasks' images: two small pictures drawn with Pillow (`out/gimp/*.png`).

Each picture is asymmetric (a mirrored copy differs from it), has smooth gradients and flat shapes (a palette
conversion keeps its structure) and mid-range brightness (it can get darker or brighter). The originals are also what
the metrics compare the agent's exports with (mirror, darker, same structure), so no expected file is needed.
"""

from __future__ import annotations

from pathlib import Path

SIZE = (320, 240)


def _harbour() -> "Image.Image":  # noqa: F821 - Pillow is imported lazily
    """A sky gradient, a sun on the left, a hill on the right, a boat and its mast on the left."""
    from PIL import Image, ImageDraw

    w, h = SIZE
    img = Image.new("RGB", SIZE)
    draw = ImageDraw.Draw(img)
    for y in range(h):  # sky to sea: light blue fading to deep blue
        t = y / (h - 1)
        draw.line([(0, y), (w, y)], fill=(int(120 + 60 * (1 - t)), int(170 + 40 * (1 - t)), int(230 - 90 * t)))
    draw.ellipse([30, 20, 90, 80], fill=(250, 210, 60))
    draw.polygon([(170, 150), (260, 70), (320, 110), (320, 150)], fill=(60, 140, 70))
    draw.rectangle([0, 150, w, h], fill=(30, 80, 140))
    draw.polygon([(40, 175), (150, 175), (130, 200), (60, 200)], fill=(120, 60, 30))
    draw.line([(95, 175), (95, 110)], fill=(40, 30, 20), width=4)
    draw.polygon([(98, 112), (98, 170), (140, 170)], fill=(240, 240, 230))
    return img


def _lighthouse() -> "Image.Image":  # noqa: F821
    """An evening sky, a striped lighthouse on the right, rocks on the left, a beam of light."""
    from PIL import Image, ImageDraw

    w, h = SIZE
    img = Image.new("RGB", SIZE)
    draw = ImageDraw.Draw(img)
    for y in range(h):  # orange evening sky to violet
        t = y / (h - 1)
        draw.line([(0, y), (w, y)], fill=(int(240 - 110 * t), int(150 - 70 * t), int(90 + 80 * t)))
    draw.polygon([(0, 240), (0, 170), (50, 150), (110, 180), (140, 240)], fill=(70, 60, 60))
    for i, y in enumerate(range(90, 210, 20)):  # the tower, red and white bands
        draw.rectangle([230, y, 262, y + 20], fill=(200, 40, 40) if i % 2 == 0 else (245, 245, 245))
    draw.polygon([(226, 90), (246, 62), (266, 90)], fill=(40, 40, 50))
    draw.polygon([(246, 76), (120, 40), (120, 100)], fill=(255, 240, 170))
    draw.rectangle([0, 210, w, h], fill=(40, 60, 110))
    return img


IMAGES = {"harbour.png": _harbour, "lighthouse.png": _lighthouse}


def build(out: Path) -> None:
    d = out / "gimp"
    d.mkdir(parents=True, exist_ok=True)
    for name, draw in IMAGES.items():
        draw().save(d / name, format="PNG", optimize=False)  # Pillow writes no timestamp: the same bytes every time
