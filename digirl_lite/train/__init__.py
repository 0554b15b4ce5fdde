"""Training: the DigiRL loop (``Trainer``), its configuration and presets, evaluation.

Imported lazily (torch is loaded when the trainer is used)."""

from __future__ import annotations

import importlib

_NAMES = {
    "Trainer": "digirl_lite.train.trainer",
    "PolicyBatchAgent": "digirl_lite.train.trainer",
    "DigiRLConfig": "digirl_lite.train.config",
    "sim_webshop": "digirl_lite.train.config",
    "sim_quick": "digirl_lite.train.config",
    "evaluate": "digirl_lite.train.evaluate",
    "summarize": "digirl_lite.train.evaluate",
    "failure_kind": "digirl_lite.train.evaluate",
}

__all__ = list(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'digirl_lite.train' has no attribute {name!r}")
