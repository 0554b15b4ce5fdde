"""DigiRL's offline phase only: starting policy, the pile (its own attempts), both critics,
then the actor on the pile's successful trajectories; evaluated before and after.

    python recipes/offline_only.py --out runs/offline
    python recipes/offline_only.py --resume --out runs/offline    # after a crash
    python recipes/online_only.py --set starting_policy=runs/offline/checkpoints/iter-0000/policy

The run folder is a normal one (checkpoint iter-0000 holds the offline policy and critics).
"""

from __future__ import annotations

import sys

from digirl_lite.train.cli import cache_dir_of, config_from_args, print_table, run_parser
from digirl_lite.train.trainer import Trainer


def main(argv: list[str] | None = None) -> dict:
    ap = run_parser(__doc__.split("\n\n")[0], out="runs/offline")
    ap.add_argument("--resume", action="store_true", help="continue the run in --out")
    args = ap.parse_args(argv)
    cfg = config_from_args(args)
    summary = Trainer(cfg, args.out, cache_dir=cache_dir_of(args),
                      progress=not args.quiet).run(resume=args.resume, online=False)
    print_table({cfg.algorithm: summary}, cfg.eval_tasks)
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
