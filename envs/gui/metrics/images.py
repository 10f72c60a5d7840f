"""Image metrics (GIMP's exports, VLC's snapshots), computed with Pillow, NumPy and scikit-image.

OSWorld's semantics: "structure" is SSIM (7-pixel window, channels last) at 0.9 unless said otherwise, or a mean
squared error below 0.03 after normalising brightness; the `_and_structure_sim` checks compare the agent's file (first
argument) with the expected one and also require the named change (darker, more saturated, more contrast...).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _open(path: str | None) -> Any:
    if not path or not Path(path).exists():
        return None
    from PIL import Image

    try:
        img = Image.open(path)
        img.load()
        return img
    except Exception as exc:  # truncated or not an image
        log.info("not a readable image: %s (%s)", path, exc)
        return None


def _ssim(a: Any, b: Any, threshold: float = 0.9, resize: bool = False) -> bool:
    """SSIM of two images (as RGB) is at least `threshold`; different sizes fail unless `resize`."""
    import numpy as np
    from skimage.metrics import structural_similarity

    a, b = a.convert("RGB"), b.convert("RGB")
    if a.size != b.size:
        if not resize:
            return False
        from PIL import Image

        a = a.resize(b.size, Image.Resampling.LANCZOS)
    x, y = np.asarray(a), np.asarray(b)
    side = min(x.shape[0], x.shape[1])
    win = 7 if side >= 7 else (side if side % 2 else side - 1)
    if win < 3 and side < 7:
        return False  # too small for a meaningful SSIM
    return float(structural_similarity(x, y, win_size=win, channel_axis=2)) >= threshold


def _brightness(img: Any) -> float:
    from PIL import ImageStat

    return float(ImageStat.Stat(img.convert("L")).mean[0])


def _normalized(img: Any, target: float = 128.0) -> Any:
    factor = target / max(_brightness(img), 1e-9)
    return img.point(lambda v: min(255, max(0, int(v * factor))))


def _mse_close(a: Any, b: Any, threshold: float = 0.03) -> bool:
    import numpy as np
    from PIL import Image

    if a.size != b.size:
        a = a.resize(b.size, Image.Resampling.LANCZOS)
    x = np.asarray(a.convert("RGB"), dtype=np.float32) / 255
    y = np.asarray(b.convert("RGB"), dtype=np.float32) / 255
    return float(np.mean((x - y) ** 2)) < threshold


def _pair(src: str | None, tgt: str | None) -> tuple[Any, Any] | None:
    a, b = _open(src), _open(tgt)
    return None if a is None or b is None else (a, b)


def check_brightness_decrease_and_structure_sim(result: str | None, expected: str | None,
                                                threshold: float = 0.03) -> float:
    """The result is darker than the expected (original) image and the same picture once brightness is evened."""
    p = _pair(result, expected)
    if p is None:
        return 0.0
    a, b = p
    return float(_brightness(b) > _brightness(a) and _mse_close(_normalized(a), _normalized(b), threshold))


def _mean_saturation(img: Any) -> float:
    import numpy as np

    return float(np.mean(np.asarray(img.convert("HSV").split()[1])))


def check_saturation_increase_and_structure_sim(result: str | None, expected: str | None) -> float:
    """More saturated than the original, with the same hue and value structure."""
    p = _pair(result, expected)
    if p is None:
        return 0.0
    a, b = p
    ha, _, va = a.convert("HSV").split()
    hb, _, vb = b.convert("HSV").split()
    return float(_mean_saturation(a) > _mean_saturation(b) and _ssim(ha, hb) and _ssim(va, vb))


def check_contrast_increase_and_structure_sim(result: str | None, expected: str | None) -> float:
    import numpy as np

    p = _pair(result, expected)
    if p is None:
        return 0.0
    a, b = p
    more = float(np.std(np.asarray(a, dtype=np.float32))) > float(np.std(np.asarray(b, dtype=np.float32)))
    return float(more and _ssim(a, b, 0.65))


def check_file_exists_and_structure_sim(result: str | None, expected: str | None) -> float:
    p = _pair(result, expected)
    return float(p is not None and _ssim(*p))


def check_structure_sim(result: str | None, expected: str | None) -> float:
    p = _pair(result, expected)
    return float(p is not None and p[0].size == p[1].size and _ssim(*p))


def check_structure_sim_with_threshold(result: str | None, expected: str | None, **options: Any) -> float:
    p = _pair(result, expected)
    return float(p is not None and _ssim(*p, threshold=options.get("ssim_threshold", 0.85), resize=True))


def _content(img: Any) -> Any:
    """The image cropped to its non-transparent pixels (None when it is fully transparent)."""
    rgba = img.convert("RGBA")
    box = rgba.split()[-1].getbbox()
    return None if box is None else rgba.crop(box)


def _has_alpha(img: Any) -> bool:
    return img.mode in ("RGBA", "LA") or "transparency" in img.info


def check_structure_sim_resized(result: str | None, expected: str | None) -> float:
    """The result's content (transparent margins cropped), scaled to the expected size, has the same structure."""
    p = _pair(result, expected)
    if p is None:
        return 0.0
    a, b = p
    if _has_alpha(a):
        a = _content(a)
        if a is None:
            return 0.0
    return float(_ssim(a.convert("RGB").resize(b.size), b))


def check_palette_and_structure_sim(result: str | None, expected: str | None) -> float:
    """The result is a palette (indexed) image with the expected picture."""
    p = _pair(result, expected)
    return float(p is not None and p[0].mode == "P" and _ssim(p[0], p[1]))


def check_image_mirror(result: str | None, expected: str | None) -> float:
    """The result is the original flipped left to right (SSIM 0.99)."""
    from PIL import Image

    p = _pair(result, expected)
    return float(p is not None and _ssim(p[0].transpose(Image.Transpose.FLIP_LEFT_RIGHT), p[1], 0.99))


def check_green_background(result: str | None, expected: str | None) -> float:
    """Wherever the expected mask is not black, the result's pixel is green-dominant."""
    import numpy as np

    p = _pair(result, expected)
    if p is None:
        return 0.0
    src, mask = (np.asarray(i.convert("RGB")).astype(int) for i in p)
    if src.shape != mask.shape:
        return 0.0
    where = mask.any(axis=2)
    r, g, b = src[..., 0][where], src[..., 1][where], src[..., 2][where]
    return float(bool(np.all((g > r) & (g > b))))


def check_triangle_position(result: str | None) -> float:
    """The second most common colour (the triangle) has its centroid within 5% of the image's centre."""
    import numpy as np

    img = _open(result)
    if img is None:
        return 0.0
    arr = np.asarray(img)
    if arr.ndim != 3:
        return 0.0
    colors, counts = np.unique(arr.reshape(-1, arr.shape[2]), axis=0, return_counts=True)
    if len(colors) < 2:
        return 0.0
    shape_color = colors[np.argsort(counts)][1]
    coords = np.argwhere(np.all(arr == shape_color, axis=2))
    dims = np.array(arr.shape[:2])
    return float(bool(np.all(np.abs(coords.mean(axis=0) - dims / 2) < 0.05 * dims)))


def check_textbox_on_leftside(result: str | None) -> float:
    """Some dark pixel (< 128 grey) lies in the leftmost 5% of the image."""
    import numpy as np

    img = _open(result)
    if img is None:
        return 0.0
    dark = np.asarray(img.convert("L")) < 128
    cols = np.where(dark.any(axis=0))[0]
    return float(len(cols) > 0 and cols[0] < img.size[0] * 0.05)


def check_image_size(result: str | None, rules: dict[str, Any]) -> float:
    """The image (its visible content with `ignore_transparent`) has the given `width` and/or `height`."""
    img = _open(result)
    if img is None:
        return 0.0
    w, h = img.size
    if (rules.get("ignore_transparent", False) and img.mode in ("RGBA", "LA")) or "transparency" in img.info:
        content = _content(img)
        w, h = (0, 0) if content is None else content.size
    return float(rules.get("width") in (None, w) and rules.get("height") in (None, h))


def check_image_file_size(result: str | None, rules: dict[str, Any]) -> float:
    return float(bool(result) and Path(result).exists() and Path(result).stat().st_size < rules["max_size"])


def check_config_status(result: str | None, rules: dict[str, Any]) -> float:
    """A GIMP config file (gimprc, sessionrc: `(key ... value)` lines) has the key (or key pair) with the value."""
    if not result or not Path(result).exists():
        return 0.0
    key, value = rules["key"], rules["value"]
    for line in Path(result).read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        items = line.strip().lstrip("(").rstrip(")").split()
        if not items or items[-1] != value:
            continue
        if isinstance(key, str) and items[0] == key:
            return 1.0
        if isinstance(key, list) and len(key) == 2 and items[:2] == key:
            return 1.0
    return 0.0


def compare_image_list(result: str | list[str] | None, expected: str | list[str] | None) -> float:
    """Every image equals its expected one pixel for pixel (after resizing and converting to its size and mode)."""
    from PIL import Image, ImageChops

    results = result if isinstance(result, list) else [result]
    wanted = expected if isinstance(expected, list) else [expected]
    for r, e in zip(results, wanted):
        p = _pair(r, e)
        if p is None:
            return 0.0
        a, b = p
        if a.size != b.size:
            a = a.resize(b.size, Image.Resampling.LANCZOS)
        if a.mode != b.mode:
            a = a.convert(b.mode)
        if ImageChops.difference(a, b).getbbox():
            return 0.0
    return 1.0


def compare_images(result: str | None, expected: str | None, **options: Any) -> float:
    """Greyscale SSIM of the two images at the smaller size; with `reference_base_result` b, only the gain over b
    counts: (s - b) / (1 - b) when s >= b + 0.01, else 0."""
    import numpy as np
    from PIL import Image
    from skimage.metrics import structural_similarity

    p = _pair(result, expected)
    if p is None:
        return 0.0
    a, b = (i.convert("L") for i in p)
    size = min(a.size, b.size)
    x = np.asarray(a.resize(size, Image.Resampling.LANCZOS))
    y = np.asarray(b.resize(size, Image.Resampling.LANCZOS))
    s = float(structural_similarity(x, y))
    base = options.get("reference_base_result")
    if base is None:
        return s
    return (s - base) / (1 - base) if s >= base + 0.01 else 0.0


METRICS = {
    f.__name__: f
    for f in (
        check_brightness_decrease_and_structure_sim, check_saturation_increase_and_structure_sim,
        check_contrast_increase_and_structure_sim, check_file_exists_and_structure_sim, check_structure_sim,
        check_structure_sim_with_threshold, check_structure_sim_resized, check_palette_and_structure_sim,
        check_image_mirror, check_green_background, check_triangle_position, check_textbox_on_leftside,
        check_image_size, check_image_file_size, check_config_status, compare_image_list, compare_images,
    )
}
