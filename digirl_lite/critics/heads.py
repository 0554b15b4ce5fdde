"""Critic heads (spec/DIGIRL.md section 5): the step critic's double MLP and the instruction
critic's linear layer. Both output two logits; softmax class 1 is the value in (0, 1).

Parameter names follow the released code (``critic1.0.weight`` ... ``critic2.4.bias`` for the
step critic, ``critic.weight`` for the instruction critic) so its head weights load with
``load_state_dict(..., strict=False)`` once the text encoder's keys are dropped.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = [
    "PAPER_TEXT_DIM",
    "PAPER_IMAGE_DIM",
    "PAPER_HIDDEN",
    "ValueHead",
    "StepCritic",
    "InstructionCritic",
]

PAPER_TEXT_DIM = 768
"""RoBERTa-base pooled output (released code: ``AutoModel(roberta-base).pooler_output``)."""
PAPER_IMAGE_DIM = 1408
"""BLIP-2 ViT-g pooled image features per screenshot; the state holds two (2816 floats)."""
PAPER_HIDDEN = 768
"""Hidden width of the step critic's MLP (released code: ``in_dim`` = 768)."""


def _logit(p: float) -> float:
    if not 0.0 < p < 1.0:
        raise ValueError(f"init_value must be in (0, 1), got {p}")
    return math.log(p / (1.0 - p))


def _init_output(layer: nn.Linear, value: float) -> None:
    """Zero the weight and set the bias so that softmax(bias)[1] = ``value`` on any input.

    Darwin (spec/DARWIN.md A.6): a randomly initialised critic collapsed the policy; an
    output bias of 0.1 prevented it. The zero weight makes the initial value exact; the
    weight still gets gradients (the hidden activations are not zero), so learning starts
    on the first update.
    """
    z = _logit(value)  # b1 - b0
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.copy_(torch.tensor([-z / 2.0, z / 2.0], dtype=layer.bias.dtype))


class ValueHead(nn.Sequential):
    """Linear(d_in, d_hidden) -> ReLU -> Linear(d_hidden, d_hidden) -> ReLU -> Linear(d_hidden, 2).

    Outputs logits (B, 2); softmax class 1 is the value. ``ValueHead(768 + 2816, 768)`` is the
    paper's head: 3,345,410 parameters.

    Args:
        d_in: input width (text embedding + two image frames).
        d_hidden: hidden width.
        init_value: if given, the initial value on every input (e.g. 0.1, Darwin A.6): the
            last layer's weight is zeroed and its bias set to [-z/2, z/2], z = logit(value).
    """

    def __init__(self, d_in: int, d_hidden: int, init_value: float | None = None) -> None:
        super().__init__(
            nn.Linear(d_in, d_hidden),
            nn.ReLU(),
            nn.Linear(d_hidden, d_hidden),
            nn.ReLU(),
            nn.Linear(d_hidden, 2),
        )
        self.d_in = d_in
        if init_value is not None:
            _init_output(self.output_layer, init_value)

    @property
    def output_layer(self) -> nn.Linear:
        return self[-1]

    def value(self, x: torch.Tensor) -> torch.Tensor:
        """(B,) softmax class-1 probability of the (B, d_in) input."""
        return torch.softmax(self(x), dim=-1)[:, 1]


class StepCritic(nn.Module):
    """V_step(s): two :class:`ValueHead` (double critic) on [text | previous frame | frame].

    Args:
        text_dim: width of the prompt's text embedding (768 for RoBERTa-base, 384 MiniLM).
        img_dim: image features per screenshot (1408 for BLIP-2); the state holds two.
        hidden: hidden width of each head (768 in the paper).
        init_value: initial value of both heads on every input (None: PyTorch's default
            init), see :class:`ValueHead`.
    """

    def __init__(
        self, text_dim: int, img_dim: int, hidden: int = PAPER_HIDDEN,
        init_value: float | None = None,
    ) -> None:
        super().__init__()
        self.text_dim = text_dim
        self.img_dim = img_dim
        d_in = text_dim + 2 * img_dim
        self.critic1 = ValueHead(d_in, hidden, init_value)
        self.critic2 = ValueHead(d_in, hidden, init_value)

    def _inputs(self, text_emb: torch.Tensor, img2: torch.Tensor) -> torch.Tensor:
        if text_emb.ndim != 2 or text_emb.shape[1] != self.text_dim:
            raise ValueError(f"text_emb must be (B, {self.text_dim}), got {tuple(text_emb.shape)}")
        if img2.ndim != 2 or img2.shape[1] != 2 * self.img_dim:
            raise ValueError(f"img2 must be (B, {2 * self.img_dim}) = two frames of "
                             f"{self.img_dim}, got {tuple(img2.shape)}")
        if text_emb.shape[0] != img2.shape[0]:
            raise ValueError(f"{text_emb.shape[0]} text rows but {img2.shape[0]} image rows")
        p = self.critic1[0].weight
        return torch.cat([text_emb.to(p), img2.to(p)], dim=1)  # (B, text_dim + 2 img_dim)

    def forward(
        self, text_emb: torch.Tensor, img2: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of both heads, each (B, 2), on text (B, text_dim) and img2 (B, 2 img_dim)."""
        x = self._inputs(text_emb, img2)
        return self.critic1(x), self.critic2(x)

    def value(self, text_emb: torch.Tensor, img2: torch.Tensor) -> torch.Tensor:
        """(B,) value: the **minimum** over the two heads of softmax class 1 (section 5)."""
        l1, l2 = self(text_emb, img2)
        return torch.minimum(torch.softmax(l1, -1)[:, 1], torch.softmax(l2, -1)[:, 1])


class InstructionCritic(nn.Module):
    """V_instruct(c): Linear(text_dim, 2) on the task's text embedding; softmax class 1.

    Args:
        text_dim: width of the task's text embedding.
        init_value: initial value on every input (None: PyTorch's default init).
    """

    def __init__(self, text_dim: int, init_value: float | None = None) -> None:
        super().__init__()
        self.text_dim = text_dim
        self.critic = nn.Linear(text_dim, 2)
        if init_value is not None:
            _init_output(self.critic, init_value)

    def forward(self, task_emb: torch.Tensor) -> torch.Tensor:
        """(B, 2) logits of the (B, text_dim) task embeddings."""
        if task_emb.ndim != 2 or task_emb.shape[1] != self.text_dim:
            raise ValueError(f"task_emb must be (B, {self.text_dim}), got {tuple(task_emb.shape)}")
        return self.critic(task_emb.to(self.critic.weight))

    def value(self, task_emb: torch.Tensor) -> torch.Tensor:
        """(B,) softmax class-1 probability."""
        return torch.softmax(self(task_emb), dim=-1)[:, 1]
