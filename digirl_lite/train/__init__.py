"""Training: the DigiRL loop (``Trainer``), its configuration and presets, evaluation.

Imported lazily (torch is loaded when the trainer is used)."""

from __future__ import annotations

from digirl_lite._lazy import lazy_exports

_NAMES = {
    "Trainer": "digirl_lite.train.trainer",
    "PolicyBatchAgent": "digirl_lite.policy.agent",
    "DigiRLConfig": "digirl_lite.train.config",
    "sim_webshop": "digirl_lite.train.config",
    "sim_quick": "digirl_lite.train.config",
    "evaluate": "digirl_lite.train.evaluate",
    "summarize": "digirl_lite.train.evaluate",
    "failure_kind": "digirl_lite.train.evaluate",
}

__all__ = list(_NAMES)


__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
