"""Quickstart: what digirl_lite can run today (the foundation and the simulated phone).

Collects a seeded pile of attempts on the built-in simulated phone (the copier of clean
demonstrations, scored by the oracle judge), stores it (HF datasets on disk), reads it back,
exports it to Parquet and to the reference code's layout, and applies the paper's
instruction filter (Eq. 4.4) with a tabular instruction critic (each task's success rate in
the pile) and the Filtered BC filter. The main job (offline phase + online iterations)
replaces this recipe when the trainer lands.

    python recipes/quickstart.py --out runs/quickstart --n 528
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from digirl_lite import filters
from digirl_lite.data import ReplayBuffer, TrajectoryStore, load_trajectories
from digirl_lite.data.released import export_released
from digirl_lite.envs.sim.demos import generate_pile


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/quickstart", help="output folder (made if absent)")
    ap.add_argument("--n", type=int, default=528, help="trajectories (528: Web Shopping pile)")
    ap.add_argument("--world", choices=["webshop", "general"], default="webshop")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    out = Path(args.out)
    t0 = time.perf_counter()
    trajs, screens, _ = generate_pile(args.world, n=args.n, seed=args.seed)
    store_dir = out / f"pile-{args.world}-n{args.n}-seed{args.seed}"
    store = TrajectoryStore.create(store_dir, screens.feature_dim, exist_ok=True)
    if len(store) == 0:
        store.append(trajs, screens)
    loaded, loaded_screens = load_trajectories(store_dir)
    if [t.traj_id for t in loaded] != [t.traj_id for t in trajs]:
        raise SystemExit(f"{store_dir} holds another pile; remove it or pick another --out")
    store.export_parquet(out / "parquet")
    export_released(loaded, loaded_screens, out / "released_layout.pt")

    buf = ReplayBuffer(capacity=5000, seed=args.seed)
    buf.add(loaded)
    usable = buf.trajectories("all")
    # Tabular instruction critic: V(c) = the task's success rate among usable trajectories.
    by_task: dict[str, list[float]] = defaultdict(list)
    for t in usable:
        by_task[t.task].append(t.final_reward)
    v_instr = np.array([np.mean(by_task[t.task]) for t in usable])
    r = np.array([t.final_reward for t in usable])
    kept_44 = filters.keep_top_fraction(filters.instruction_advantage(r, v_instr), p=0.1)
    kept_bc = filters.filtered_bc_keep(r)
    report = {
        "trajectories": len(loaded),
        "steps": sum(len(t) for t in loaded),
        "distinct_screens": len(loaded_screens),
        "endings": dict(Counter(t.ending.value for t in loaded)),
        "invalid_actions": sum(not s.action.is_valid for t in loaded for s in t.steps),
        "buffer": buf.counts(),
        "eq44_kept": int(kept_44.sum()),
        "filtered_bc_kept": int(kept_bc.sum()),
        "seconds": round(time.perf_counter() - t0, 2),
        "store": str(store_dir),
    }
    (out / "summary.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
