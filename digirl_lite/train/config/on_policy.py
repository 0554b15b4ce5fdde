"""Darwin's on-policy learners, PPO and GRPO (spec/DARWIN.md A.5, A.6): their fields, read and
checked by :mod:`digirl_lite.learners.ppo` and :mod:`digirl_lite.learners.grpo`
(:attr:`~digirl_lite.learners.base.Learner.reads`, ``check_config``).

``docs/config.md`` gives the measurements behind the defaults that are this project's
choices (``ppo_lam`` 1, ``offline_imitation``, ``policy_loss_norm``, ``value_lr``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OnPolicyConfig"]


@dataclass
class OnPolicyConfig:
    """PPO's and GRPO's updates, and their offline phase."""

    ppo_clip_eps: float = 0.2
    """PPO's clip epsilon (Schulman et al. 2017; DARWIN.md D)."""
    ppo_epochs: int = 2
    """Passes over each iteration's tokens (Darwin gives no number; few passes keep the
    policy near the one that sampled)."""
    ppo_minibatch: int = 32
    """Steps per PPO update (all of a step's action tokens together)."""
    ppo_gamma: float = 0.99
    """PPO's discount across steps (:data:`digirl_lite.ppo.GAMMA`)."""
    ppo_lam: float = 1.0
    """GAE's lambda over the flattened action tokens; 1: Monte-Carlo advantages (Schulman's
    0.95 reached about one step back and PPO did not learn)."""
    value_coef: float = 0.5
    """Weight of the value head's MSE in PPO's loss (Schulman et al. 2017's c1 = 0.5)."""
    value_lr: float = 1e-3
    """The value head's learning rate (its own AdamW group; the rest keeps ``actor_lr``)."""
    value_bias: float = 0.1
    """The output bias of a fresh value head (DARWIN.md A.6: 0.1); a loaded head keeps its
    own."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to ``kl_reference`` in PPO's and GRPO's loss (0: off; both
    KLs are logged either way)."""
    kl_reference: str = "start"
    """What the KL penalty pulls towards: "start" (the online phase's starting policy,
    frozen) or "sampling" (the policy that sampled the iteration)."""
    negative_advantage_scale: float = 1.0
    """Multiplies every negative advantage in PPO's and GRPO's policy loss (1: the plain
    objective; 0: only better-than-expected tokens are pushed, up)."""
    value_grad_clip: float | None = None
    """PPO: the value head's own gradient-norm cap; None: one cap, ``actor_grad_clip``, over
    the policy and the value head together."""
    advantage_norm: str = "none"
    """PPO: "none" (GAE's advantages as they are) or "batch" (standardised over the
    iteration's tokens)."""
    policy_loss_norm: str | None = None
    """How the policy loss (and KL) averages over tokens: "token" (PPO's default) or
    "trajectory" (each trajectory weighs alike; GRPO's default); None: the algorithm's own."""
    offline_policy_passes: int = 0
    """Passes of the learner's own update over the pile in the offline phase (after PPO's
    value warm-up); 0: none (Darwin A.6)."""
    offline_imitation: bool | None = None
    """The offline phase first runs Filtered BC's ``offline_actor_updates`` on the pile's
    successes; None: the algorithm's own (True for PPO and GRPO)."""
    grpo_group: int = 4
    """GRPO: attempts per task per iteration (``rollouts_per_iteration`` must be a multiple;
    Darwin gives no number)."""
    grpo_groups: str = "draw"
    """GRPO: a group is the ``grpo_group`` attempts of one draw of a task ("draw") or every
    attempt at the same task text in the iteration ("task")."""
    critic_warmup_updates: int = 30
    """PPO's offline phase: value-head-only updates on the pile, the actor frozen (Darwin
    A.6: 30 warm-up steps kept a fresh critic from collapsing the policy)."""
