"""AWR, the paper's Eq. 4.1 ablation: DigiRL's critics and instruction filter, then every
valid step of a kept trajectory, weighted by exp(A / ``awr_beta``) (capped at
``awr_max_weight``), A the grade ``step_filter`` names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from digirl_lite import filters
from digirl_lite.learners.digirl import DigiRL

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.data.records import Step, Trajectory

__all__ = ["AWR"]


class AWR(DigiRL):
    name = "awr"

    def choose_steps(self, kept: Sequence[Trajectory]
                     ) -> tuple[list[Step], np.ndarray | None, dict[str, Any]]:
        c = self.cfg
        steps: list[Step] = []
        grades: list[float] = []
        for t, a, _ in self.step_grades(kept):  # Eq. 4.1: every step, weighted
            for s, g in zip(t.steps, a):
                if s.action.is_valid:
                    steps.append(s)
                    grades.append(float(g))
        if not steps:
            return steps, None, {}
        w = filters.awr_weights(grades, c.awr_beta, c.awr_max_weight)
        info: dict[str, Any] = {"awr_ess": round(filters.effective_sample_size(w), 2)}
        if c.awr_max_weight is not None:
            info["awr_capped"] = int(np.sum(w >= c.awr_max_weight))
        return steps, w, info
