"""How many ways back the data of a simulator run holds, against ground truth (issue 47).

DigiRL learns the way back from mistakes only from attempts that took one: its filters can
keep a success that closed a pop-up, never invent it. On the paper setting the offline-only
arm's pile (1,552 attempts on General) and the offline-then-online arm's (608, then 960 of its
own online attempts) hold different numbers of such successes, and the held-out result follows
them. This script counts them: every stored episode of a run is replayed from its seed
(:func:`digirl_lite.viz.regrading.replay_states`, on the run's own phone:
:func:`digirl_lite.envs.setup.sim_env_kwargs`), and each step's ways back
(:func:`digirl_lite.envs.sim.world.recoveries_between`: a pop-up closed, voice input left, a
banner answered, a BACK from a wrong page) are read from the states. Per source (the pile,
online iterations by tens): attempts, successes, successes that took a way back (by kind),
and all ways back taken. Ground truth for the analysis only; no agent reads it.

    python benchmarks/recoveries_in_data.py runs/grid/paper3_general/digirl/seed2 \\
        runs/grid/paper3_general/digirl_offline_only/seed2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script, sys.path[0] is benchmarks/

from benchmarks.filter_anatomy import _source  # noqa: E402  (pile / online by tens)


def recoveries(run_dir: str | Path) -> dict[str, Any]:
    """The counts of one run folder, per source (see the module's docstring)."""
    from digirl_lite.actions import parse_action, to_gesture
    from digirl_lite.envs.setup import sim_env_kwargs
    from digirl_lite.envs.sim.world import HEIGHT, WIDTH, recoveries_between
    from digirl_lite.viz import Run
    from digirl_lite.viz.regrading import ReplayMismatch, replay_states

    run = Run(run_dir)
    cfg = run.config
    if cfg.get("env", "sim") != "sim":
        raise SystemExit(f"{run_dir}: not a simulator run (env {cfg.get('env')!r})")
    if cfg.get("days_per_iteration", 0.0):
        raise SystemExit(f"{run_dir}: a drifting run; replay needs each iteration's day")
    env_kwargs = {"day": cfg.get("day", 1), **sim_env_kwargs(cfg)}
    trajs, _ = run.trajectories(with_images=False)
    out: dict[str, dict[str, Any]] = {}
    mismatches = 0
    for t in sorted(trajs, key=lambda t: (t.iteration, t.traj_id)):
        if not t.steps or not t.is_usable:
            continue
        src = out.setdefault(_source(t), {"attempts": 0, "successes": 0,
                                          "successes_with_way_back": 0,
                                          "ways_back_in_successes": Counter(),
                                          "ways_back_in_all": Counter()})
        try:
            states = replay_states(t, **env_kwargs)
        except ReplayMismatch:
            mismatches += 1
            continue
        kinds: list[str] = []
        for h, step in enumerate(t.steps):
            g = to_gesture(parse_action(step.action_text), WIDTH, HEIGHT)
            kinds += recoveries_between(states[h], states[h + 1], g)
        success = t.true_success if t.true_success is not None else t.is_success
        src["attempts"] += 1
        src["ways_back_in_all"].update(kinds)
        if success:
            src["successes"] += 1
            src["ways_back_in_successes"].update(kinds)
            src["successes_with_way_back"] += bool(kinds)
    for src in out.values():
        for k in ("ways_back_in_successes", "ways_back_in_all"):
            src[k] = dict(src[k])
    return {"run": str(run_dir), "algorithm": cfg.get("algorithm"), "world": cfg.get("world"),
            "seed": cfg.get("seed"), "pile_size": cfg.get("pile_size"),
            "iterations": cfg.get("iterations"), "replay_mismatches": mismatches,
            "sources": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders of simulator runs")
    ap.add_argument("--json", type=Path, help="write the counts here")
    args = ap.parse_args(argv)
    reports = [recoveries(r) for r in args.runs]
    for rep in reports:
        print(f"{rep['run']} ({rep['algorithm']}, {rep['world']}, seed {rep['seed']}; "
              f"{rep['replay_mismatches']} replay mismatches)")
        for name, s in rep["sources"].items():
            print(f"  {name:>14}: {s['attempts']:5d} attempts, {s['successes']:4d} successes, "
                  f"{s['successes_with_way_back']:4d} of them with a way back "
                  f"{s['ways_back_in_successes']}; all ways back {s['ways_back_in_all']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(reports, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
