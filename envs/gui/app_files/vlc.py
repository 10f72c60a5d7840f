"""The vlc tasks' files (`out/vlc/`): short melodies as WAV files (the `wave` module, 8 kHz mono 16-bit).

The melodies last long enough (90 s) that VLC is still playing one when the evaluator reads its status. (VLC's
first-start privacy question is answered in every episode's HOME: envs/runtime/app_profiles.py.)
"""

from __future__ import annotations

import wave
from pathlib import Path

RATE = 8000
SECONDS = 90
# (frequencies in Hz of a repeating phrase, note length in s)
MELODIES = {
    "chime.wav": ((523.25, 659.25, 783.99, 1046.5), 0.5),
    "waves.wav": ((220.0, 246.94, 261.63, 293.66, 261.63, 246.94), 0.75),
}


def melody(notes: tuple[float, ...], note_s: float, seconds: int = SECONDS, rate: int = RATE) -> bytes:
    """16-bit little-endian PCM of the phrase repeated for `seconds`, each note faded in and out (no clicks)."""
    import numpy as np

    t = np.arange(int(note_s * rate)) / rate
    envelope = np.minimum(1.0, np.minimum(t, note_s - t) / 0.02)
    phrase = np.concatenate([0.4 * envelope * np.sin(2 * np.pi * f * t) for f in notes])
    reps = -(-seconds * rate // len(phrase))
    samples = np.tile(phrase, reps)[: seconds * rate]
    return (samples * 32767).round().astype("<i2").tobytes()


def write_wav(path: Path, pcm: bytes, rate: int = RATE) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)


def build(out: Path) -> None:
    d = out / "vlc"
    d.mkdir(parents=True, exist_ok=True)
    for name, (notes, note_s) in MELODIES.items():
        write_wav(d / name, melody(notes, note_s))
