"""The main job: DigiRL's offline phase on a stored pile, then online iterations, on the
built-in simulated phone with tiny CPU models (Web Shopping, H = 20, by default).

    python recipes/offline_to_online.py                       # the default run
    python recipes/offline_to_online.py --quick --out runs/quick
    python recipes/offline_to_online.py --resume --out runs/webshop   # after a crash
    python recipes/offline_to_online.py --filtered-bc         # Filtered BC alongside

Writes to --out: metrics.jsonl, summary.json (held-out success and mean episode length of
each stage: copier, offline, online), learning_curve.png, store/ (every trajectory) and
checkpoints/. Prints the table at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from digirl_lite.train.config import DigiRLConfig, sim_quick, sim_webshop
from digirl_lite.train.trainer import Trainer


def _row(name: str, stages: dict) -> str:
    cells = []
    for stage in ("copier", "offline", "online"):
        r = stages.get(stage)
        cells.append("      -      " if r is None else
                     f"{100 * r['success_rate']:5.1f}% ({r['mean_length']:4.1f})")
    return f"{name:<12} " + "  ".join(cells)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/webshop")
    ap.add_argument("--quick", action="store_true", help="a few-minute smoke run")
    ap.add_argument("--resume", action="store_true", help="continue the run in --out")
    ap.add_argument("--filtered-bc", action="store_true",
                    help="also run Filtered BC on the same budget (in OUT/filtered_bc)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--world", choices=["webshop", "general"], default="webshop")
    ap.add_argument("--config", help="JSON file of DigiRLConfig fields (overrides the preset)")
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=JSON",
                    help='override fields, e.g. --set iterations=10 judge=\'{"judge": '
                         '"noisy_oracle"}\'')
    ap.add_argument("--cache-dir", default="runs/cache",
                    help="starting policy and pile cache ('' to disable)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    overrides: dict = {"seed": args.seed, "world": args.world}
    if args.config:
        overrides.update(json.loads(Path(args.config).read_text()))
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    preset = sim_quick if args.quick else sim_webshop
    try:
        cfg = preset(**overrides)
    except (TypeError, ValueError) as e:
        raise SystemExit(f"bad configuration: {e}") from None
    runs = [("digirl", cfg, Path(args.out))]
    if args.filtered_bc:
        runs.append(("filtered_bc", DigiRLConfig.from_dict({**cfg.as_dict(),
                                                            "algorithm": "filtered_bc"}),
                     Path(args.out) / "filtered_bc"))
    results = {}
    for name, c, out in runs:
        trainer = Trainer(c, out, cache_dir=args.cache_dir or None, progress=not args.quiet)
        results[name] = trainer.run(resume=args.resume)
    print("\nheld-out success (mean episode length) on the first "
          f"{cfg.eval_tasks} test tasks")
    print(f"{'':<12} {'copier':^13}  {'offline':^13}  {'online':^13}")
    for name, s in results.items():
        print(_row(name, s["stages"]))
    print(f"wall time: {results['digirl']['wall_s']} s; run folder: {args.out}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
