"""Darwin's learner as small pure functions: token-level GAE over a multi-turn trajectory, the
clipped PPO objective, GRPO's group advantages, and the KL term (spec/DARWIN.md A.5, A.6 and
the worked numbers of section D).

Beside :mod:`digirl_lite.filters` (DigiRL's Eq. 4.1-4.4). The advantage functions take lists,
numpy arrays or torch tensors (moved to CPU, detached) and return numpy arrays; the loss
terms (:func:`ppo_clip_loss`, :func:`kl_k3`) work on numpy arrays or torch tensors alike and
return the same kind, so the learner differentiates through them. Nothing here imports
torch at import time.

Shapes: a trajectory of ``T`` steps whose step ``t`` wrote ``L_t`` action tokens is flattened
to ``N = sum(L_t)`` tokens in order; ``values`` (N,) per token, ``rewards`` (T,) and
``step_lengths`` (T,) per step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from digirl_lite.filters import _as_array

__all__ = [
    "GAMMA",
    "LAM",
    "CLIP_EPS",
    "token_gae",
    "value_targets",
    "ppo_clip_loss",
    "grpo_advantages",
    "kl_k3",
]

GAMMA = 0.99
"""Discount across steps for PPO (Darwin A.5 gives no number; 0.99 is PPO's usual default
and the episodes here are short, at most 20 steps)."""
LAM = 0.95
"""GAE's lambda (Schulman et al. 2016's recommended 0.95; Darwin A.5 gives no number)."""
CLIP_EPS = 0.2
"""PPO's clip epsilon (Schulman et al. 2017; DARWIN.md section D's worked numbers)."""


def token_gae(values: Any, rewards: Any, step_lengths: Any, gamma: float = GAMMA,
              lam: float = LAM, terminal: bool = True, last_value: float = 0.0
              ) -> tuple[np.ndarray, np.ndarray]:
    """Token-level GAE over one trajectory's flattened action tokens (DARWIN.md A.5, D).

    Inside a step the reward is 0 and the discount 1: token ``i`` bootstraps from the next
    token, ``delta_i = v_{i+1} - v_i``. The last token of step ``t`` takes the step's reward
    and the first token of the next step, ``delta_i = r_t + gamma * v_next - v_i``; after
    the last step ``v_next`` is 0 when the episode ended (``terminal``: success, agent stop,
    budget, and by default an infrastructure truncation, A.6) or ``last_value`` when it is
    bootstrapped. Backwards, ``A_i = delta_i + c_i * lam * A_{i+1}`` with ``c_i = 1`` inside a
    step and ``gamma`` across a step boundary; returns ``G_i = A_i + v_i``.

    Section D: two steps of 2 and 3 tokens, v = [0.5, 0.6 | 0.7, 0.8, 0.9], r = [0, 1],
    gamma 0.9, lambda 0.5 -> A = [0.154375, 0.10875, 0.175, 0.15, 0.1],
    G = [0.654375, 0.70875, 0.875, 0.95, 1.0].

    Args:
        values: (N,) per-token values.
        rewards: (T,) per-step rewards.
        step_lengths: (T,) action tokens per step, each >= 1, summing to N.
        gamma: discount across steps, in [0, 1].
        lam: GAE's lambda, in [0, 1].
        terminal: the trajectory ended (no value after its last step).
        last_value: the value after the last step when not ``terminal`` (the bootstrap).

    Returns:
        (advantages, returns), each (N,) float64.
    """
    v = _as_array(values, "values")
    r = _as_array(rewards, "rewards")
    lengths = np.asarray(step_lengths, dtype=np.int64).reshape(-1)
    if len(lengths) != len(r):
        raise ValueError(f"{len(r)} rewards but {len(lengths)} step lengths")
    if len(lengths) and lengths.min() < 1:
        raise ValueError(f"every step has at least one action token, got lengths {lengths}")
    if int(lengths.sum()) != len(v):
        raise ValueError(f"step lengths sum to {int(lengths.sum())} tokens but there are "
                         f"{len(v)} values")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must be in [0, 1], got {gamma}, {lam}")
    n = len(v)
    ends = np.cumsum(lengths) - 1  # the last token of each step
    # v_next: the next token's value; at a step's last token, gamma * (next step's first)
    v_next = np.empty(n)
    v_next[:-1] = v[1:]
    if n:
        v_next[-1] = 0.0 if terminal else float(last_value)
    reward = np.zeros(n)
    reward[ends] = r
    c = np.ones(n)  # the discount from token i to token i + 1
    c[ends] = gamma
    delta = reward + c * v_next - v
    adv = np.empty(n)
    acc = 0.0  # A_N: nothing after the last token
    for i in range(n - 1, -1, -1):
        acc = delta[i] + c[i] * lam * acc
        adv[i] = acc
    return adv, adv + v


def value_targets(advantages: Any, values: Any) -> np.ndarray:
    """The value head's MSE targets, ``G_i = A_i + v_i`` (the returns of :func:`token_gae`)."""
    return _as_array(advantages, "advantages") + _as_array(values, "values")


def _torch_like(x: Any) -> bool:
    return hasattr(x, "detach") and hasattr(x, "cpu")


def ppo_clip_loss(ratio: Any, advantages: Any, eps: float = CLIP_EPS) -> Any:
    """PPO's clipped surrogate per token, as a loss: ``-min(rho * A, clip(rho, 1 - eps,
    1 + eps) * A)`` (Schulman et al. 2017; DARWIN.md A.5).

    Section D, eps 0.2: rho 1.5, A 1 -> -1.2; rho 0.5, A -1 -> 0.8; rho 1.1, A 1 -> -1.1.

    Args:
        ratio: per-token probability ratios pi_new / pi_old (numpy or torch).
        advantages: per-token advantages, the same shape (treated as constants).
        eps: the clip range.

    Returns:
        The per-token loss, the same kind and shape as ``ratio`` (average it yourself).
    """
    if not 0.0 <= eps < 1.0:
        raise ValueError(f"eps must be in [0, 1), got {eps}")
    if _torch_like(ratio):
        import torch

        a = torch.as_tensor(advantages, dtype=ratio.dtype, device=ratio.device)
        return -torch.minimum(ratio * a, ratio.clamp(1.0 - eps, 1.0 + eps) * a)
    rho = np.asarray(ratio, dtype=np.float64)
    a = np.asarray(advantages, dtype=np.float64)
    return -np.minimum(rho * a, np.clip(rho, 1.0 - eps, 1.0 + eps) * a)


def grpo_advantages(rewards: Any, std: str = "population", eps: float = 1e-6) -> np.ndarray:
    """GRPO's group advantages: ``(R - mean) / (std + eps)`` over the G attempts at one task,
    given to every token of each attempt (DARWIN.md A.5).

    The population std (divide by G) by default, as DeepSeekMath's GRPO computes it with
    numpy's default: rewards [1, 0, 0, 1] -> [1, -1, -1, 1]; ``std="sample"`` (divide by
    G - 1) gives [0.866, -0.866, -0.866, 0.866]. A group whose rewards are all equal carries
    no signal: every advantage 0.

    Args:
        rewards: (G,) final rewards of the group's attempts.
        std: "population" or "sample".
        eps: added to the std.

    Returns:
        (G,) float64 advantages.
    """
    r = _as_array(rewards, "rewards")
    if std not in ("population", "sample"):
        raise ValueError(f"std must be 'population' or 'sample', got {std!r}")
    if len(r) == 0:
        return r
    if len(r) < 2 and std == "sample":
        raise ValueError("the sample std needs a group of at least 2 attempts")
    centred = r - r.mean()
    if np.allclose(centred, 0.0):
        return np.zeros_like(r)
    return centred / (r.std(ddof=0 if std == "population" else 1) + eps)


def kl_k3(logp_new: Any, logp_ref: Any) -> Any:
    """Per-token KL(pi_new || pi_ref) estimate from sampled tokens, Schulman's k3:
    ``exp(d) - 1 - d`` with ``d = logp_ref - logp_new`` (unbiased for tokens sampled from
    pi_new, never negative, low variance; the KL penalty of GRPO's paper). 0 where the two
    agree.

    Args:
        logp_new: per-token log-probabilities under the policy being trained.
        logp_ref: the same tokens' log-probabilities under the reference (e.g. the starting
            policy or the policy that collected them).

    Returns:
        The per-token estimate, the same kind and shape as ``logp_new``.
    """
    if _torch_like(logp_new):
        import torch

        d = torch.as_tensor(logp_ref, dtype=logp_new.dtype, device=logp_new.device) - logp_new
        return torch.exp(d) - 1.0 - d
    d = np.asarray(logp_ref, dtype=np.float64) - np.asarray(logp_new, dtype=np.float64)
    return np.exp(d) - 1.0 - d
