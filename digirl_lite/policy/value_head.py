"""The value head Darwin's learner reads from a policy's decoder (both policies carry one)."""

from __future__ import annotations

import torch

__all__ = ["ValueHead", "VALUE_BIAS"]

VALUE_BIAS = 0.1
"""The value head's output bias at initialisation (Darwin, DARWIN.md A.6: a randomly
initialised critic without warm-up collapsed the policy; an output bias of 0.1, or 30
critic-only warm-up updates, prevented it)."""


class ValueHead(torch.nn.Module):
    """Per-token values from the decoder's hidden states: one linear layer, (..., d) ->
    (...). Weights start small (normal, std 0.01, from ``seed``) and the bias at
    :data:`VALUE_BIAS`, so a fresh head says about 0.1 everywhere."""

    def __init__(self, d_model: int, seed: int = 0) -> None:
        super().__init__()
        # built without drawing from torch's global generator: a policy's sampling stream
        # (hence every run's trajectories for a seed) is the same with or without the head
        with torch.random.fork_rng(devices=[]):
            self.linear = torch.nn.Linear(d_model, 1)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(
                self.linear.weight.shape, generator=torch.Generator().manual_seed(seed)) * 0.01)
            self.linear.bias.fill_(VALUE_BIAS)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1)
