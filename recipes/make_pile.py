"""Regenerate the stored pile and the demonstrations, deterministically from a seed.

    python recipes/make_pile.py --world webshop --seed 0 --out runs/piles
    python recipes/make_pile.py --world general --seed 0 --out runs/piles

Writes ``OUT/{world}-seed{seed}/pile`` (the copier's attempts, paper sizes: Web Shopping 528,
General 608) and ``.../demos`` (clean expert demonstrations) as trajectory stores, and
``stats.json``. Screenshots are stored at 270 x 570 (4x smaller per side), once per screen.

The trainer's pile is the *starting policy's* own attempts (as in the paper), not the
scripted copier's: ``--policy shipped`` (or ``sft``, or a policy directory) builds that one,
exactly as the main job does, into ``OUT/pile-<key>`` (the main job's cache layout):

    python recipes/make_pile.py --policy shipped --out runs/cache
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from digirl_lite.data import TrajectoryStore
from digirl_lite.envs.sim.agents import DEFAULT_SLIP_RATE
from digirl_lite.envs.sim.demos import PILE_SIZES, generate_demos, generate_pile


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", choices=sorted(PILE_SIZES), default="webshop")
    ap.add_argument("--n", type=int, default=None, help="pile size (default: the paper's)")
    ap.add_argument("--demos", type=int, default=400, help="expert demonstrations")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--slip-rate", type=float, default=DEFAULT_SLIP_RATE)
    ap.add_argument("--out", default="runs/piles")
    ap.add_argument("--policy", default=None,
                    help="build the trainer's pile with this starting policy instead")
    args = ap.parse_args(argv)
    if args.policy:
        from digirl_lite.train.config import sim_webshop
        from digirl_lite.train.trainer import Trainer

        overrides = {"starting_policy": args.policy, "world": args.world, "seed": args.seed}
        if args.n:
            overrides["pile_size"] = args.n
        cfg = sim_webshop(**overrides)
        with tempfile.TemporaryDirectory() as tmp:
            trainer = Trainer(cfg, tmp, cache_dir=args.out)
            trainer.build_starting_policy()
            trajs = trainer.build_pile()
        wins = sum(t.is_success for t in trajs)
        print(f"{len(trajs)} trajectories, {wins} successes, cached under {args.out}")
        return {"trajectories": len(trajs), "successes": wins}

    root = Path(args.out) / f"{args.world}-seed{args.seed}"
    report: dict = {"world": args.world, "seed": args.seed, "slip_rate": args.slip_rate}
    for name, make in (
        ("pile", lambda: generate_pile(args.world, args.n, args.seed, args.slip_rate)),
        ("demos", lambda: generate_demos(args.world, args.demos, args.seed)),
    ):
        t0 = time.perf_counter()
        trajs, screens, stats = make()
        store_dir = root / name
        if (store_dir / "digirl_store.json").exists():
            raise SystemExit(f"{store_dir} already exists; remove it or pick another --out")
        TrajectoryStore.create(store_dir).append(trajs, screens)
        mb = sum(f.stat().st_size for f in store_dir.rglob("*") if f.is_file()) / 1e6
        report[name] = {**stats.as_dict(), "seconds": round(time.perf_counter() - t0, 1),
                        "store_mb": round(mb, 2), "store": str(store_dir)}
    (root / "stats.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
