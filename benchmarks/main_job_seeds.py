"""What the main job shows over seeds (issue 47, item 6): its three stages and held-out splits
per seed, their means with 95% t-intervals, and the paired differences offline - start and
online - offline, from the run folders' ``summary.json``.

    for s in 0 1 2 3 4; do python recipes/offline_to_online.py --seed $s --cache-dir '' \\
        --quiet --out runs/main5/seed$s; done
    python benchmarks/main_job_seeds.py runs/main5/seed* \\
        --out benchmarks/results/main_job_seeds.json

Rates are the environment's true rates (the simulator's own check), in %.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

STAGES = ("copier", "offline", "online")


def _rate(rec: dict[str, Any]) -> float:
    r = rec.get("true_success_rate")
    return 100 * (r if r is not None else rec["success_rate"])


def per_seed(summary: dict[str, Any]) -> dict[str, dict[str, float]]:
    """{stage: {"test": %, split: %, ...}} of one run."""
    out = {}
    for st in STAGES:
        rec = summary["stages"][st]
        row = {"test": round(_rate(rec), 2)}
        row.update({k: round(_rate(v), 2) for k, v in rec.get("splits", {}).items()})
        row["success_with_recovery"] = rec.get("success_with_recovery")
        out[st] = row
    return out


def table(runs: dict[int, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """Means with 95% t-intervals per stage and list, and the paired stage differences."""
    from digirl_lite.viz.curves import mean_ci95

    def ci(values: list[float]) -> list[float]:
        return [round(x, 1) if x == x else None for x in mean_ci95(values)]

    seeds = sorted(runs)
    lists = [k for k in runs[seeds[0]]["copier"] if k != "success_with_recovery"]
    means = {st: {k: ci([runs[s][st][k] for s in seeds]) for k in lists} for st in STAGES}
    pairs = {f"{b} - {a}": {k: ci([runs[s][b][k] - runs[s][a][k] for s in seeds])
                            for k in lists}
             for a, b in (("copier", "offline"), ("offline", "online"))}
    gaps = {st: {k: ci([runs[s][st][k] - runs[s][st]["test"] for s in seeds])
                 for k in lists if k != "test"} for st in STAGES}
    return {"seeds": seeds, "mean_ci95": means, "paired": pairs, "split_minus_test": gaps}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders (each with summary.json)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    runs, meta = {}, {}
    for d in args.runs:
        summary = json.loads((d / "summary.json").read_text())
        seed = summary["config"]["seed"]
        runs[seed] = per_seed(summary)
        meta[seed] = {"wall_s": summary.get("wall_s"), "processes": summary.get("processes"),
                      "timings_s": summary.get("timings_s"),
                      # CPU kernels and library versions: other ones give other numbers
                      "environment": summary.get("environment")}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=args.runs[0]).stdout.strip()
    res = {"what": __doc__.split("\n\n")[0], "runs_commit": commit or None,
           "per_seed": runs, "runs": meta, **table(runs)}
    print(json.dumps({k: res[k] for k in ("mean_ci95", "paired", "split_minus_test")},
                     indent=1))
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
