"""DarwinX's arithmetic: fitness as avg@k per task, the gate, solved sets and the kinds of
child (spec/DARWIN.md B's worked numbers are the tests). Used by the loop
(:mod:`digirl_lite.harness.darwinx`), GEPA's hooks (:mod:`.gepa_hooks`) and the merge
(:mod:`.merging`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from digirl_lite.harness.runner import Outcome

__all__ = ["SOLVED", "GateResult", "gate", "solved_set", "classify", "avg_at_k"]

SOLVED = 0.5
"""A task is solved by a variant when its avg@k is at least this (spec: p_t >= 1/2)."""


@dataclass(frozen=True)
class GateResult:
    deltas: tuple[float, ...]
    g: float
    R: float
    passed: bool


def gate(parent: Sequence[float], child: Sequence[float], delta: float) -> GateResult:
    """Delta_t = p_t(c) - p_t(p); g = sum Delta_t; R = sum max(0, -Delta_t); promoted iff
    g > 0 and R <= delta (a tolerance of 1e-9 for rates that are sums of thirds)."""
    if len(parent) != len(child):
        raise ValueError(f"{len(parent)} parent rates, {len(child)} child rates")
    d = tuple(float(c) - float(p) for p, c in zip(parent, child))
    g = sum(d)
    r = sum(max(0.0, -x) for x in d)
    return GateResult(d, g, r, g > 1e-9 and r <= delta + 1e-9)


def solved_set(rates: dict[str, float], threshold: float = SOLVED) -> set[str]:
    """The tasks whose rate is at least ``threshold``."""
    return {t for t, p in rates.items() if p >= threshold - 1e-9}


def classify(parent_solved: set[str], child_solved: set[str], accepted: bool) -> str:
    """By solved set: ``improver`` (all the parent solved and more), ``neutral`` (the same
    set), ``stepping_stone`` (solves new tasks, loses some: never an ancestor under the
    gate, it gives lessons to the memory) or ``archived`` (lost tasks and gained none, or a
    rejected child that lost nothing). A child that lost tasks keeps that kind when an
    acceptance rule other than the gate took it (E2 counts them)."""
    new = child_solved - parent_solved
    lost = parent_solved - child_solved
    if new and lost:
        return "stepping_stone"
    if lost or not accepted:
        return "archived"
    return "improver" if new else "neutral"


def avg_at_k(outcomes: Sequence[Outcome]) -> dict[str, float]:
    """Per-task success rate over the episodes an infrastructure fault did not cut (a task
    with none left has no rate)."""
    wins: dict[str, list[bool]] = {}
    for o in outcomes:
        if not o.infra:
            wins.setdefault(o.task, []).append(bool(o.success))
    return {t: sum(w) / len(w) for t, w in wins.items()}
