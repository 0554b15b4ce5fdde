"""What a run's numbers depend on besides its code and config: the libraries that compute or
draw them and the CPU's kernels, recorded in every ``summary.json`` (``environment``).

Two runs of one commit, config and seed give the same trajectories only where these agree:
torch picks its CPU kernels by the instruction set (``torch.backends.cpu.get_cpu_capability``;
the main job's offline stage, one machine, commit and seed: 37.5% held-out with torch's
AVX-512 kernels, 44.8% with ``ATEN_CPU_CAPABILITY=avx2``), and Pillow 13 shrinks the phone's
screens to other pixels than Pillow 12 (``tests/sim/test_screen_pixels.py``; the same stage
16.7% under Pillow 13). Grids warn when a paired comparison mixes them.
"""

from __future__ import annotations

import functools
import platform
import re
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["environment", "PACKAGES"]

# the libraries whose version moves a run's numbers: kernels, drawing, tokenizers, arrays
PACKAGES = ("torch", "transformers", "numpy", "pillow", "accelerate", "tokenizers")


@functools.cache
def environment() -> dict[str, Any]:
    """Python's version, :data:`PACKAGES`' versions (None: not installed), the CPU's model
    name and the kernels torch dispatches to on it."""
    import torch

    cpu = ""
    info = Path("/proc/cpuinfo")
    if info.is_file():
        m = re.search(r"^model name\s*:\s*(.*)$", info.read_text(), re.M)
        cpu = m.group(1).strip() if m else ""
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    return {"python": platform.python_version(), "packages": packages,
            "cpu": cpu or platform.processor() or platform.machine(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}
