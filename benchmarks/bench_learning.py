"""The learning benchmark of the main job: held-out success of the copier (the starting
policy), DigiRL offline, DigiRL offline-to-online and Filtered BC offline-to-online at the
same online budget, for several seeds, on the default simulated Web Shopping setup.

    python benchmarks/bench_learning.py --seeds 0 1 --out runs/bench      # runs, then table
    python benchmarks/bench_learning.py --seeds 0 1 --out runs/bench --table-only

Each seed is one `recipes/offline_to_online.py --filtered-bc --seed S` run (its own
process; ``--parallel`` runs the seeds side by side, one CPU thread each). Prints one row
per seed and the mean, with 95% intervals, and the time split of an online iteration.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
STAGES = (("digirl", "copier"), ("digirl", "offline"), ("digirl", "online"),
          ("filtered_bc", "offline"), ("filtered_bc", "online"))


def run_seeds(seeds: list[int], out: Path, parallel: bool, extra: list[str]) -> None:
    procs = []
    for s in seeds:
        run = out / f"seed{s}"
        cmd = [sys.executable, str(ROOT / "recipes" / "offline_to_online.py"), "--filtered-bc",
               "--seed", str(s), "--out", str(run), "--quiet", *extra]
        if (run / "checkpoints" / "latest").is_file():
            cmd.append("--resume")
        env = {**os.environ, "OMP_NUM_THREADS": "1"} if parallel else None
        run.mkdir(parents=True, exist_ok=True)
        log = open(run.with_suffix(".log"), "a")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        procs.append((s, p))
        if not parallel:
            p.wait()
    for s, p in procs:
        if p.wait() != 0:
            raise SystemExit(f"seed {s} failed (exit {p.returncode}); see {out}/seed{s}.log")


def table(seeds: list[int], out: Path) -> dict:
    rows = {}
    for s in seeds:
        d = json.loads((out / f"seed{s}" / "summary.json").read_text())
        f = json.loads((out / f"seed{s}" / "filtered_bc" / "summary.json").read_text())
        rows[s] = {"digirl": d, "filtered_bc": f}
    head = "seed  " + "  ".join(f"{a[:6]}/{st:<7}" for a, st in STAGES) + "  wall(min)"
    print(head)
    values = {k: [] for k in STAGES}
    for s, r in rows.items():
        cells = []
        for algo, stage in STAGES:
            rep = r[algo]["stages"][stage]
            values[(algo, stage)].append(rep["success_rate"])
            lo, hi = rep["ci95"]
            cells.append(f"{100 * rep['success_rate']:4.1f} [{100 * lo:2.0f}-{100 * hi:2.0f}]")
        print(f"{s:<5} " + "  ".join(f"{c:<14}" for c in cells)
              + f"  {r['digirl']['wall_s'] / 60:.1f} + {r['filtered_bc']['wall_s'] / 60:.1f}")
    print("mean  " + "  ".join(f"{100 * np.mean(v):4.1f}{'':<10}" for v in values.values()))
    # where an online iteration's time goes (DigiRL runs)
    splits = []
    for s in seeds:
        for line in (out / f"seed{s}" / "metrics.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r.get("stage") == "online" and "time_split" in r:
                splits.append({**r["time_split"], "total": r["seconds"]})
    if splits:
        keys = list(splits[0])
        print("online iteration time split (mean s): " + ", ".join(
            f"{k} {np.mean([x[k] for x in splits]):.2f}" for k in keys))
    return {str(s): {f"{a}/{st}": r[a]["stages"][st]["success_rate"] for a, st in STAGES}
            for s, r in rows.items()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--out", default="runs/bench")
    ap.add_argument("--parallel", action="store_true")
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--set", nargs="*", default=[], help="passed to the recipe")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if not args.table_only:
        run_seeds(args.seeds, out, args.parallel, ["--set", *args.set] if args.set else [])
    return table(args.seeds, out)


if __name__ == "__main__":
    main()
