"""The table's numbers over seeds: per arm and stage, the mean of the per-seed rates with a
95% t-interval and the pooled rate with a Wilson interval (:func:`stage_stats`), the held-out
splits and their gaps (:func:`split_stats`), seed-by-seed differences between arms
(:func:`paired_difference`, :func:`pair_differences`), and the paired runs that ran on
different code, thread counts or environments (:func:`mixed_commits`, :func:`mixed_threads`,
:func:`mixed_environments`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .provenance import run_versions, version_label
from .spec import GridSpec


def _nanmean(xs: list[float | None]) -> float:
    v = [x for x in xs if x is not None and x == x]
    return sum(v) / len(v) if v else float("nan")


def stage_stats(records: list[dict[str, Any]], stage: str) -> dict[str, Any] | None:
    """One arm's stage over its seeds: the mean of the per-seed success rates with a 95%
    t-interval; the pooled rate over seeds x tasks with a Wilson 95% interval; the mean
    length of all successful episodes; the failure kinds summed; the mean invalid-step
    rate (seeds that report one)."""
    from digirl_lite.judge.calibration import wilson_interval
    from digirl_lite.viz.curves import mean_ci95

    rows = [(r["seed"], r["stages"][stage]) for r in records if stage in r["stages"]]
    if not rows:
        return None
    m, lo, hi = mean_ci95([x["success_rate"] for _, x in rows])
    wins = sum(int(x["successes"]) for _, x in rows)
    n = sum(int(x["n"]) for _, x in rows)
    plo, phi = wilson_interval(wins, n)
    # a seed without successes has no success length (NaN in summary.json): it adds none
    length = sum(x["mean_length_success"] * x["successes"] for _, x in rows
                 if x["successes"])
    kinds: dict[str, int] = {}
    for _, x in rows:
        for k, v in x.get("failure_kinds", {}).items():
            kinds[k] = kinds.get(k, 0) + int(v)
    inv = [x["invalid_step_rate"] for _, x in rows if "invalid_step_rate" in x]
    days = {x.get("day") for _, x in rows}
    true = _true_stats([x for _, x in rows])
    return {"seeds": [s for s, _ in rows], "n_seeds": len(rows),
            "per_seed": [x["success_rate"] for _, x in rows],
            "mean": m, "ci95_seeds": [max(0.0, lo), min(1.0, hi)] if lo == lo else [lo, hi],
            "pooled": wins / n if n else float("nan"), "successes": wins, "n": n,
            "ci95_pooled": [plo, phi],
            "mean_length_success": length / wins if wins else float("nan"),
            "failure_kinds": kinds,
            "invalid_step_rate": _nanmean(inv) if inv else None,
            "day": days.pop() if len(days) == 1 else None,  # the drift day, where all agree
            **({"true": true} if true else {})}


def _true_stats(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The environment's truth over the seeds that have one (issue 32): the mean of their
    true rates with a 95% t-interval, the pooled true rate with a Wilson interval, and the
    judge's pooled accuracy against it; None where no seed has a truth."""
    from digirl_lite.judge.calibration import wilson_interval
    from digirl_lite.viz.curves import mean_ci95

    rows = [x for x in rows if x.get("truth") == "environment" and x.get("true_episodes")]
    if not rows:
        return None
    m, lo, hi = mean_ci95([x["true_success_rate"] for x in rows])
    k = sum(int(x["true_successes"]) for x in rows)
    n = sum(int(x["true_episodes"]) for x in rows)
    agree = [x["judge_agreement"] for x in rows if x.get("judge_agreement")]
    right = sum(a["judged_success"]["true_success"] + a["judged_failure"]["true_failure"]
                for a in agree)
    judged = sum(a["episodes"] for a in agree)
    return {"n_seeds": len(rows), "mean": m,
            "ci95_seeds": [max(0.0, lo), min(1.0, hi)] if lo == lo else [lo, hi],
            "pooled": k / n, "successes": k, "n": n,
            "ci95_pooled": list(wilson_interval(k, n)),
            "judge_accuracy": right / judged if judged else float("nan")}


def split_stats(records: list[dict[str, Any]], stage: str) -> dict[str, Any] | None:
    """One arm's stage on its held-out splits (issue 32 item 5), over the seeds whose stage
    has them: the test list's and each split's mean rate with a 95% t-interval, and each
    split's gap to the test list (split - test, seed by seed, mean with a 95% t-interval).
    ``rate``: "true" (the environment's check) where every one of these rows has a truth,
    else "judged"; None where no seed has splits."""
    from digirl_lite.viz.curves import mean_ci95

    rows = [(r["seed"], r["stages"][stage]) for r in records
            if r["stages"].get(stage, {}).get("splits")]
    if not rows:
        return None
    true = all(x.get("truth") == "environment"
               for _, st in rows for x in (st, *st["splits"].values()))
    key = "true_success_rate" if true else "success_rate"

    def over_seeds(per_seed: dict[int, float]) -> dict[str, Any]:
        m, lo, hi = mean_ci95(list(per_seed.values()))
        return {"seeds": sorted(per_seed), "per_seed": list(per_seed.values()), "mean": m,
                "ci95_seeds": [max(0.0, lo), min(1.0, hi)] if lo == lo else [lo, hi]}

    test = {s: st[key] for s, st in rows}
    out = {"rate": "true" if true else "judged", "test": over_seeds(test), "splits": {}}
    for name in dict.fromkeys(n for _, st in rows for n in st["splits"]):
        per = {s: st["splits"][name][key] for s, st in rows if name in st["splits"]}
        gm, glo, ghi = mean_ci95([per[s] - test[s] for s in per])
        out["splits"][name] = {**over_seeds(per), "gap": {"mean": gm, "ci95": [glo, ghi]}}
    return out


def paired_difference(a: list[dict[str, Any]], b: list[dict[str, Any]], stage: str
                      ) -> dict[str, Any] | None:
    """Arm ``a`` minus arm ``b`` at ``stage``, seed by seed (seeds both have): the mean
    difference of success rates with a 95% t-interval."""
    return seed_contrast([(1, a), (-1, b)], stage)


def seed_contrast(terms: list[tuple[int, list[dict[str, Any]]]], stage: str
                  ) -> dict[str, Any] | None:
    """The sum of ``sign * success rate`` over the ``(sign, arm's results)`` terms at
    ``stage``, seed by seed (seeds every term has): its mean with a 95% t-interval."""
    from digirl_lite.viz.curves import mean_ci95

    rates = [{r["seed"]: r["stages"][stage]["success_rate"] for r in recs
              if stage in r["stages"]} for _, recs in terms]
    seeds = sorted(set.intersection(*(set(r) for r in rates))) if rates else []
    if not seeds:
        return None
    m, lo, hi = mean_ci95([sum(sign * r[s] for (sign, _), r in zip(terms, rates))
                           for s in seeds])
    return {"seeds": seeds, "mean": m, "ci95": [lo, hi]}


def pair_differences(spec: GridSpec, results: dict[str, list[dict[str, Any]]]
                     ) -> dict[str, Any]:
    """The spec's ``pairs`` (arm minus its reference, seed by seed) and, for every two of
    them, the difference between their differences (``(a - b) - (c - d)``), per stage."""
    from itertools import combinations

    have = [(a, b) for a, b in spec.pairs if a in results and b in results]
    out: dict[str, Any] = {}
    for a, b in have:
        out[f"{a} - {b}"] = {st: seed_contrast([(1, results[a]), (-1, results[b])], st)
                             for st in spec.stages}
    for (a, b), (c, d) in combinations(have, 2):
        terms = [(1, results[a]), (-1, results[b]), (-1, results[c]), (1, results[d])]
        out[f"({a} - {b}) - ({c} - {d})"] = {st: seed_contrast(terms, st)
                                             for st in spec.stages}
    return out


def _paired_runs(results: dict[str, list[dict[str, Any]]], ref: str | None,
                 pairs: Sequence[tuple[str, str]] = ()
                 ) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(arm, reference arm, run, reference run) for every run the tables pair: the
    differences from the reference, and the spec's ``pairs``, at the same seed."""
    compared = [(name, ref) for name in results if ref in results and name != ref]
    compared += [p for p in pairs if p not in compared and set(p) <= set(results)]
    out = []
    for name, other_arm in compared:
        by_seed = {r["seed"]: r for r in results[other_arm]}
        out += [(name, other_arm, r, by_seed[r["seed"]]) for r in results[name]
                if r["seed"] in by_seed]
    return out


def mixed_commits(results: dict[str, list[dict[str, Any]]], ref: str | None,
                  pairs: Sequence[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    """The pairs of the differences from the reference, and of the spec's ``pairs`` (an
    arm's run and its reference's at the same seed), whose runs ran on different code
    (:func:`run_versions`), each with the commits of both."""
    out = []
    for name, other_arm, r, other in _paired_runs(results, ref, pairs):
        mine, theirs = run_versions(r), run_versions(other)
        if len(mine) > 1 or {k for _, k in mine} != {k for _, k in theirs}:
            out.append({"arm": name, "seed": r["seed"], "commit": version_label(r),
                        "reference": other_arm, "reference_commit": version_label(other)})
    return out


def run_threads(rec: dict[str, Any]) -> list[int]:
    """The thread counts (``OMP_NUM_THREADS``) a result's run ran with, over its attempts."""
    got = [a.get("threads") for a in rec.get("attempts") or []] or [rec.get("omp_threads")]
    return sorted({int(t) for t in got if t is not None})


def mixed_threads(results: dict[str, list[dict[str, Any]]], ref: str | None,
                  pairs: Sequence[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    """The paired runs (as :func:`mixed_commits`) that ran with different thread counts:
    torch's CPU reductions then sum in another order, and two runs of one seed part ways
    as they would on different code. A run whose threads are not recorded is not listed."""
    out = []
    for name, other_arm, r, other in _paired_runs(results, ref, pairs):
        mine, theirs = run_threads(r), run_threads(other)
        if mine and theirs and (len(mine) > 1 or mine != theirs):
            out.append({"arm": name, "seed": r["seed"], "threads": mine,
                        "reference": other_arm, "reference_threads": theirs})
    return out


def environment_differences(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """What differs between two recorded environments (``summary.json``'s ``environment``,
    :func:`digirl_lite.provenance.environment`), as ``"name mine vs theirs"``."""
    flat = [({**a.get("packages", {}), **{k: v for k, v in a.items() if k != "packages"}})
            for a in (mine, theirs)]
    return [f"{k} {flat[0].get(k)} vs {flat[1].get(k)}"
            for k in sorted(set(flat[0]) | set(flat[1])) if flat[0].get(k) != flat[1].get(k)]


def mixed_environments(results: dict[str, list[dict[str, Any]]], ref: str | None,
                       pairs: Sequence[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    """The paired runs (as :func:`mixed_commits`) recorded in different environments: other
    CPU kernels (torch dispatches by the instruction set) or other versions of the
    libraries that compute or draw the numbers (Pillow 13 shrinks the phone's screens to
    other pixels). Two runs of one seed then part ways as on different code. A run with no
    recorded environment (before it was recorded) is not listed."""
    out = []
    for name, other_arm, r, other in _paired_runs(results, ref, pairs):
        mine, theirs = r.get("environment"), other.get("environment")
        if mine and theirs and (differ := environment_differences(mine, theirs)):
            out.append({"arm": name, "seed": r["seed"], "reference": other_arm,
                        "differ": differ})
    return out
