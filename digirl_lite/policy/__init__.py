"""The AutoUI policy: a multimodal T5 (``AutoUIModel``) and its wrapper ``AutoUIPolicy``.

Imported lazily: ``import digirl_lite.policy`` does not import torch until a name is used.
"""

from __future__ import annotations

import importlib

_NAMES = {
    "AutoUIPolicy": "digirl_lite.policy.policy",
    "SIM_PRESET": "digirl_lite.policy.policy",
    "REFERENCE_CLAMP": "digirl_lite.policy.policy",
    "AutoUIModel": "digirl_lite.policy.model",
    "SPTokenizer": "digirl_lite.policy.tokenizer",
    "HFTokenizer": "digirl_lite.policy.tokenizer",
    "train_sim_tokenizer": "digirl_lite.policy.tokenizer",
}

__all__ = list(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'digirl_lite.policy' has no attribute {name!r}")
