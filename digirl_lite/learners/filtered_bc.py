"""Filtered BC, the paper's baseline: the trajectories whose reward is in the top ``top_p``
(every success), every valid step of them, maximum likelihood; no critics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from digirl_lite import filters
from digirl_lite.learners import register
from digirl_lite.learners.digirl import DigiRL

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.data.records import Step, Trajectory

__all__ = ["FilteredBC"]


@register("filtered_bc")
class FilteredBC(DigiRL):
    reads = ()
    critics = ()
    offline_work = "actor"

    @classmethod
    def check_config(cls, cfg) -> None:
        """Nothing of its own (its reward filter reads ``top_p``)."""

    @classmethod
    def keep_rule(cls, grader: Any) -> str:
        return "Filtered BC: a trajectory is kept when it succeeded, with every valid step"

    @classmethod
    def trajectory_keep(cls, rewards: np.ndarray, instr_advantages: np.ndarray,
                        top_p: float) -> np.ndarray:
        """Rewards at or above their 1 - ``top_p`` quantile: every success (no critic)."""
        return filters.filtered_bc_keep(rewards, p=top_p)

    @classmethod
    def step_keep(cls, step_ok: np.ndarray) -> np.ndarray:
        """Every step."""
        return np.ones(len(step_ok), dtype=bool)

    def keep_trajectories(self, usable: Sequence[Trajectory], rewards: np.ndarray
                          ) -> np.ndarray:
        return self.trajectory_keep(rewards, rewards, self.cfg.top_p)

    def choose_steps(self, kept: Sequence[Trajectory]
                     ) -> tuple[list[Step], np.ndarray | None, dict[str, Any]]:
        return [s for t in kept for s in t.steps if s.action.is_valid], None, {}
