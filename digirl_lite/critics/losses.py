"""Critic losses (spec/DIGIRL.md section 5): cross-entropy against "final verdict > 0", and
squared error on the class-1 probability as the ablation.

Why cross-entropy: a head at V = 0.99 whose truth is 0.5 gets a pull on its logit of
V - 0.5 = 0.49 under CE but 2 (V - 0.5) V (1 - V) = 0.0097 under squared error, 50.5x weaker:
the sigmoid's flat tail hides the error from MSE (paper ablation: CE about 12% better).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.critics.data import InstructionBatch, StepBatch
    from digirl_lite.critics.heads import InstructionCritic, StepCritic

__all__ = ["LOSSES", "LossKind", "value_loss", "step_critic_loss", "instruction_critic_loss"]

LossKind = Literal["ce", "mse"]
LOSSES: tuple[str, ...] = ("ce", "mse")
"""``"ce"``: cross-entropy (paper and released code). ``"mse"``: squared error (ablation)."""


def value_loss(logits: torch.Tensor, labels: torch.Tensor, loss: LossKind = "ce") -> torch.Tensor:
    """Mean loss of (B, 2) logits against (B,) labels in [0, 1].

    Labels are usually 0/1 ("final verdict > 0"); a soft label p is the expectation over a
    p : 1 - p mix of labels (same loss, same gradient in expectation).

    ``"ce"``: -(y log q1 + (1 - y) log q0); equals ``F.cross_entropy`` on hard labels.
    ``"mse"``: (q1 - y)^2, q1 = softmax(logits)[:, 1].
    """
    if logits.ndim != 2 or logits.shape[1] != 2:
        raise ValueError(f"logits must be (B, 2), got {tuple(logits.shape)}")
    y = labels.to(logits).reshape(-1)
    if y.shape[0] != logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} logits rows but {y.shape[0]} labels")
    logp = torch.log_softmax(logits, dim=-1)  # (B, 2)
    if loss == "ce":
        return -(y * logp[:, 1] + (1.0 - y) * logp[:, 0]).mean()
    if loss == "mse":
        return (logp[:, 1].exp() - y).pow(2).mean()
    raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")


def step_critic_loss(
    critic: StepCritic, batch: StepBatch, loss: LossKind = "ce", next_states: bool = False
) -> torch.Tensor:
    """Both heads' loss on s_h (summed, as the released code sums v1 and v2 losses).

    Args:
        critic: the step critic.
        batch: a :class:`~digirl_lite.critics.data.StepBatch`.
        loss: ``"ce"`` or ``"mse"``.
        next_states: also fit s_{h+1} to the same label, as the released code does (it adds
            the losses of nv1 and nv2); needs a batch built with ``with_next=True``.
    """
    l1, l2 = critic(batch.text, batch.img2)
    total = value_loss(l1, batch.label, loss) + value_loss(l2, batch.label, loss)
    if next_states:
        if batch.next_text is None or batch.next_img2 is None:
            raise ValueError("next_states=True needs a batch built with with_next=True")
        n1, n2 = critic(batch.next_text, batch.next_img2)
        total = total + value_loss(n1, batch.label, loss) + value_loss(n2, batch.label, loss)
    return total


def instruction_critic_loss(
    critic: InstructionCritic, batch: InstructionBatch, loss: LossKind = "ce"
) -> torch.Tensor:
    """The instruction critic's loss on a batch of tasks and their final verdicts."""
    return value_loss(critic(batch.text), batch.label, loss)
