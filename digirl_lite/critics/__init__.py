"""The critics of DigiRL (spec/DIGIRL.md section 5): step critic, instruction critic, the
frozen text encoders they read, and the batches they train on.

- :class:`StepCritic` V_step(s): two :class:`ValueHead` MLPs (double critic) on
  [text embedding of the prompt | two-frame image features]; the filter uses the minimum.
- :class:`InstructionCritic` V_instruct(c): one linear layer on the task's embedding.
- Both are trained with cross-entropy against "final verdict > 0" (:func:`value_loss`,
  squared error as the ablation ``loss="mse"``).
- Text encoders are frozen, so every distinct text is encoded once (:class:`EmbeddingCache`):
  re-encoding every update, as the released code does, cost 270x more per update
  (notes/MEASURED.md; ``benchmarks/bench_critics.py``).

``import digirl_lite.critics`` is light: torch and transformers load on first use of a name.
"""

from __future__ import annotations

from digirl_lite._lazy import lazy_exports

_EXPORTS = {
    # heads
    "ValueHead": "heads",
    "StepCritic": "heads",
    "InstructionCritic": "heads",
    "PAPER_TEXT_DIM": "heads",
    "PAPER_IMAGE_DIM": "heads",
    "PAPER_HIDDEN": "heads",
    # losses
    "LOSSES": "losses",
    "value_loss": "losses",
    "step_critic_loss": "losses",
    "instruction_critic_loss": "losses",
    # text
    "TextEncoder": "text",
    "MiniLMEncoder": "text",
    "HFTextEncoder": "text",
    "EmbeddingCache": "text",
    "minilm_dir": "text",
    # data
    "StepBatch": "data",
    "InstructionBatch": "data",
    "step_batches": "data",
    "instruction_batch": "data",
    "critic_values": "data",
    "critic_values_many": "data",
    "state_texts": "data",
    "instruction_values": "data",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
