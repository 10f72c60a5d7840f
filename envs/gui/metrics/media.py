"""VLC metrics: its playing status (the web interface's status.xml), its settings file (vlcrc), audio and video.

vlcrc lists every option, the unchanged ones commented out with their default value (`#qt-bgcone=1`), so a setting
is read from the last line naming it, commented or not, as OSWorld does. Audio and video comparisons need decoders:
librosa (audio) and OpenCV (video); where one is not installed the metric fails with a one-line reason.
"""

from __future__ import annotations

import logging
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

log = logging.getLogger(__name__)

FILE_KEYS = ("filename", "title", "uri", "location", "name")
URL_KEYS = ("url", "URI", "location", "title", "filename")


def _meta(tree: ET.Element, keys: tuple[str, ...]) -> str | None:
    for k in keys:
        el = tree.find(f'information/category[@name="meta"]/info[@name="{k}"]')
        if el is not None and el.text:
            return el.text
    return None


def is_vlc_playing(result: str | None, rules: dict[str, Any]) -> float:
    """VLC is playing, and what it plays is the expected file name (`type: file_name`) or URL (`type: url`)."""
    if not result or not Path(result).exists():
        return 0.0
    try:
        tree = ET.fromstring(Path(result).read_bytes())
    except ET.ParseError:
        return 0.0
    if tree.findtext("state") != "playing":
        return 0.0
    if rules.get("type") == "file_name":
        info, want = _meta(tree, FILE_KEYS), rules["file_name"]
        return float(bool(info) and (os.path.basename(info) == want or info.endswith(want)))
    if rules.get("type") == "url":
        info, want = _meta(tree, URL_KEYS), rules["url"]
        if not info:
            return 0.0
        if want in info:
            return 1.0
        exp = urlparse(want)
        if info == os.path.basename(exp.path):
            return 1.0
        got = urlparse(info) if "://" in info else None
        return float(got is not None and got.netloc == exp.netloc and exp.path in got.path)
    return 0.0


def vlcrc_value(path: str | None, key: str, default: str) -> str | None:
    """The value of `key` in a vlcrc (the last line with `key=`, commented or not); None if there is no file."""
    if not path or not Path(path).exists():
        return None
    value = default
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        if f"{key}=" in line:
            value = line.split("=")[-1].strip()
    return value


def is_vlc_recordings_folder(result: str | None, rules: dict[str, Any]) -> float:
    """The (uncommented) `input-record-path` is the expected folder."""
    if not result or not Path(result).exists():
        return 0.0
    for line in Path(result).read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if "input-record-path" in line:
            return float(line.split("=")[-1].strip() == rules["recording_file_path"])
    return 0.0


def is_vlc_fullscreen(window_size: dict[str, int] | None, screen_size: dict[str, int] | None) -> float:
    if not window_size or not screen_size:
        return 0.0
    return float(window_size["width"] == screen_size["width"] and window_size["height"] == screen_size["height"])


def _setting(key: str, default: str, rule_key: str):  # noqa: ANN202 - a metric factory
    def metric(result: str | None, rules: dict[str, Any]) -> float:
        got = vlcrc_value(result, key, default)
        return float(got is not None and got == str(rules[rule_key]))

    return metric


check_qt_bgcone = _setting("qt-bgcone", "1", "expected_qt_bgcone")
check_qt_max_volume = _setting("qt-max-volume", "125", "expected_qt_max_volume")
check_qt_minimal_view = _setting("qt-minimal-view", "0", "expected_qt_minimal_view")
check_one_instance_when_started_from_file = _setting(
    "one-instance-when-started-from-file", "1", "expected_one_instance_when_started_from_file"
)
check_play_and_exit = _setting("play-and-exit", "0", "expected_play_and_exit")


def check_global_key_play_pause(result: str | None, rules: dict[str, Any]) -> float:
    """A global play/pause hot key is set (1) or not (0)."""
    got = vlcrc_value(result, "global-key-play-pause", "")
    if got is None:
        return 0.0
    return float(("1" if got else "0") == str(rules["expected_global_key_play_pause"]))


def check_qt_slider_colours(result: str | None, rules: dict[str, Any]) -> float:
    """`type: match`: the slider colours equal `expected_qt_slider_colours`; `type: blackish`: every colour of it
    has all channels below 100."""
    got = vlcrc_value(result, "qt-slider-colours", "153;210;153;20;210;20;255;199;15;245;39;29")
    if got is None:
        return 0.0
    if rules.get("type") == "match":
        return float(got == rules["expected_qt_slider_colours"])
    if rules.get("type") == "blackish":
        try:
            values = [int(x) for x in got.split(";")]
        except ValueError:
            return 0.0
        return float(all(v < 100 for v in values[: len(values) // 3 * 3]))
    return 0.0


def _need(module: str, why: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise RuntimeError(f"{why} needs the Python package {module!r}, which is not installed here") from None


def compare_audios(result: str | None, expected: str | None) -> float:
    """exp(-d): d is the mean cosine distance along the DTW alignment of the two files' normalised MFCCs (librosa's
    exact DTW where OSWorld uses fastdtw's approximation). Two empty files score 1, one empty file 0."""
    import numpy as np

    if not result or not expected:
        return 0.0
    librosa = _need("librosa", "compare_audios")
    signals = []
    for path in (result, expected):
        try:
            y, sr = librosa.load(path)
        except Exception as exc:
            log.info("compare_audios: cannot decode %s: %s", path, exc)
            y, sr = None, None
        signals.append((y, sr))
    bad = [y is None or len(y) == 0 for y, _ in signals]
    if all(bad):
        return 1.0
    if any(bad):
        return 0.0
    feats = [librosa.util.normalize(librosa.feature.mfcc(y=y, sr=sr), axis=1) for y, sr in signals]
    cost, path = librosa.sequence.dtw(X=feats[0], Y=feats[1], metric="cosine")
    return float(np.exp(-cost[-1, -1] / len(path))) if len(path) else 0.0


def compare_videos(result: str | None, expected: str | None, max_frames_to_check: int = 100,
                   threshold: int = 5) -> float:
    """The first `max_frames_to_check` frames match by perceptual hash (distance <= threshold) except at most
    `threshold` of them, and neither video ends before the other within those frames."""
    if not result or not expected:
        return 0.0
    cv2 = _need("cv2", "compare_videos")
    import imagehash
    from PIL import Image

    a, b = cv2.VideoCapture(result), cv2.VideoCapture(expected)
    misses = 0
    for _ in range(max_frames_to_check):
        ok1, f1 = a.read()
        ok2, f2 = b.read()
        if not ok1 or not ok2:
            return float(ok1 == ok2)
        h1 = imagehash.phash(Image.fromarray(cv2.cvtColor(f1, cv2.COLOR_BGR2RGB)))
        h2 = imagehash.phash(Image.fromarray(cv2.cvtColor(f2, cv2.COLOR_BGR2RGB)))
        if h1 - h2 > threshold:
            misses += 1
            if misses > threshold:
                return 0.0
    return 1.0


METRICS: dict[str, Any] = {
    "is_vlc_playing": is_vlc_playing,
    "is_vlc_recordings_folder": is_vlc_recordings_folder,
    "is_vlc_fullscreen": is_vlc_fullscreen,
    "check_qt_bgcone": check_qt_bgcone,
    "check_qt_max_volume": check_qt_max_volume,
    "check_qt_minimal_view": check_qt_minimal_view,
    "check_one_instance_when_started_from_file": check_one_instance_when_started_from_file,
    "check_play_and_exit": check_play_and_exit,
    "check_global_key_play_pause": check_global_key_play_pause,
    "check_qt_slider_colours": check_qt_slider_colours,
    "compare_audios": compare_audios,
    "compare_videos": compare_videos,
}
