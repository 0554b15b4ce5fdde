"""Filtered BC, the paper's baseline: the trajectories whose reward is in the top ``top_p``
(every success), every valid step of them, maximum likelihood; no critics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from digirl_lite import filters
from digirl_lite.learners.digirl import DigiRL

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.data.records import Step, Trajectory

__all__ = ["FilteredBC"]


class FilteredBC(DigiRL):
    name = "filtered_bc"
    uses_critics = False
    offline_work = "actor"

    def keep_trajectories(self, usable: Sequence[Trajectory], rewards: np.ndarray
                          ) -> np.ndarray:
        """Rewards at or above their 1 - ``top_p`` quantile: every success."""
        return filters.filtered_bc_keep(rewards, p=self.cfg.top_p)

    def choose_steps(self, kept: Sequence[Trajectory]
                     ) -> tuple[list[Step], np.ndarray | None, dict[str, Any]]:
        return [s for t in kept for s in t.steps if s.action.is_valid], None, {}
