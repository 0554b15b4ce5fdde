"""Evaluation only: a policy's held-out success on the first N test tasks, with mean
episode length, failure kinds and a 95% interval; the episodes are stored for replay.
Each held-out split (``--splits``; default: the config's ``eval_splits``, the world's shipped
splits in the main job's preset) is evaluated beside the test list, on its first
``eval_split_tasks`` tasks.

    python recipes/evaluate.py --policy runs/webshop/checkpoints/iter-0030/policy
    python recipes/evaluate.py --policy shipped --set eval_tasks=180 --splits unseen_products

Writes OUT/eval/<stage>/ (a trajectory store; OUT/eval/<stage>-<split>/ for each split) and
OUT/eval_<stage>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from digirl_lite.train.cli import cache_dir_of, config_from_args, run_parser
from digirl_lite.train.evaluate import stage_rates
from digirl_lite.train.trainer import Trainer


def main(argv: list[str] | None = None) -> dict:
    ap = run_parser(__doc__.split("\n\n")[0], out="runs/eval")
    ap.add_argument("--policy", default="shipped",
                    help="a policy directory, 'shipped' or 'sft' (the starting policy)")
    ap.add_argument("--stage", default="eval", help="name of this evaluation")
    ap.add_argument("--splits", nargs="*", default=None, metavar="SPLIT",
                    help="held-out splits beside the test list: names (tasks/<world>_<name>"
                         ".txt) or task files; default: the config's eval_splits (the main "
                         "job's: the world's shipped splits; --quick: none); none: --splits "
                         "alone")
    args = ap.parse_args(argv)
    splits = {} if args.splits is None else {"eval_splits": tuple(args.splits)}
    cfg = config_from_args(args, starting_policy=args.policy, **splits)
    trainer = Trainer(cfg, args.out, cache_dir=cache_dir_of(args), progress=not args.quiet)
    trainer.build_starting_policy()
    report = trainer.evaluate(args.stage, splits=True)
    path = Path(args.out) / f"eval_{args.stage}.json"
    path.write_text(json.dumps(report, indent=1, default=float))
    print(f"{100 * report['success_rate']:.1f}% held-out success "
          f"(95% CI {100 * report['ci95'][0]:.1f}-{100 * report['ci95'][1]:.1f}), "
          f"mean length {report['mean_length']:.1f}, failures {report['failure_kinds']}")
    if report.get("failure_causes"):  # the environment's ground truth (the simulator)
        print(f"  why the failures failed: {report['failure_causes']}; successes that took a "
              f"way back: {report['successes_with_recovery']}/{report['true_successes']} "
              f"(recoveries {report['recoveries']})")
    for name, rep in report.get("splits", {}).items():
        print(f"  {name}: {stage_rates(rep)} on its first {rep['episodes']} tasks")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
