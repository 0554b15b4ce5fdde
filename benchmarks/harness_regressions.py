"""E2's regression counts (issue 30), from the harness_webshop grid's run records.

For every run in ``benchmarks/results/harness/evolve_runs/<arm>-seed<S>/``: held-out success
per stage, who decided the evolved harness's steps, and two counts of regressions:

- accepted children that lost a task of their parent's solved set (the parent's screening
  solved set and lineage solved set, against the child's screening solved set plus the tasks
  its probe kept or the parent missed too), from ``archive.json``;
- held-out tasks the frozen policy solved that the evolved harness failed (the frozen stage
  of the gate arm's run at the same seed: the same tasks, seeds and sampling noise).

    python benchmarks/harness_regressions.py
    python benchmarks/harness_regressions.py --runs benchmarks/results/harness/darwinx_b_runs \
        --reference all        # setting (b) of issue 48, item 4 (E2 rerun)

``--reference``: the arm whose runs measured the frozen stage (the others share it by common
random numbers at the same seed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RUNS = Path(__file__).resolve().parent / "results" / "harness" / "evolve_runs"


def accepted_losses(archive: dict) -> int:
    nodes = archive["nodes"]
    by_id = {n["id"]: n for n in nodes}
    lost = 0
    for n in nodes[1:]:
        if not n["accepted"]:
            continue
        p = by_id[n["parent"]]
        ps = {t for t, r in (p["screen"] or {}).items() if r >= 0.5} | set(p["lineage_solved"])
        cs = set(n["solved"])
        if n["probe"]:
            cs |= set(n["probe"]["kept"]) | set(n["probe"]["parent_missed"])
        lost += len(ps - cs)
    return lost


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=RUNS, help="<arm>-seed<S>/ run records")
    ap.add_argument("--reference", default="gate", help="the arm that measured frozen")
    args = ap.parse_args(argv)
    runs = args.runs
    frozen = {}
    for d in sorted(runs.glob(f"{args.reference}-seed*")):
        frozen[d.name.split("-")[1]] = json.loads((d / "summary.json").read_text())[
            "stages"]["frozen"]["per_task"]
    rows = []
    for d in sorted(runs.iterdir()):
        s = json.loads((d / "summary.json").read_text())
        arm, seed = d.name.rsplit("-", 1)
        ev = s["stages"]["evolved"]
        fr = frozen.get(seed, {})
        row = {"arm": arm, "seed": seed,
               "held_out": {k: round(100 * v["success_rate"], 1) for k, v in s["stages"].items()},
               "decided": {k: round(100 * v, 1) for k, v in ev["decided"].items()},
               "accepted_children_losses": accepted_losses(json.loads(
                   (d / "archive.json").read_text())),
               "held_out_lost_vs_frozen": sum(1 for t, v in fr.items()
                                              if v and ev["per_task"].get(t) is False),
               "held_out_gained_vs_frozen": sum(1 for t, v in ev["per_task"].items()
                                                if v and fr.get(t) is False),
               "edits": [e["content"][:60] for e in s["evolution"]["edits"]]}
        rows.append(row)
        print(json.dumps(row))
    return rows


if __name__ == "__main__":
    main()
