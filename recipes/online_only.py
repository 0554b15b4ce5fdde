"""Online iterations only, from a starting policy (no pile, no offline phase): the buffer
starts empty and fills with the policy's own attempts.

    python recipes/online_only.py --out runs/online
    python recipes/online_only.py --set starting_policy=runs/offline/checkpoints/iter-0000/policy
    python recipes/online_only.py --resume --out runs/online     # after a crash
"""

from __future__ import annotations

import sys

from digirl_lite.train.cli import cache_dir_of, config_from_args, print_table, run_parser
from digirl_lite.train.trainer import Trainer


def main(argv: list[str] | None = None) -> dict:
    ap = run_parser(__doc__.split("\n\n")[0], out="runs/online")
    ap.add_argument("--resume", action="store_true", help="continue the run in --out")
    args = ap.parse_args(argv)
    cfg = config_from_args(args)
    summary = Trainer(cfg, args.out, cache_dir=cache_dir_of(args),
                      progress=not args.quiet).run(resume=args.resume, offline=False)
    print_table({cfg.algorithm: summary}, cfg.eval_tasks)
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
