"""The software stack a run or experiment ran on, recorded in its config.yaml and report.

A run is deterministic on one stack and machine, not across them: another torch, transformers or numpy release, or a CPU
whose kernels torch dispatches differently (AVX2 vs AVX-512), changes float results in the last bits, and a sampled
token that flips changes every step after it. So every result carries what produced it.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

#: the distributions whose versions decide a run's numbers (kernels, tokenization, sampling, reward math)
STACK_PACKAGES = ("torch", "transformers", "tokenizers", "numpy", "ray", "megatron-core")


@dataclass(frozen=True)
class SoftwareStack:
    python: str
    packages: dict[str, str | None]  # distribution -> installed version (None: not installed)
    cpu: str  # the CPU's model name, as /proc/cpuinfo gives it
    cpu_capability: str  # the instruction set torch's CPU kernels dispatch to (DEFAULT, AVX2, AVX512, ...)
    platform: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for a report: `Python 3.11.7, torch 2.13.0, ... on AMD EPYC (AVX2)`."""
        pkgs = ", ".join(f"{k} {v}" for k, v in self.packages.items() if v)
        return f"Python {self.python}, {pkgs}; {self.cpu} ({self.cpu_capability})"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _torch_build() -> tuple[str | None, str]:
    """torch's own version string and the instruction set its CPU kernels dispatch to. The version is torch.__version__,
    not the distribution's metadata: PyPI's CUDA wheel says 2.13.0 in its metadata and 2.13.0+cu130 here, and which
    build ran is part of the stack."""
    try:
        import torch
    except ImportError:  # no torch: nothing dispatches on it
        return None, "unknown"
    try:
        capability = str(torch.backends.cpu.get_cpu_capability())
    except AttributeError:
        capability = "unknown"
    return str(torch.__version__), capability


def software_stack() -> SoftwareStack:
    torch_version, capability = _torch_build()
    packages = {p: _version(p) for p in STACK_PACKAGES}
    packages["torch"] = torch_version
    return SoftwareStack(python=platform.python_version(), packages=packages, cpu=_cpu_model(),
                         cpu_capability=capability, platform=platform.platform())


def stack_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between two recorded stacks (`to_dict()` forms), as `key: a -> b` lines."""
    out = []
    for key in ("python", "cpu", "cpu_capability", "platform"):
        if a.get(key) != b.get(key):
            out.append(f"{key}: {a.get(key)} -> {b.get(key)}")
    pa, pb = a.get("packages") or {}, b.get("packages") or {}
    for name in sorted(set(pa) | set(pb)):
        if pa.get(name) != pb.get(name):
            out.append(f"{name}: {pa.get(name)} -> {pb.get(name)}")
    return out


__all__ = ["STACK_PACKAGES", "SoftwareStack", "software_stack", "stack_differences"]
