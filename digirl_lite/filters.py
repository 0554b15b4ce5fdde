"""DigiRL's returns, advantages and filters as small pure functions (spec/DIGIRL.md section 6).

Every function takes lists, numpy arrays or torch tensors (moved to CPU, detached) and
returns numpy arrays; nothing here imports torch. Shapes are given per trajectory:
``T`` steps, ``values`` with ``T + 1`` entries (the value after the last step included).

Equations (DigiRL paper, arXiv 2406.11896):
    Eq. 4.1  AWR weights exp(A / beta)                      -> :func:`awr_weights`
    Eq. 4.2  maximum likelihood on kept steps (weight 0/1)  -> the masks below
    Eq. 4.3  step advantage                                 -> :func:`step_advantage`
    Eq. 4.4  instruction advantage + top-p keep             -> :func:`instruction_advantage`,
                                                               :func:`keep_top_fraction`
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "GAMMA",
    "mc_returns",
    "step_advantage",
    "step_keep_mask",
    "step_advantage_released",
    "step_grades",
    "STEP_FILTERS",
    "instruction_advantage",
    "keep_top_fraction",
    "filtered_bc_keep",
    "awr_weights",
    "effective_sample_size",
]

GAMMA = 0.5
"""Discount gamma = lambda = 0.5 (paper and released code)."""


def _as_array(x: Any, name: str) -> np.ndarray:
    """A float64 1-D numpy array from a list, numpy array or torch tensor."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, without importing torch
        x = x.detach().cpu().numpy()
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    return a


def mc_returns(rewards: Any, gamma: float = GAMMA) -> np.ndarray:
    """Discounted return-to-go G_h = r_h + gamma * G_{h+1}, stored per step as ``mc_return``.

    A 4-step success with gamma = 0.5: rewards [0, 0, 0, 1] -> [0.125, 0.25, 0.5, 1.0].

    Args:
        rewards: (T,) per-step rewards.
        gamma: discount in [0, 1].

    Returns:
        (T,) float64 returns.
    """
    r = _as_array(rewards, "rewards")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    out = np.empty_like(r)
    g = 0.0
    for h in range(len(r) - 1, -1, -1):
        g = r[h] + gamma * g
        out[h] = g
    return out


def step_advantage(
    values: Any, rewards: Any, lam: float = GAMMA, final_reward: float | None = None
) -> np.ndarray:
    """Eq. 4.3, the paper's step-level advantage.

    m_h = lam^(H_end - h) * r_final;  td_h = V(s_{h+1}) + r_h - V(s_h);
    A_h = m_h + (1 - m_h) * td_h,  where H_end is the index of the last step.

    lam = 1 makes every step of a success A = 1 (Filtered BC on successes); lam = 0 leaves
    the critic alone (A = td) everywhere except the final step.

    Args:
        values: (T + 1,) step-critic values V(s_0) .. V(s_T); V(s_T), the value after the
            last step, is 0 when the episode terminated (pass it explicitly).
        rewards: (T,) per-step rewards.
        lam: lambda of Eq. 4.3 (0.5 in the paper).
        final_reward: r_final; defaults to the last reward (rewards are sparse: 1 on the
            step the judge says success).

    Returns:
        (T,) advantages. Keep a step when A > 1/H (:func:`step_keep_mask`).
    """
    v = _as_array(values, "values")
    r = _as_array(rewards, "rewards")
    T = len(r)
    if len(v) != T + 1:
        raise ValueError(f"values needs T + 1 = {T + 1} entries (incl. the value after the "
                         f"last step), got {len(v)}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    if T == 0:
        return np.zeros(0)
    r_final = float(r[-1]) if final_reward is None else float(final_reward)
    steps_to_end = np.arange(T - 1, -1, -1, dtype=np.float64)  # H_end - h
    m = np.power(lam, steps_to_end) * r_final  # 0.0 ** 0 == 1: the last step gets r_final
    td = v[1:] + r - v[:-1]
    return m + (1.0 - m) * td


def step_keep_mask(advantages: Any, horizon: int) -> np.ndarray:
    """Eq. 4.3's keep rule: A_step > 1/H (0.1 for H = 10, 0.05 for H = 20)."""
    if horizon <= 0:
        raise ValueError(f"horizon must be positive, got {horizon}")
    return _as_array(advantages, "advantages") > 1.0 / horizon


def step_advantage_released(
    v: Any, v_next: Any, rewards: Any, mc_return: Any, margin: float = 0.05,
    clamp: bool = True,
) -> np.ndarray:
    """The released code's step grade (an option; the paper's form is :func:`step_advantage`).

    grade = v_next - v - margin + reward + mc_return, clamped to [0, 1]; a step is kept
    when grade > 0.

    Args:
        v, v_next: (T,) step-critic values before and after each step.
        rewards, mc_return: (T,) per-step rewards and discounted returns.
        margin: the released code's constant 0.05.
        clamp: clamp to [0, 1] as the released code does (False gives the raw grade).
    """
    a = _as_array(v, "v")
    arrays = [_as_array(x, n) for x, n in
              ((v_next, "v_next"), (rewards, "rewards"), (mc_return, "mc_return"))]
    for arr, n in zip(arrays, ("v_next", "rewards", "mc_return"), strict=True):
        if arr.shape != a.shape:
            raise ValueError(f"{n} has shape {arr.shape}, v has {a.shape}")
    nv, r, mc = arrays
    grade = nv - a - margin + r + mc
    return np.clip(grade, 0.0, 1.0) if clamp else grade


def instruction_advantage(final_rewards: Any, values: Any) -> np.ndarray:
    """Eq. 4.4: A_instruct = r_final - V_instruct(c), one entry per trajectory.

    r = [1, 1, 0], V = [0.8, 0.10, 0.01] -> [0.2, 0.9, -0.01].
    """
    r = _as_array(final_rewards, "final_rewards")
    v = _as_array(values, "values")
    if r.shape != v.shape:
        raise ValueError(f"final_rewards {r.shape} and values {v.shape} differ in shape")
    return r - v


def keep_top_fraction(scores: Any, p: float = 0.1) -> np.ndarray:
    """Keep the scores >= the (1 - p) quantile (``np.quantile``, linear), ties included.

    With p = 0.1 this is Eq. 4.4's top-10% trajectory filter. An empty input gives an
    empty mask.
    """
    s = _as_array(scores, "scores")
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p}")
    if s.size == 0:
        return np.zeros(0, dtype=bool)
    if not np.all(np.isfinite(s)):
        raise ValueError("scores contain NaN or infinity")
    return s >= np.quantile(s, 1.0 - p)


def filtered_bc_keep(
    final_rewards: Any, p: float = 0.1, require_positive: bool = True
) -> np.ndarray:
    """Filtered BC's trajectory filter: reward >= the (1 - p) quantile of rewards.

    With 0/1 rewards and more than 10% successes this keeps every success. The literal rule
    keeps every trajectory when none succeeded (the quantile is 0); ``require_positive``
    (default) also requires reward > 0, so a batch of failures is never imitated. Pass
    False to reproduce the literal rule.
    """
    r = _as_array(final_rewards, "final_rewards")
    keep = keep_top_fraction(r, p)
    return keep & (r > 0) if require_positive else keep


def awr_weights(
    advantages: Any, beta: float, max_weight: float | None = None
) -> np.ndarray:
    """Eq. 4.1 (AWR ablation): w = exp(A / beta), optionally capped at ``max_weight``.

    A = [0.50, 0.30, 0.15, 0.05, 0.00, -0.10, -0.30, -0.45]: with beta = 1 the best step
    carries 0.194 of the total weight; with beta = 0.05, 0.981 (uncapped).

    The actor's update uses each step's share w / sum(w) (a weighted mean of -log p), so
    only ratios matter, except under the cap: AWR's reference code (Peng et al. 2019,
    arXiv 1910.00177) clips at 20, which binds where A > beta * ln 20 (A > 0.60 for
    beta = 0.2); the spec's example at beta = 0.05 capped at 20 gives the best step
    0.313 of the weight (ESS 3.37) instead of 0.981 (ESS 1.04). The cap is applied to
    A / beta before the exponential, so a capped weight never overflows.

    Args:
        advantages: (N,) step advantages (Eq. 4.3 or the released grade).
        beta: temperature, > 0.
        max_weight: cap on each weight (> 0), or None.

    Returns:
        (N,) float64 weights, all > 0.
    """
    if not beta > 0 or not np.isfinite(beta):
        raise ValueError(f"beta must be positive and finite, got {beta}")
    z = _as_array(advantages, "advantages") / beta
    if max_weight is not None:
        if not max_weight > 0:
            raise ValueError(f"max_weight must be positive, got {max_weight}")
        z = np.minimum(z, np.log(max_weight) + 1.0)  # no overflow; the cap is exact below
    if np.any(z > 700):  # exp(710) overflows float64
        raise ValueError(f"exp(A / beta) overflows for beta = {beta}: set max_weight")
    w = np.exp(z)
    return np.minimum(w, max_weight) if max_weight is not None else w


def effective_sample_size(weights: Any) -> float:
    """Kish's effective sample size (sum w)^2 / sum w^2 (0 for all-zero weights)."""
    w = _as_array(weights, "weights")
    if np.any(w < 0):
        raise ValueError("weights must be non-negative")
    sq = float(np.sum(w * w))
    return float(np.sum(w)) ** 2 / sq if sq > 0 else 0.0


STEP_FILTERS = ("paper", "released", "none")
"""The step filters :func:`step_grades` knows (``DigiRLConfig.step_filter``)."""


def step_grades(values: Any, rewards: Any, mc: Any, horizon: int, step_filter: str = "paper",
                lam: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Per-step grades and the keep mask of one trajectory, by the chosen step filter:
    ``"paper"`` (Eq. 4.3, keep A > 1/H; ``values`` has T + 1 entries, V after the last step
    included), ``"released"`` (the released code's grade, keep grade > 0; ``mc`` are the
    Monte-Carlo returns) or ``"none"`` (the ablation without a step filter: every step kept;
    the grades are Eq. 4.3's, for display)."""
    v = np.asarray(values, dtype=np.float64)
    if step_filter in ("paper", "none"):
        a = step_advantage(v, rewards, lam=lam)
        keep = step_keep_mask(a, horizon) if step_filter == "paper" else np.ones(len(a), bool)
        return a, keep
    if step_filter == "released":
        a = step_advantage_released(v[:-1], v[1:], rewards, mc)
        return a, a > 0
    raise ValueError(f"step_filter must be one of {STEP_FILTERS}, got {step_filter!r}")
