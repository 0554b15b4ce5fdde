"""GRPO (spec/DARWIN.md A.5's simple alternative to PPO): each task drawn ``grpo_group``
times per iteration; the group's standardised rewards go to every token of each attempt;
PPO's clipped update on them, with no value head and no offline phase but
``offline_policy_passes`` (the pile grouped by task)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from digirl_lite.errors import ConfigError
from digirl_lite.learners import register
from digirl_lite.learners.ppo import ON_POLICY_FIELDS, PPO

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.data.records import Trajectory
    from digirl_lite.policy.on_policy import PPORow

__all__ = ["GRPO"]


@register("grpo")
class GRPO(PPO):
    reads = (*ON_POLICY_FIELDS, "grpo_group", "grpo_groups")
    defaults = {"actor_lr": 1e-5, "policy_loss_norm": "trajectory", "offline_imitation": True}
    """Issue 28: PPO's rate, and "trajectory" (every group's advantages sum to 0, as
    GRPO's do by construction; see the config's ``policy_loss_norm``)."""
    own_offline_work = "nothing (GRPO)"
    value_coef_applies = False

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.rollouts_per_iteration % cfg.grpo_group:
            raise ValueError(f"rollouts_per_iteration ({cfg.rollouts_per_iteration}) must be "
                             f"a multiple of grpo_group ({cfg.grpo_group}): GRPO draws each "
                             "task grpo_group times")
        if cfg.learner == "async":
            raise ConfigError("learner='async' with algorithm='grpo': the learner takes "
                              "trajectories as they complete, which splits a task's group "
                              "of grpo_group attempts; use algorithm 'ppo' (or learner 'sync')")

    @classmethod
    def grades_note(cls, grader: Any, checkpoint: str) -> str:
        return (f"GRPO from checkpoint {checkpoint}: GRPO has no value head, so no per-step "
                "values. A = the "
                "trajectory's reward standardised within its group (this stage's trajectories of "
                "the same task), given to every token; evaluation draws each task once, so a "
                "group of one has A = 0. logp = the recorded log-probability of the action.")

    def draw_tasks(self, n_tasks: int, n: int) -> np.ndarray:
        """``n / grpo_group`` tasks, each ``grpo_group`` times in a row (a group)."""
        g = self.cfg.grpo_group
        return np.repeat(self.rng.integers(0, n_tasks, n // g), g)

    @classmethod
    def token_rows(cls, trajs: Sequence[Trajectory], policy, screens, *, gamma: float,
                   lam: float, monte_carlo: bool = False,
                   groups: dict[str, Any] | None = None) -> list[PPORow]:
        """GRPO's rows (:func:`~digirl_lite.policy.on_policy.group_rows`: the group's
        standardised reward on every token; ``screens``, ``gamma``, ``lam`` and
        ``monte_carlo`` unused)."""
        from digirl_lite.policy.on_policy import group_rows

        return group_rows(trajs, policy, groups)

    def actor_param_groups(self) -> list[dict[str, Any]]:
        return [{"params": list(self.policy.parameters())}]

    def groups(self, trajs: Sequence[Trajectory]) -> dict[str, Any] | None:
        """By draw (``grpo_groups="draw"``: :func:`~digirl_lite.policy.on_policy.draw_groups`)
        or by task (None)."""
        from digirl_lite.policy.on_policy import draw_groups

        c = self.cfg
        return draw_groups(trajs, c.grpo_group) if c.grpo_groups == "draw" else None

    def offline(self, pile: Sequence[Trajectory]) -> dict[str, Any]:
        info = self.imitate(pile)
        if self.cfg.offline_policy_passes:
            info.update(self.run.timed("offline_actor", lambda: self.train_on_policy(
                pile, passes=self.cfg.offline_policy_passes)))
        return info
