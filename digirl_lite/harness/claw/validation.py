"""Causal validation: the same tasks at the same seeds run with and without a unit, and
what it causes (relevance c first, then effect e and efficiency eta; S by :func:`score`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from digirl_lite.harness.claw.units import DEFAULT_WEIGHTS, ExperienceUnit, score


# ---------------------------------------------------------------------------------------
# causal validation
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ValidationEpisode:
    """One episode of a validation run: its task and seed, success (None: an infrastructure
    fault cut it; it counts in no rate), its length, its invalid steps, and ``hits``: the
    rule ids that acted in it (a step with ``decided_by == "rule:<id>"``; a unit's rule id
    is ``eu:<unit id>``).

    Named ``Outcome`` before issue 50; :class:`digirl_lite.harness.runner.Outcome` is the
    harness runner's fuller record of an episode (a :data:`Runner` may return either)."""

    task: str
    seed: int
    success: bool | None
    steps: int = 0
    invalid: int = 0
    hits: frozenset[str] = frozenset()

    @property
    def infra(self) -> bool:
        return self.success is None


Runner = Callable[[str, Sequence[tuple[str, int]]], Sequence[Any]]
"""``runner(extra_rules_text, tasks_seeds) -> outcomes``: every (task, seed) played once
with the harness plus ``extra_rules_text`` (rule lines), one outcome each."""


def _hits(o: Any) -> set[str]:
    """Rule ids that acted in an outcome: its ``hits``, or the ``rule:<id>`` keys of a
    ``decided`` count (:class:`digirl_lite.harness.runner.Outcome`)."""
    if hasattr(o, "hits"):
        return set(o.hits)
    return {k[len("rule:"):] for k, n in (getattr(o, "decided", None) or {}).items()
            if k.startswith("rule:") and n}


def _ok(o: Any) -> bool:
    return o.success is not None and not getattr(o, "infra", False)


@dataclass(frozen=True)
class Validation:
    """One unit's causal validation. ``relevant``: its rule acted in some episode (else no
    verdict: e and eta are 0 and mean nothing). ``hits`` of ``episodes``; ``pairs``: the
    (task, seed) pairs compared; ``rate_with`` / ``rate_without`` and ``invalid_with`` /
    ``invalid_without`` (invalid actions per step) on them."""

    eu_id: str
    relevant: bool
    e: float
    c: float
    eta: float
    S: float
    hits: int = 0
    episodes: int = 0
    pairs: int = 0
    rate_with: float = 0.0
    rate_without: float = 0.0
    invalid_with: float = 0.0
    invalid_without: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def validate(eu: ExperienceUnit, runner: Runner, tasks_seeds: Sequence[tuple[str, int]],
             weights: Sequence[float] = DEFAULT_WEIGHTS,
             baseline: Sequence[Any] | None = None) -> Validation:
    """Run the same tasks at the same seeds without and with ``eu`` (its rule alone on top
    of the runner's harness) and measure what it causes.

    c = share of the with-unit episodes in which its rule acted; c = 0: not relevant, no
    verdict. On the (task, seed) pairs it acted in: e = completion rate with minus
    without; eta = invalid actions per step without minus with. S = :func:`score`.
    ``baseline``: the outcomes of ``runner("", tasks_seeds)`` when already run (a cycle
    shares one among its units). Episodes an infrastructure fault cut count nowhere.
    """
    ts = [(str(t), int(s)) for t, s in tasks_seeds]
    if len(set(ts)) != len(ts):
        raise ValueError("tasks_seeds holds a (task, seed) pair twice: a pair is one episode")
    base = list(baseline) if baseline is not None else list(runner("", ts))
    with_ = list(runner(eu.to_rule().line() + "\n", ts))
    ok_with = [o for o in with_ if _ok(o)]
    hit = {(o.task, o.seed) for o in ok_with if eu.rule_id in _hits(o)}
    n = len(ok_with)
    c = len(hit) / n if n else 0.0
    if not hit:
        return Validation(eu.id, False, 0.0, 0.0, 0.0, score(0.0, 0.0, 0.0, weights),
                          0, n)
    w_by = {(o.task, o.seed): o for o in ok_with}
    b_by = {(o.task, o.seed): o for o in base if _ok(o)}
    pairs = sorted(k for k in hit if k in b_by)
    if not pairs:
        return Validation(eu.id, True, 0.0, c, 0.0, score(0.0, c, 0.0, weights), len(hit), n)

    def rate(by: dict) -> float:
        return sum(bool(by[k].success) for k in pairs) / len(pairs)

    def invalid(by: dict) -> float:
        steps = sum(by[k].steps for k in pairs)
        return sum(by[k].invalid for k in pairs) / steps if steps else 0.0

    rw, rb, iw, ib = rate(w_by), rate(b_by), invalid(w_by), invalid(b_by)
    e, eta = rw - rb, ib - iw
    return Validation(eu.id, True, e, c, eta, score(e, c, eta, weights), len(hit), n,
                      len(pairs), rw, rb, iw, ib)
