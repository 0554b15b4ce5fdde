"""The policies: the :class:`Policy` protocol the library uses (``base``), Auto-UI (a
multimodal T5, ``AutoUIModel``, and its wrapper ``AutoUIPolicy``) and ``VLMPolicy`` (any
local Hugging Face vision-language model, LoRA); ``factory`` builds the one a config asks for.

Imported lazily: ``import digirl_lite.policy`` does not import torch until a name is used.
"""

from __future__ import annotations

from digirl_lite._lazy import lazy_exports

_NAMES = {
    "Policy": "digirl_lite.policy.base",
    "PolicyBatchAgent": "digirl_lite.policy.agent",
    "policy_inputs": "digirl_lite.policy.base",
    "load_policy": "digirl_lite.policy.factory",
    "VLMPolicy": "digirl_lite.policy.vlm",
    "make_tiny_vlm": "digirl_lite.policy.tiny_vlm",
    "AutoUIPolicy": "digirl_lite.policy.policy",
    "SIM_PRESET": "digirl_lite.policy.policy",
    "REFERENCE_CLAMP": "digirl_lite.policy.policy",
    "ValueHead": "digirl_lite.policy.value_head",
    "Sample": "digirl_lite.policy.base",
    "VALUE_BIAS": "digirl_lite.policy.value_head",
    "AutoUIModel": "digirl_lite.policy.model",
    "SPTokenizer": "digirl_lite.policy.tokenizer",
    "HFTokenizer": "digirl_lite.policy.tokenizer",
    "train_sim_tokenizer": "digirl_lite.policy.tokenizer",
    "mle_update": "digirl_lite.policy.updates",
    "text_mle_update": "digirl_lite.policy.updates",
    "steps_to_batch": "digirl_lite.policy.updates",
}

__all__ = list(_NAMES)


__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
