"""The policy's updates: Eq. 4.2's maximum likelihood on chosen steps (the actor's update in
both the SFT of a starting policy and DigiRL's filtered imitation), and Darwin's token-level
PPO step (:func:`ppo_update`, spec/DARWIN.md A.5)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from digirl_lite.distributed import average_gradients

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.data.records import ScreenTable, Step

__all__ = ["steps_to_batch", "mle_update", "text_mle_update", "actor_precision",
           "cpu_has_native_bf16", "PPOBatch",
           "ppo_update", "pad_rows", "scoring_masks"]


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (avx512_bf16 or AMX). Without, torch
    emulates it: on the project's AMD EPYC (AVX2 only) an actor update of the main job's
    shapes took 11.7 s in bf16 against 1.1 s in fp32 (``benchmarks/bench_actor.py
    --bf16``, 1 thread); on an avx512_bf16 CPU 0.26 s against 0.42 s (issue 16)."""
    import torch.cpu

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, n, lambda: False)()) for n in probes)


@contextmanager
def actor_precision(policy, precision: str = "fp32"):
    """Run the updates inside under ``precision``: "fp32" as they are, "bf16" under
    ``torch.autocast`` to bfloat16 on the policy's device (weights, gradients, the optimizer
    and the log-softmax stay fp32; :meth:`AutoUIModel.action_token_log_probs` casts the
    logits up). On a CPU the model's attention is eager meanwhile: transformers' SDPA
    backward ran 6x slower in bf16 than in fp32 there (issue 16's profile).

    autocast's weight cache is off: with it on, the bf16 copy of each weight made at the
    region's first forward serves every later forward in the region, so every update after
    the first computed its gradient at the weights the region began with, not the ones the
    optimizer had moved to (issue 28: the main job's offline phase, 100s of updates in one
    region, took them all along its first gradient and fell from 60% to 0% held-out)."""
    if precision == "fp32":
        yield
        return
    if precision != "bf16":
        raise ValueError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
    model = policy.model
    device = next(model.parameters()).device.type
    impl = getattr(model.config, "_attn_implementation", None)
    switch = device == "cpu" and impl not in (None, "eager")
    if switch:
        model.set_attn_implementation("eager")
    try:
        with torch.autocast(device_type=device, dtype=torch.bfloat16, cache_enabled=False):
            yield
    finally:
        if switch:
            model.set_attn_implementation(impl)


def steps_to_batch(steps: Sequence[Step], screens: ScreenTable, policy=None):
    """Prompts, the screen each action was taken on as ``policy`` reads it
    (:func:`~digirl_lite.policy.base.policy_inputs`; None: (B, d) features), action
    strings."""
    from digirl_lite.policy.base import policy_inputs

    ids = [s.screen_id for s in steps]
    inputs = policy_inputs(policy, ids, screens) if policy is not None else screens.features(ids)
    return [s.prompt for s in steps], inputs, [s.action_text for s in steps]


def mle_update(policy, opt, steps: Sequence[Step], screens: ScreenTable,
               grad_clip: float | None, accelerator=None, accum: int = 1,
               weights=None) -> float:
    """Eq. 4.2: one maximum-likelihood update on ``steps`` (mean over steps); returns the loss.

    ``weights`` ((B,) non-negative, not all 0; None: all equal): the loss is the weighted
    mean sum(w * -log p) / sum(w), so each step counts by its share of the batch's weight
    (Eq. 4.1's AWR weights; weights 1 and 0 are Eq. 4.2's hard filter).

    With an Accelerate ``accelerator``: its backward (mixed precision), and under
    ``accelerate launch`` with several processes the gradients are averaged across them
    before clipping (each process brings its own steps: data parallel). ``accum``: the steps
    are split into this many minibatches whose gradients add up to the one update (the
    released code's gradient accumulation: the same update in less memory).
    """
    return text_mle_update(policy, opt, *steps_to_batch(steps, screens, policy), grad_clip,
                           accelerator, accum, weights)


def text_mle_update(policy, opt, prompts: Sequence[str], feats, actions: Sequence[str],
                    grad_clip: float | None, accelerator=None, accum: int = 1,
                    weights=None) -> float:
    """:func:`mle_update` on prompts, image features and target strings directly."""
    n = len(prompts)
    w = torch.full((n,), 1.0 / n, dtype=torch.float64) if n else None
    if weights is not None:
        w = torch.as_tensor(weights, dtype=torch.float64).reshape(-1)
        if len(w) != n or not bool(torch.isfinite(w).all()) or bool((w < 0).any()) \
                or float(w.sum()) <= 0:
            raise ValueError(f"weights must be {n} finite non-negative numbers, not all 0")
        w = w / w.sum()  # each step's share: the loss is sum(share * -log p)
    prompts, feats, actions, w = _merge_repeats(prompts, feats, actions, w)
    n = len(prompts)
    policy.model.train()
    opt.zero_grad()
    bounds = [round(i * n / accum) for i in range(accum + 1)] if accum > 1 else [0, n]
    total = 0.0
    for a, b in zip(bounds, bounds[1:]):
        if b <= a:
            continue
        lp = policy.log_prob(list(prompts[a:b]), feats[a:b], list(actions[a:b]))
        loss = -(w[a:b].to(device=lp.device, dtype=lp.dtype) * lp).sum()
        if accelerator is None:
            loss.backward()
        else:
            accelerator.backward(loss)
        total += float(loss.detach())
    params = list(policy.parameters())  # the trainable ones (a LoRA policy: its adapters)
    average_gradients(params)  # data parallel: the same step everywhere
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    opt.step()
    return total


def _merge_repeats(prompts, feats, actions, w):
    """One row per distinct (prompt, image features, action) with the summed share of its
    repeats: the same loss and gradient as the batch as drawn, for less work (a minibatch of
    128 drawn with replacement from the ~300 steps an online iteration keeps repeats about
    one step in six)."""
    import numpy as np

    if isinstance(feats, list):  # screenshots (a VLM's input): not merged
        return prompts, feats, actions, w
    f = np.asarray(feats.detach().cpu() if isinstance(feats, torch.Tensor) else feats)
    first: dict[tuple, int] = {}
    rows, share = [], []
    for i in range(len(prompts)):
        key = (prompts[i], actions[i], f[i].tobytes())
        j = first.setdefault(key, len(rows))
        if j == len(rows):
            rows.append(i)
            share.append(0.0)
        share[j] += float(w[i])
    if len(rows) == len(prompts):
        return prompts, feats, actions, w
    return ([prompts[i] for i in rows], feats[rows], [actions[i] for i in rows],
            torch.tensor(share, dtype=torch.float64))


class PPOBatch(NamedTuple):
    """What one PPO minibatch needs, per step (B rows) and per action token.

    ``token_ids``, ``old_log_probs``, ``advantages`` and ``returns`` hold one sequence per
    step, each as long as that step's action tokens (the behaviour policy's recorded
    log-probabilities: ``Step.action_log_probs``; advantages and value targets from
    :func:`digirl_lite.ppo.token_gae`, or GRPO's trajectory advantage on every token with no
    value targets: ``returns`` None). ``weights``: one per step, how much each of its tokens
    counts in the policy loss and the KL (None: every token alike, a token mean).
    ``ref_log_probs``: per token, the KL penalty's reference policy's log-probabilities
    (None: the recorded ones, i.e. the KL to the sampling policy). ``typed``: per step, the
    texts its episode typed before it (the copy mask's ``copy_once`` reads them).
    """

    prompts: Sequence[str]
    feats: object  # (B, d) image features
    token_ids: Sequence[Sequence[int]]
    old_log_probs: Sequence[Sequence[float]]
    advantages: Sequence[Sequence[float]]
    returns: Sequence[Sequence[float]] | None
    weights: Sequence[float] | None = None
    ref_log_probs: Sequence[Sequence[float]] | None = None
    typed: Sequence[Sequence[str]] | None = None


def scoring_masks(masks: Any, typed: Sequence[Sequence[str]] | None) -> dict[str, Any]:
    """The keywords that score recorded tokens under the sampling's ``masks`` (none when
    the sampling put none: every policy scores that way)."""
    if masks is None or not masks.active:
        return {}
    return {"masks": masks, "typed": typed}


def pad_rows(rows: Sequence[Sequence[float]], width: int, device) -> torch.Tensor:
    """(len(rows), width) float32 on ``device``: each ragged row left-aligned, 0 after."""
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.as_tensor(list(r), dtype=torch.float32)
    return out.to(device)


def ppo_update(policy, opt, batch: PPOBatch, *, clip_eps: float = 0.2,
               value_coef: float = 0.5, kl_coef: float = 0.0,
               grad_clip: float | None = 1.0, update_policy: bool = True,
               negative_scale: float = 1.0, value_grad_clip: float | None = None,
               masks: Any = None) -> dict[str, float]:
    """One token-level PPO step (DARWIN.md A.5): the clipped surrogate on the ratio of the
    policy's log-probability of each sampled token to the recorded one, plus
    ``value_coef`` times the value head's MSE to the returns, plus ``kl_coef`` times the
    k3 estimate of KL(policy || reference) (``batch.ref_log_probs``, else the behaviour
    policy); each a mean over the batch's tokens (the policy loss and the KL weighted by
    ``batch.weights`` where given: a weighted mean).

    ``negative_scale`` multiplies every negative advantage (1: the plain objective; 0: only
    better-than-expected tokens are pushed). ``grad_clip`` caps the gradient norm of the
    policy's weights, and of the value head's with them unless ``value_grad_clip`` caps the
    value head's apart (one global cap lets the value loss take the policy's share).

    ``masks``: the :class:`~digirl_lite.policy.base.Masks` the steps were sampled under
    (the grammar, the copy mask); the new log-probabilities are scored under them too, so
    the ratio is 1 before the update (None: sampled without masks).

    ``update_policy=False`` is the critic warm-up (A.6): only the value loss, and only the
    value head steps (the optimizer's other parameters get no gradient).

    Returns:
        ``policy_loss``, ``value_loss``, ``kl`` (k3 to the behaviour policy, mean),
        ``kl_ref`` (k3 to ``batch.ref_log_probs``; NaN without them), ``clip_fraction``
        (tokens whose ratio left [1 - eps, 1 + eps]), ``ratio_max``, ``ratio_min``, and the
        gradient norms before any cap: ``grad_norm_policy`` and ``grad_norm_value``.
    """
    from digirl_lite.ppo import kl_k3, ppo_clip_loss

    n = len(batch.prompts)
    if not (len(batch.token_ids) == len(batch.old_log_probs) == len(batch.advantages) == n):
        raise ValueError("a PPO batch has one token_ids, old_log_probs and advantages row per "
                         "prompt")
    for i, (ids, lp, adv) in enumerate(zip(batch.token_ids, batch.old_log_probs,
                                           batch.advantages)):
        if not (len(ids) == len(lp) == len(adv)) or not ids:
            raise ValueError(f"row {i}: {len(ids)} tokens, {len(lp)} recorded log-probs and "
                             f"{len(adv)} advantages (they must match, and be at least 1)")
    if batch.weights is not None and (len(batch.weights) != n
                                      or not all(w > 0 for w in batch.weights)):
        raise ValueError(f"a PPO batch has one positive weight per row, got "
                         f"{list(batch.weights)} for {n} rows")
    if batch.returns is None and (value_coef and not update_policy):
        raise ValueError("the critic warm-up needs value targets (returns)")
    if not 0.0 <= negative_scale <= 1.0:
        raise ValueError(f"negative_scale must be in [0, 1], got {negative_scale}")
    policy.model.train()
    opt.zero_grad()
    new_lp, values, mask = policy.token_ids_log_probs_and_values(
        list(batch.prompts), batch.feats, list(batch.token_ids),
        **scoring_masks(masks, batch.typed))
    width, dev = mask.shape[1], mask.device
    m = mask.to(new_lp.dtype)
    n_tok = m.sum().clamp(min=1.0)
    old = pad_rows(batch.old_log_probs, width, dev)
    adv = pad_rows(batch.advantages, width, dev)
    if negative_scale != 1.0:
        adv = torch.where(adv < 0, adv * negative_scale, adv)
    log_ratio = (new_lp - old) * m
    ratio = log_ratio.exp()
    w = m  # each token's weight in the policy loss and the KL
    if batch.weights is not None:
        w = m * torch.as_tensor(list(batch.weights), dtype=m.dtype, device=dev)[:, None]
    w_sum = w.sum().clamp(min=1e-12)
    pol = (ppo_clip_loss(ratio, adv, clip_eps) * w).sum() / w_sum
    kl = (kl_k3(new_lp, old) * w).sum() / w_sum
    kl_ref = torch.full((), float("nan"))
    if batch.ref_log_probs is not None:
        kl_ref = (kl_k3(new_lp, pad_rows(batch.ref_log_probs, width, dev)) * w).sum() / w_sum
    val = torch.zeros((), device=dev)
    if batch.returns is not None:
        ret = pad_rows(batch.returns, width, dev)
        val = (((values - ret) ** 2) * m).sum() / n_tok
    loss = value_coef * val
    if update_policy:
        loss = loss + pol + kl_coef * (kl if batch.ref_log_probs is None else kl_ref)
    loss.backward()
    actor = list(policy.parameters())
    head = list(policy.value_head.parameters())
    if not update_policy:
        for p in actor:
            p.grad = None  # the actor is frozen during the warm-up
    average_gradients(actor + head)
    norm_actor, norm_head = _grad_norm(actor), _grad_norm(head)
    if grad_clip and value_grad_clip:
        torch.nn.utils.clip_grad_norm_(actor, grad_clip)
        torch.nn.utils.clip_grad_norm_(head, value_grad_clip)
    elif grad_clip:
        torch.nn.utils.clip_grad_norm_(actor + head, grad_clip)
    opt.step()
    with torch.no_grad():
        clipped = ((ratio - 1.0).abs() > clip_eps) & mask.bool()
        return {"policy_loss": float(pol), "value_loss": float(val), "kl": float(kl),
                "kl_ref": float(kl_ref), "clip_fraction": float(clipped.sum() / n_tok),
                "ratio_max": float(ratio[mask.bool()].max()),
                "ratio_min": float(ratio[mask.bool()].min()),
                "grad_norm_policy": norm_actor, "grad_norm_value": norm_head}


def _grad_norm(params) -> float:
    """The L2 norm of ``params``' gradients together (0 where none has one)."""
    grads = [p.grad.detach().float().norm() for p in params if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(grads))) if grads else 0.0
