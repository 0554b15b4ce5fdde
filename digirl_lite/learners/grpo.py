"""GRPO (spec/DARWIN.md A.5's simple alternative to PPO): each task drawn ``grpo_group``
times per iteration; the group's standardised rewards go to every token of each attempt;
PPO's clipped update on them, with no value head and no offline phase but
``offline_policy_passes`` (the pile grouped by task)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from digirl_lite.learners.ppo import PPO

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.data.records import Trajectory

__all__ = ["GRPO"]


class GRPO(PPO):
    name = "grpo"
    own_offline_work = "nothing (GRPO)"
    value_coef_applies = False

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
            info.update(self.run._timed("offline_actor", lambda: self.train_on_policy(
                pile, passes=self.cfg.offline_policy_passes)))
        return info
