"""digirl_lite: DigiRL (Bai, Zhou et al., NeurIPS 2024) for phone-using agents, on a laptop.

Importing the package is light: submodules load on first use (``digirl_lite.filters``,
``digirl_lite.actions``, ``digirl_lite.data``, ...), and torch, transformers and datasets are
imported only by the parts that need them.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = ("actions", "critics", "data", "envs", "filters", "judge", "policy", "prompts",
               "report", "rollout", "train", "vision", "viz")

__all__ = ["__version__", *_SUBMODULES]


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"digirl_lite.{name}")
    raise AttributeError(f"module 'digirl_lite' has no attribute {name!r}")
