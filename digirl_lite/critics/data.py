"""From trajectories to critic batches, and from critics back to the values the filters use.

Labels (spec/DIGIRL.md section 5): every state of a trajectory is labelled "final verdict > 0"
(the released code's ``mc_return > 0``, the same thing with sparse rewards and gamma > 0); the
instruction critic gets one label per trajectory. Only :attr:`Trajectory.is_usable`
trajectories give labels: an infrastructure truncation or an unjudged step says nothing about
the agent, and a false 0 would teach the critics that the task is harder than it is.

State s_h of a T-step trajectory (h = 0 .. T) is the pair (text, two frames):
- text: the prompt the policy saw at step h; for s_T, the prompt it would see next
  (``build_prompt(task, last action)``);
- frames: ``Trajectory.state_frames()`` stacked by ``ScreenTable.stack`` into (2 d_i,).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from digirl_lite.data.records import Ending, ScreenTable, Trajectory
from digirl_lite.prompts import build_prompt

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.critics.heads import InstructionCritic, StepCritic
    from digirl_lite.critics.text import EmbeddingCache

__all__ = [
    "StepBatch",
    "InstructionBatch",
    "state_texts",
    "buffer_texts",
    "step_batches",
    "instruction_batch",
    "critic_values",
    "critic_values_many",
    "instruction_values",
]


class StepBatch(NamedTuple):
    """A batch of steps for the step critic (B rows, one per step h)."""

    text: torch.Tensor
    """(B, d_t) embedding of the prompt at s_h."""
    img2: torch.Tensor
    """(B, 2 d_i) two-frame state at s_h: ``screens.stack(prev, cur)``."""
    label: torch.Tensor
    """(B,) float32, 1.0 where the trajectory's final reward > 0."""
    next_text: torch.Tensor | None = None
    """(B, d_t) embedding at s_{h+1} (``with_next=True`` only)."""
    next_img2: torch.Tensor | None = None
    """(B, 2 d_i) two-frame state at s_{h+1} (``with_next=True`` only)."""
    last: torch.Tensor | None = None
    """(B,) float32, 1.0 where s_{h+1} is the state after the last step (``with_next``)."""


class InstructionBatch(NamedTuple):
    """One row per usable trajectory, for the instruction critic."""

    text: torch.Tensor
    """(N, d_t) embedding of the task."""
    label: torch.Tensor
    """(N,) float32, 1.0 where the final reward > 0."""
    traj_ids: tuple[str, ...]


def state_texts(trajectory: Trajectory) -> list[str]:
    """The T + 1 texts of states s_0 .. s_T (prompts; s_T: the prompt that would come next)."""
    steps = trajectory.steps
    if not steps:
        return []
    return [s.prompt for s in steps] + [build_prompt(trajectory.task, steps[-1].action_text)]


def buffer_texts(trajectories: Iterable[Trajectory]) -> set[str]:
    """Every text the critics may embed for these trajectories: the tasks and the state texts
    (:func:`state_texts`), what an :class:`EmbeddingCache` pruned to a buffer must keep."""
    out: set[str] = set()
    for t in trajectories:
        out.add(t.task)
        out.update(state_texts(t))
    return out


def _labelled(trajectories: Iterable[Trajectory]) -> list[Trajectory]:
    return [t for t in trajectories if t.is_usable and t.steps]


def step_batches(
    trajectories: Iterable[Trajectory],
    screens: ScreenTable,
    text_cache: EmbeddingCache,
    batch_size: int = 128,
    rng: np.random.Generator | int | None = None,
    *,
    shuffle: bool = True,
    drop_last: bool = False,
    with_next: bool = False,
    device: str | torch.device | None = None,
) -> Iterator[StepBatch]:
    """One pass over every step of the usable trajectories, in batches.

    Args:
        trajectories: the buffer (unusable ones are skipped: no labels from them).
        screens: the screen table holding every referenced screen's features.
        text_cache: embeddings of the prompts (computed once per distinct prompt).
        batch_size: rows per batch (the last one may be smaller unless ``drop_last``).
        rng: a numpy Generator or a seed, for the shuffle.
        shuffle: shuffle the steps across trajectories.
        drop_last: drop a final partial batch.
        with_next: also fill ``next_text``/``next_img2``/``last`` for s_{h+1} (Eq. 4.3's
            V(s_{h+1}); the released code also fits them to the same label).
        device: move the tensors there (default: stay on the CPU).

    Yields:
        :class:`StepBatch`. Prompts not yet in ``text_cache`` are encoded up front, in one
        call, so every batch is answered from memory.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    texts: list[str] = []
    prev: list[str] = []
    cur: list[str] = []
    label: list[float] = []
    nxt: list[int] = []  # flat index of s_{h+1} in the per-state arrays below
    last: list[float] = []
    s_texts: list[str] = []
    s_prev: list[str] = []
    s_cur: list[str] = []
    for t in _labelled(trajectories):
        p, c = t.state_frames()  # T + 1 each
        st = state_texts(t)
        base = len(s_texts)
        s_texts += st
        s_prev += p
        s_cur += c
        T = len(t.steps)
        texts += st[:T]
        prev += p[:T]
        cur += c[:T]
        label += [1.0 if t.final_reward > 0 else 0.0] * T
        nxt += range(base + 1, base + T + 1)
        last += [0.0] * (T - 1) + [1.0]
    n = len(texts)
    text_cache.warm(s_texts if with_next else texts)  # every new prompt in one encode call
    order = np.random.default_rng(rng).permutation(n) if shuffle else np.arange(n)
    labels = torch.tensor(label, dtype=torch.float32)
    lasts = torch.tensor(last, dtype=torch.float32)

    def put(x: torch.Tensor) -> torch.Tensor:
        return x if device is None else x.to(device)

    for start in range(0, n, batch_size):
        idx = order[start:start + batch_size]
        if drop_last and len(idx) < batch_size:
            break
        ix = idx.tolist()
        batch = StepBatch(
            text=put(text_cache.get([texts[i] for i in ix])),  # (B, d_t)
            img2=put(torch.from_numpy(screens.stack([prev[i] for i in ix],
                                                    [cur[i] for i in ix]))),  # (B, 2 d_i)
            label=put(labels[idx]),
        )
        if with_next:
            nx = [nxt[i] for i in ix]
            batch = batch._replace(
                next_text=put(text_cache.get([s_texts[j] for j in nx])),
                next_img2=put(torch.from_numpy(screens.stack([s_prev[j] for j in nx],
                                                             [s_cur[j] for j in nx]))),
                last=put(lasts[idx]),
            )
        yield batch


def instruction_batch(
    trajectories: Iterable[Trajectory],
    text_cache: EmbeddingCache,
    device: str | torch.device | None = None,
) -> InstructionBatch:
    """Task embeddings and final verdicts of the usable trajectories (one row each)."""
    ts = _labelled(trajectories)
    text = text_cache.get([t.task for t in ts])  # (N, d_t)
    label = torch.tensor([1.0 if t.final_reward > 0 else 0.0 for t in ts], dtype=torch.float32)
    if device is not None:
        text, label = text.to(device), label.to(device)
    return InstructionBatch(text=text, label=label, traj_ids=tuple(t.traj_id for t in ts))


def _param_device(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


def critic_values_many(
    trajectories: Sequence[Trajectory],
    screens: ScreenTable,
    text_cache: EmbeddingCache,
    step_critic: StepCritic,
    *,
    bootstrap: Iterable[Ending | str] = (),
    batch_size: int = 1024,
) -> list[np.ndarray]:
    """:func:`critic_values` for many trajectories, in a few large forward passes."""
    boot = {Ending(e) for e in bootstrap}
    texts: list[str] = []
    prev: list[str] = []
    cur: list[str] = []
    spans: list[tuple[int, int, bool]] = []  # (first row, T, evaluate s_T)
    for t in trajectories:
        if not t.steps:
            raise ValueError(f"trajectory {t.traj_id!r} has no steps: no states to value")
        p, c = t.state_frames()
        st = state_texts(t)
        T = len(t.steps)
        k = T + 1 if t.ending in boot else T
        spans.append((len(texts), T, k > T))
        texts += st[:k]
        prev += p[:k]
        cur += c[:k]
    dev = _param_device(step_critic)
    vals = np.empty(len(texts), dtype=np.float64)
    with torch.no_grad():
        for s in range(0, len(texts), batch_size):
            e = s + batch_size
            v = step_critic.value(
                text_cache.get(texts[s:e]).to(dev),
                torch.from_numpy(screens.stack(prev[s:e], cur[s:e])).to(dev),
            )
            vals[s:s + len(v)] = v.double().cpu().numpy()
    out = []
    for first, T, boot_last in spans:
        v = np.zeros(T + 1)
        v[:T + boot_last] = vals[first:first + T + boot_last]
        out.append(v)
    return out


def critic_values(
    trajectory: Trajectory,
    screens: ScreenTable,
    text_cache: EmbeddingCache,
    step_critic: StepCritic,
    *,
    bootstrap: Iterable[Ending | str] = (),
) -> np.ndarray:
    """V_step(s_0) .. V_step(s_T): (T + 1,) float64, ready for ``filters.step_advantage``.

    V(s_T), the value after the last step, is 0 (spec/DIGIRL.md section 6) for every ending
    not in ``bootstrap``: successes and agent stops terminated; a budget run cannot earn
    anything after H either; an infrastructure truncation is treated as terminal, which
    learned faster than bootstrapping in Darwin (spec/DARWIN.md A.6).

    Args:
        trajectory: one trajectory with at least one step.
        screens: its screens' features.
        text_cache: prompt embeddings.
        step_critic: the critic (its value: min over the two heads).
        bootstrap: endings whose V(s_T) is the critic's own estimate instead of 0, e.g.
            ``(Ending.BUDGET,)`` to treat the step budget as a time-limit truncation, or
            every ending for the released code's form (its ``nv`` is never masked).
    """
    return critic_values_many([trajectory], screens, text_cache, step_critic,
                              bootstrap=bootstrap)[0]


def instruction_values(
    trajectories: Sequence[Trajectory],
    text_cache: EmbeddingCache,
    instruction_critic: InstructionCritic,
) -> np.ndarray:
    """V_instruct(task) per trajectory, (N,) float64, ready for ``filters.instruction_advantage``.

    Every trajectory given gets a value (the Eq. 4.4 filter scores the whole buffer; which
    ones may be kept is the caller's decision).
    """
    if not trajectories:
        return np.zeros(0)
    dev = _param_device(instruction_critic)
    with torch.no_grad():
        v = instruction_critic.value(text_cache.get([t.task for t in trajectories]).to(dev))
    return v.double().cpu().numpy()
