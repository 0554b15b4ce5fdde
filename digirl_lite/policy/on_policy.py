"""The rows Darwin's learner trains on (PPO and GRPO), as functions of a policy: each step's
token ids, the value head's per-token values, and token-level advantages and returns.

PPO's rows are :func:`gae_rows`, GRPO's :func:`group_rows`: each learner
(:meth:`digirl_lite.learners.ppo.PPO.token_rows`) calls its own with its policy and screens,
and the viewer (:class:`digirl_lite.viz.OnPolicyGrader`) calls the learner's with a run's
checkpoint, so what the report shows is what the learner computes. The math is
:mod:`digirl_lite.ppo`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.data.records import ScreenTable, Step, Trajectory

__all__ = ["PPORow", "typed_before", "text_token_ids", "token_ids", "token_values",
           "gae_rows", "group_rows", "draw_groups"]


class PPORow(NamedTuple):
    """One step for :func:`~digirl_lite.policy.updates.ppo_update`.

    Attributes:
        step: the step.
        token_ids: the action's token ids (as sampled, else its text's tokenisation).
        log_probs: the recorded log-probability of each token (zeros where none was
            recorded: such rows are not trained on).
        advantages: per token (PPO: token-level GAE; GRPO: the trajectory's group advantage).
        returns: per token, ``advantages + values`` (PPO); empty under GRPO.
        values: per token, the value head's values (PPO); empty under GRPO.
        traj_id: the step's trajectory (``policy_loss_norm="trajectory"`` weighs each
            trajectory's tokens together).
        typed: the texts the step's episode typed before it (the copy mask's
            ``typed_span_once`` reads them: :class:`~digirl_lite.policy.base.Masks`).
    """

    step: Step
    token_ids: tuple[int, ...]
    log_probs: list[float]
    advantages: list[float]
    returns: list[float]
    values: list[float]
    traj_id: str = ""
    typed: tuple[str, ...] = ()


def typed_before(trajectory: Trajectory) -> list[tuple[str, ...]]:
    """Per step of ``trajectory``, the texts its TYPE actions typed before that step (what
    the sampling agent's copy mask was given: :class:`~digirl_lite.train.trainer.
    PolicyBatchAgent`)."""
    from digirl_lite.actions import ActionType

    out, done = [], []
    for s in trajectory.steps:
        out.append(tuple(done))
        if s.action.action_type == ActionType.TYPE:
            done.append(s.action.typed_text)
    return out


def text_token_ids(policy, texts: Sequence[str]) -> list[tuple[int, ...]]:
    """Each string's tokenisation by ``policy``'s tokenizer (eos included, no pads)."""
    if not texts:
        return []
    return policy.action_token_ids(list(texts))


def token_ids(policy, steps: Sequence[Step]) -> list[tuple[int, ...]]:
    """Each step's sampled token ids; steps recorded without them (a pile cached by an older
    version, scripted agents) get their text's tokenisation (:func:`text_token_ids`)."""
    ids = iter(text_token_ids(policy, [s.action_text for s in steps if not s.action_token_ids]))
    return [s.action_token_ids or next(ids) for s in steps]


def token_values(policy, steps: Sequence[Step], ids: Sequence[Sequence[int]],
                 screens: ScreenTable) -> list[np.ndarray]:
    """The value head's per-token values of ``steps`` (no gradient), one array each."""
    import torch

    from digirl_lite.policy.updates import steps_to_batch

    out: list[np.ndarray] = []
    with torch.no_grad():
        for a in range(0, len(steps), 64):
            chunk = steps[a:a + 64]
            prompts, feats, _ = steps_to_batch(chunk, screens, policy)
            _, v, _ = policy.token_ids_log_probs_and_values(prompts, feats, ids[a:a + 64])
            out += [v[i, :len(t)].float().cpu().numpy() for i, t in enumerate(ids[a:a + 64])]
    return out


def draw_groups(trajs: Sequence[Trajectory], group_size: int) -> dict[str, tuple[str, int]]:
    """GRPO's groups by draw: each trajectory's (task, draw), the draw being the index of
    its episode in the iteration (the ``-{k:05d}`` ending of an online trajectory id: the
    fleets number episodes in task order, and an iteration's tasks are each drawn
    ``group_size`` times in a row) divided by ``group_size``. A task drawn twice in one
    iteration makes two groups, not one of twice the size. Trajectories that are not an
    online iteration's (the pile's attempts, each task drawn once per attempt), or whose id
    has no such ending, group by task alone."""
    from digirl_lite.data.records import Source

    out: dict[str, tuple[str, int]] = {}
    for t in trajs:
        tail = t.traj_id.rsplit("-", 1)[-1]
        draw = tail.isdigit() and t.source is Source.ONLINE
        out[t.traj_id] = (t.task, int(tail) // group_size if draw else -1)
    return out


def gae_rows(trajs: Sequence[Trajectory], policy, screens: ScreenTable, *,
             gamma: float = 0.99, lam: float = 0.95, monte_carlo: bool = False
             ) -> list[PPORow]:
    """PPO's :class:`PPORow` per step of ``trajs``: token-level GAE
    (:func:`digirl_lite.ppo.token_gae`) on the value head's values; every trajectory is
    terminal (value 0 after its last step), an infrastructure truncation included (Darwin
    A.6). A trajectory with an unjudged step is left out (its reward is unknown).

    Args:
        trajs: the trajectories.
        policy: an :class:`~digirl_lite.policy.AutoUIPolicy` (its tokenizer and value head).
        screens: the trajectories' screens, with features.
        gamma: PPO's discount across steps (the run's ``ppo_gamma``).
        lam: GAE's lambda (the run's ``ppo_lam``).
        monte_carlo: lambda 1 instead of ``lam`` (the returns no longer depend on the
            values: the warm-up's targets).
    """
    from digirl_lite import ppo

    trajs = [t for t in trajs if t.steps and t.num_unjudged == 0]
    steps = [s for t in trajs for s in t.steps]
    ids = token_ids(policy, steps)
    values = token_values(policy, steps, ids, screens)
    rows, k = [], 0
    for t in trajs:
        n_steps = len(t.steps)
        v = np.concatenate(values[k:k + n_steps])
        lengths = [len(x) for x in ids[k:k + n_steps]]
        adv, ret = ppo.token_gae(v, t.rewards, lengths, gamma, 1.0 if monte_carlo else lam)
        bounds = np.cumsum([0, *lengths])
        for j, (s, typed) in enumerate(zip(t.steps, typed_before(t))):
            a, b = bounds[j], bounds[j + 1]
            rows.append(PPORow(s, ids[k + j], list(s.action_log_probs) or [0.0] * (b - a),
                               adv[a:b].tolist(), ret[a:b].tolist(), v[a:b].tolist(),
                               t.traj_id, typed))
        k += n_steps
    return rows


def group_rows(trajs: Sequence[Trajectory], policy, groups: dict[str, Any] | None = None
               ) -> list[PPORow]:
    """GRPO's :class:`PPORow` per step of ``trajs``: the trajectories of one group
    (``groups``: a key per trajectory id, e.g. :func:`draw_groups`; None: by task) share
    their standardised rewards, on every token (no returns, no values). A device's fault is
    not the agent's failure (Darwin A.3): an infrastructure truncation would enter its
    group at reward 0 and be pushed down, so it is left out; so is a trajectory with an
    unjudged step (its reward is unknown).

    Args:
        trajs: the trajectories.
        policy: the policy (its tokenizer).
        groups: GRPO's group of each trajectory id (None: its task).
    """
    from digirl_lite import ppo

    trajs = [t for t in trajs if t.steps and t.num_unjudged == 0
             and not t.is_infra_truncated]
    ids = token_ids(policy, [s for t in trajs for s in t.steps])
    members: dict[Any, list[Trajectory]] = {}
    for t in trajs:
        members.setdefault(t.task if groups is None else groups[t.traj_id], []).append(t)
    adv_of = {}
    for group in members.values():
        a = ppo.grpo_advantages([t.final_reward for t in group])
        adv_of.update({t.traj_id: float(x) for t, x in zip(group, a)})
    rows, k = [], 0
    for t in trajs:
        for s, typed in zip(t.steps, typed_before(t)):
            n = len(ids[k])
            rows.append(PPORow(s, ids[k], list(s.action_log_probs) or [0.0] * n,
                               [adv_of[t.traj_id]] * n, [], [], t.traj_id, typed))
            k += 1
    return rows
