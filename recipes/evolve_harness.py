"""Improve a frozen agent by evolving its harness (DarwinX on GEPA's engine, issue 30).

    python recipes/evolve_harness.py --quick            # a small evolution, a few minutes
    python recipes/evolve_harness.py                    # E1's run: budget 1500 episodes
    python recipes/evolve_harness.py --set accept='"minibatch_sum"' --seed 1
    python recipes/evolve_harness.py --set teacher=none     # no teacher-derived evidence
    python recipes/evolve_harness.py --set evidence=failure,self   # E1 by evidence kind
    python recipes/evolve_harness.py --resume --out runs/evolve   # after a crash or kill -9

The frozen agent is the shipped starting policy of ``--world`` (or ``starting_policy``; or a
VLM behind an API with ``agent="prompted"`` and ``agent_backend``); nothing updates its
weights. The run measures its held-out success (the first ``eval_tasks`` test tasks, one
episode each), alone and with the policy's grammar mask (the decoding baseline), evolves its
harness on tasks written from the simulator's site and app descriptions (never the test
list) for ``budget`` episodes, and measures the evolved harness on the same held-out tasks
and seeds. The teacher of tasks the agent never solved acts from the screen alone
(``teacher="screen"``); the simulator's state-reading expert only as
``teacher="privileged_expert"``, and then every report says "privileged"; no other run puts
the simulator's state on an observation. ``evidence`` chooses what reaches the proposer:
failure-derived, self-derived (the agent's own passes) and teacher-derived, all three by
default. Fields (``--set FIELD=JSON``): see ``digirl_lite.harness.evolve.EvolveConfig``.
Writes OUT/summary.json, report.md, lineage.png, metrics.jsonl and darwinx/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from digirl_lite.errors import ConfigError
from digirl_lite.harness.evolve import QUICK, EvolveConfig, run_evolution, run_label
from digirl_lite.harness.frozen import command_line_fields
from digirl_lite.train.evaluate import stage_rates


def config_from(args: argparse.Namespace) -> EvolveConfig:
    return EvolveConfig.from_dict(command_line_fields(args, QUICK))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/evolve", help="the run folder")
    ap.add_argument("--quick", action="store_true", help="a small evolution (a few minutes)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--world", choices=["webshop", "general"], default=None)
    ap.add_argument("--config", help="a JSON file of EvolveConfig fields")
    ap.add_argument("--set", nargs="*", action="extend", default=[], metavar="FIELD=JSON")
    ap.add_argument("--resume", action="store_true", help="continue the run in --out")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    args = ap.parse_args(argv)
    try:
        cfg = config_from(args)
        summary = run_evolution(cfg, args.out, resume=args.resume,
                                log=(lambda *a: None) if args.quiet else print)
    except ConfigError as e:
        sys.exit(f"config error: {e}")
    st = summary["stages"]
    print(f"[{run_label(cfg.as_dict())}] "
          + " | ".join(f"{k} {stage_rates(v)}" for k, v in st.items())
          + f" | rules decided {100 * st['evolved']['decided']['rule']:.1f}% of the evolved "
            f"harness's steps; report: {Path(args.out) / 'report.md'}")
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
