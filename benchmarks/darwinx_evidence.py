"""E1 by evidence kind (issue 48, item 4), from a DarwinX grid's result files alone.

For each arm of a harness grid (``benchmarks/grids/darwinx_*.json``): the evolved harness's
held-out success minus the frozen policy's, seed by seed (the frozen stage is the reference
arm's at the same seed: the same tasks, env seeds and common random numbers), with a 95%
t-interval, on the test list and on each held-out split; the frozen policy's solved tasks the
evolved harness lost (``per_task``); the share of steps decided by rules, in all and per task
kind; and the kept edits. Writes ``evidence.md`` and ``evidence.json`` beside the grid's
results.

    python benchmarks/darwinx_evidence.py darwinx_b_webshop
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gridlib.repo import RESULTS  # noqa: E402
from benchmarks.gridlib.results import load_results  # noqa: E402
from benchmarks.gridlib.spec import load_spec  # noqa: E402


def _rate(stage: dict[str, Any]) -> float:
    """The environment's own check where the run has it, else the judge's."""
    return stage.get("true_success_rate", stage["success_rate"]) \
        if stage.get("truth") == "environment" else stage["success_rate"]


def _ci(xs: list[float]) -> dict[str, Any]:
    from digirl_lite.viz.curves import mean_ci95

    m, lo, hi = mean_ci95(xs)
    return {"per_seed": xs, "mean": m, "ci95": [lo, hi]}


def edit_family(edit_id: str | None) -> str:
    """An induced rule's family: its id less the hash (``ind-dismiss-09769e`` ->
    ``ind-dismiss``)."""
    if not edit_id:
        return "(not a rule)"
    head, _, tail = edit_id.rpartition("-")
    return head if head and len(tail) == 6 else edit_id


def evidence_table(grid: str, results_dir: Path = RESULTS) -> dict[str, Any]:
    spec = load_spec(grid)
    results = load_results(results_dir, spec)
    ref = {r["seed"]: r for r in results.get(spec.reference, [])}
    arms: dict[str, Any] = {}
    for arm in spec.arms:
        recs = [r for r in results.get(arm.name, []) if r["seed"] in ref
                and "evolved" in r["stages"] and "frozen" in ref[r["seed"]]["stages"]]
        if not recs:
            continue
        gains, frozen, evolved, lost, gained = [], [], [], [], []
        splits: dict[str, list[float]] = {}
        rules: list[float] = []
        kinds: dict[str, list[float]] = {}
        families: Counter[str] = Counter()
        for r in recs:
            f, e = ref[r["seed"]]["stages"]["frozen"], r["stages"]["evolved"]
            frozen.append(_rate(f))
            evolved.append(_rate(e))
            gains.append(_rate(e) - _rate(f))
            for name, sp in (e.get("splits") or {}).items():
                fs = (f.get("splits") or {}).get(name)
                if fs:
                    splits.setdefault(name, []).append(_rate(sp) - _rate(fs))
            fp, ep = f.get("per_task", {}), e.get("per_task", {})
            lost.append(sorted(t for t, v in fp.items() if v and ep.get(t) is False))
            gained.append(sorted(t for t, v in ep.items() if v and fp.get(t) is False))
            rules.append(e.get("decided", {}).get("rule", float("nan")))
            for k, d in (e.get("decided_by_kind") or {}).items():
                kinds.setdefault(k, []).append(d["rule"])
            families.update(edit_family(x.get("id"))
                            for x in (r.get("evolution") or {}).get("edits", []))
        arms[arm.name] = {
            "evidence": (r := recs[0])["config"].get("evidence"),
            "accept": r["config"].get("accept"), "seeds": [x["seed"] for x in recs],
            "frozen": _ci(frozen), "evolved": _ci(evolved), "gain": _ci(gains),
            "split_gain": {k: _ci(v) for k, v in splits.items()},
            "frozen_solved_lost": lost, "gained": [len(g) for g in gained],
            "rule_share": _ci(rules),
            "rule_share_by_kind": {k: sum(v) / len(v) for k, v in sorted(kinds.items())},
            "kept_edit_families": dict(families.most_common()),
            "commits": sorted({x.get("git", {}).get("commit", "?")[:10] for x in recs}),
        }
    return {"grid": spec.name, "reference": spec.reference, "arms": arms}


def _pct(d: dict[str, Any]) -> str:
    lo, hi = d["ci95"]
    ci = f" [{100 * lo:+.1f}, {100 * hi:+.1f}]" if lo == lo else ""
    return f"{100 * d['mean']:+.1f}{ci}"


def markdown(t: dict[str, Any]) -> str:
    split_names = list(dict.fromkeys(n for a in t["arms"].values() for n in a["split_gain"]))
    head = ("| arm | evidence | accept | seeds | frozen | evolved | evolved - frozen | "
            + " | ".join(f"- on {n}" for n in split_names)
            + (" | " if split_names else "")
            + "frozen's solved lost | rules decided | rules per task kind | kept rules |")
    rows = [f"# E1 by evidence kind: `{t['grid']}`", "",
            "Held-out success in %, the environment's own check; differences in points, "
            "seed by seed, mean with a 95% t-interval; the frozen stage is the reference "
            f"arm's (`{t['reference']}`) at the same seed. *Lost*: tasks the frozen policy "
            "solved that the evolved harness failed, per seed. *Rules decided*: share of "
            "the evolved harness's test-list steps a rule decided (mean over seeds).", "",
            head, "|" + "---|" * (head.count("|") - 1)]
    for name, a in t["arms"].items():
        rows.append(
            f"| {name} | {' + '.join(a['evidence'] or [])} | {a['accept']} | "
            f"{len(a['seeds'])} | {100 * a['frozen']['mean']:.1f} | "
            f"{100 * a['evolved']['mean']:.1f} | {_pct(a['gain'])} | "
            + "".join(f"{_pct(a['split_gain'][n]) if n in a['split_gain'] else '-'} | "
                      for n in split_names)
            + f"{', '.join(str(len(x)) for x in a['frozen_solved_lost'])} | "
            f"{100 * a['rule_share']['mean']:.1f}% | "
            + ", ".join(f"{k} {100 * v:.0f}%" for k, v in a["rule_share_by_kind"].items())
            + " | " + ", ".join(f"{k} x{v}" for k, v in a["kept_edit_families"].items())
            + " |")
    commits = sorted({c for a in t["arms"].values() for c in a["commits"]})
    rows += ["", f"Code: commit(s) {', '.join(commits)}."
             + (" MIXED CODE: these arms did not all run on one commit." if len(commits) > 1
                else ""), ""]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid")
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    t = evidence_table(args.grid, args.results)
    out = args.results / t["grid"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "evidence.json").write_text(json.dumps(t, indent=1, default=float) + "\n")
    md = markdown(t)
    (out / "evidence.md").write_text(md)
    print(md)
    return t


if __name__ == "__main__":
    main()
