"""AWR, the paper's Eq. 4.1 ablation: DigiRL's critics and instruction filter, then every
valid step of a kept trajectory, weighted by exp(A / ``awr_beta``) (capped at
``awr_max_weight``), A the grade ``step_filter`` names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from digirl_lite import filters
from digirl_lite.learners import register
from digirl_lite.learners.digirl import DigiRL

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.data.records import Step, Trajectory

__all__ = ["AWR"]


@register("awr")
class AWR(DigiRL):
    reads = (*DigiRL.reads, "awr_beta", "awr_max_weight")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if not 0 < cfg.awr_beta < float("inf"):
            raise ValueError(f"awr_beta must be positive, got {cfg.awr_beta}")
        if cfg.awr_max_weight is not None and not 0 < cfg.awr_max_weight < float("inf"):
            raise ValueError(f"awr_max_weight must be positive or None, got "
                             f"{cfg.awr_max_weight}")
        if cfg.step_filter == "none":
            raise ValueError("step_filter='none' with algorithm='awr': AWR weights steps by "
                             "their advantage; use step_filter 'paper' or 'released'")

    @classmethod
    def carry_over(cls, fields: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
        """``step_filter`` "none" (refused: nothing to weight) back at its default."""
        if fields.get("step_filter") == "none":
            return {**fields, "step_filter": defaults["step_filter"]}
        return fields

    @classmethod
    def step_keep(cls, step_ok: np.ndarray) -> np.ndarray:
        """Every step (weighted by its grade, dropped by none)."""
        return np.ones(len(step_ok), dtype=bool)

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
