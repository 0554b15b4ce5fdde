"""Merging complementary variants of one ancestor: H0 (+) Delta_1 (+) Delta_2
(:func:`merge_harness`), kept only when the child solves the union of their solved sets.
Inside a run GEPA's merge step does this
(:meth:`~digirl_lite.harness.darwinx.DarwinX.propose_merge`); across runs, :func:`merge`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from digirl_lite.harness.gate import avg_at_k, solved_set
from digirl_lite.harness.harness import Edit, EditError, Harness
from digirl_lite.harness.runner import HarnessRunner, Outcome

__all__ = ["merge_harness", "merge"]


def merge_harness(variants: Sequence[Harness]) -> Harness:
    """H0 (+) (Delta_1 (+) ... (+) Delta_n): the variants' edits in order, an edit two of
    them share taken once. ValueError when they are fewer than two or do not share their
    H0; :class:`EditError` when the edits do not combine."""
    if len(variants) < 2:
        raise ValueError("a merge needs two variants or more")
    base = variants[0].base
    if any(v.base != base for v in variants):
        raise ValueError("the variants do not share their H0")
    edits: list[Edit] = []
    seen: set[tuple[str, str]] = set()
    for v in variants:
        for e in v.edits:
            if (e.kind, e.content) not in seen:
                seen.add((e.kind, e.content))
                edits.append(e)
    return Harness(dict(base), []).extend(edits)


def merge(runner: HarnessRunner, variants: Sequence[Harness], tasks: Sequence[str],
          solved_sets: Sequence[set[str]], *, k: int = 3, seed: int = 0) -> dict[str, Any]:
    """Merge complementary variants of one ancestor outside a run (:func:`merge_harness`),
    e.g. variants evolved by separate runs. Kept only when the child solves the union of
    their solved sets (avg@k >= 1/2 on each task of it, at ``k`` episodes from seed
    ``seed``). Returns the child, its rates and the verdict. Inside a run, GEPA's merge
    step does this (``DarwinX(merges=...)``)."""
    try:
        child = merge_harness(variants)
    except EditError as e:
        return {"kept": False, "reason": f"the edits do not combine: {e}", "child": None}
    union = set().union(*solved_sets)
    outs: list[Outcome] = []
    for j in range(k):
        outs += runner.run(child.components, list(tasks), seed + 1000 * j)
    rates = avg_at_k(outs)
    solved = solved_set(rates)
    missing = sorted(union - solved)
    return {"kept": not missing, "child": child.as_dict(), "rates": rates,
            "solved": sorted(solved), "union": sorted(union), "missing": missing,
            "reason": "covers the union" if not missing else f"misses {missing}"}
