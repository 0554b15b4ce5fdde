"""Darwin-Claw around a frozen agent: an experience bank grown over cycles of practice
(issue 48, item 5; :mod:`digirl_lite.harness.claw.run`).

    python recipes/claw.py --quick                      # a small run, a few minutes
    python recipes/claw.py                              # 6 cycles of 24 tasks, 96 held out
    python recipes/claw.py --set setting=recipes/configs/paper_setting.json   # setting (b)
    python recipes/claw.py --set triage=llm 'triage_backend={"backend": "openai", ...}'
    python recipes/claw.py --resume --out runs/claw     # after a crash or kill -9

The frozen agent is the shipped starting policy of ``--world`` (or ``starting_policy``, or the
shipped starting policy of a training run's ``setting`` on that run's live phone); nothing
updates its weights. The run measures its held-out success alone, practises for ``cycles``
cycles on training tasks (triage of its own traces into experience units, causal validation
with and without each unit, promotion and eviction), and measures it again with the bank's
active units. No phone puts the simulator's state on an observation. Fields (``--set
FIELD=JSON``): see ``digirl_lite.harness.claw.run.ClawRunConfig``. Writes OUT/summary.json,
metrics.jsonl, bank.json and skills/<skill>/SKILL.md.
"""

from __future__ import annotations

import argparse
import sys

from digirl_lite.errors import ConfigError
from digirl_lite.harness.claw.run import QUICK, ClawRunConfig, run_claw
from digirl_lite.harness.frozen import command_line_fields
from digirl_lite.train.evaluate import stage_rates


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/claw", help="the run folder")
    ap.add_argument("--quick", action="store_true", help="a small run (a few minutes)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--world", choices=["webshop", "general"], default=None)
    ap.add_argument("--config", help="a JSON file of ClawRunConfig fields")
    ap.add_argument("--set", nargs="*", action="extend", default=[], metavar="FIELD=JSON")
    ap.add_argument("--resume", action="store_true", help="continue the run in --out")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    args = ap.parse_args(argv)
    try:
        cfg = ClawRunConfig.from_dict(command_line_fields(args, QUICK))
        summary = run_claw(cfg, args.out, resume=args.resume,
                           log=(lambda *a: None) if args.quiet else print)
    except ConfigError as e:
        sys.exit(f"config error: {e}")
    st = summary["stages"]
    print(" | ".join(f"{k} {stage_rates(v)}" for k, v in st.items())
          + f" | units decided {100 * st['claw']['decided']['rule']:.1f}% of the steps; "
            f"active units {[u['id'] for u in summary['claw']['active']]}")
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
