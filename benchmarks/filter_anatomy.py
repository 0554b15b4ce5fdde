"""What DigiRL's filters keep and drop in a finished simulator run, against ground truth.

Issue 16, item 6: if DigiRL and Filtered BC cannot be told apart, find out why. The step
filter (Eq. 4.3) can only help if successful attempts contain steps worth dropping. On the
simulator we know which steps those are: every stored episode is replayed from its seed
(:func:`digirl_lite.viz.regrading.replay_states`, which checks each screen against the
stored one), and each step is scored against the scripted expert's cost-to-go
``d(s)`` (expert steps to success without surprises):

- *progress*: the action, applied without surprises, brings the phone one expert step
  closer (``d(T(s, a)) < d(s)``);
- *waste*: it does not (a detour, a wrong tap, a repeated action, an INVALID string).

The run's newest critics (the end of its online phase, so later critics than the ones
that filtered the early iterations) grade every trajectory of its store the way the
trainer does, and the script reports, for the steps of successful trajectories (the ones
DigiRL's step filter acts on: every success offline, the top ``top_p`` online):

- how many steps are waste at all (if none, a step filter has nothing to find);
- the step filter's keep rate on progress and on waste steps (a useful filter keeps
  progress and drops waste), per source (pile / online iterations);
- excess steps of successes over the expert's ``d(s_0)``;
- what the instruction filter (Eq. 4.4) selects: the task levels among kept trajectories.

    python benchmarks/filter_anatomy.py runs/grid/table1_webshop/digirl/seed0 \
        --json benchmarks/results/filter_anatomy.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CAP = 40  # expert steps beyond which a state counts as "lost" (the horizon is 20)


def expert_distance(state: Any, task: Any, cap: int = CAP) -> int:
    """Expert steps from ``state`` to success with no surprises (``cap`` if it never gets
    there within ``cap``)."""
    from digirl_lite.actions import to_gesture
    from digirl_lite.envs.sim.agents import expert_action
    from digirl_lite.envs.sim.world import HEIGHT, WIDTH, is_success, transition

    s = state
    for n in range(cap):
        if is_success(s, task):
            return n
        s = transition(s, to_gesture(expert_action(s, task), WIDTH, HEIGHT))
    return cap


def step_progress(states: list[Any], trajectory: Any) -> list[bool]:
    """Per step: does its action, without surprises, bring the phone closer to success?"""
    from digirl_lite.actions import to_gesture
    from digirl_lite.envs.sim.tasks import parse_task
    from digirl_lite.envs.sim.world import HEIGHT, WIDTH, transition

    task = parse_task(trajectory.task)
    out = []
    for s, step in zip(states, trajectory.steps):
        d0 = expert_distance(s, task)
        if not step.action.is_valid:
            out.append(False)
            continue
        d1 = expert_distance(transition(s, to_gesture(step.action, WIDTH, HEIGHT)), task)
        out.append(d1 < d0)
    return out


def _source(t: Any) -> str:
    if t.iteration < 0:
        return "pile"
    lo = 10 * ((t.iteration - 1) // 10) + 1  # online iterations count from 1
    return f"online {lo}-{lo + 9}"


def _rate(k: int, n: int) -> float | None:
    return round(k / n, 4) if n else None


def anatomy(run_dir: str, step_filter: str = "paper") -> dict[str, Any]:
    from digirl_lite import filters
    from digirl_lite.envs.setup import sim_env_kwargs
    from digirl_lite.envs.sim.tasks import parse_task
    from digirl_lite.viz import Grader, Run
    from digirl_lite.viz.regrading import ReplayMismatch, replay_states

    run = Run(run_dir)
    cfg = run.config
    # the run's own phone (surprises, layout, ...), as its fleet built it
    env_kwargs: dict[str, Any] = {"day": cfg.get("day", 1), **sim_env_kwargs(cfg)}
    if cfg.get("days_per_iteration", 0.0):
        raise SystemExit(f"{run_dir}: a drifting run; replay needs each iteration's day")
    trajs, screens = run.trajectories(with_images=True)
    grader = Grader.from_run(run)
    trajs = [t for t in trajs if t.steps and t.is_usable]
    groups: dict[str, list[Any]] = {}
    for t in trajs:
        groups.setdefault(_source(t), []).append(t)
    report: dict[str, Any] = {"run": str(run_dir), "step_filter": step_filter,
                              "algorithm": cfg.get("algorithm"), "sources": {}}
    mismatches = 0
    for name, group in groups.items():
        # the pile as the offline phase sees it (every success); online, per iteration's
        # buffer ranking is approximated by ranking the group (10 iterations) at once
        grades = grader.grade(group, screens)
        c = Counter()
        levels_all, levels_kept = Counter(), Counter()
        excess = []
        dropped_kinds, progress_kinds = Counter(), Counter()
        for t in group:
            g = grades[t.traj_id]
            level = getattr(parse_task(t.task), "level", None) or parse_task(t.task).kind
            levels_all[str(level)] += 1
            kept_traj = t.final_reward > 0 if name == "pile" else g.kept
            if kept_traj:
                levels_kept[str(level)] += 1
            if t.final_reward <= 0:
                continue
            try:
                states = replay_states(t, **env_kwargs)
            except ReplayMismatch:
                mismatches += 1
                continue
            prog = step_progress(states, t)
            excess.append(len(t.steps) - expert_distance(states[0], parse_task(t.task)))
            _, keep = filters.step_grades(g.values, t.rewards, [s.mc_return for s in t.steps],
                                          t.horizon, step_filter, grader.lam)
            for p, k, s in zip(prog, keep, t.steps):
                kind = "progress" if p else ("invalid" if not s.action.is_valid else "waste")
                c[f"{kind}_{'kept' if k and s.action.is_valid else 'dropped'}"] += 1
                c[kind] += 1
                if p and not k:
                    dropped_kinds[s.action.action_type.name] += 1
                if p:
                    progress_kinds[s.action.action_type.name] += 1
        n_steps = c["progress"] + c["waste"] + c["invalid"]
        report["sources"][name] = {
            "trajectories": len(group),
            "successes": sum(t.final_reward > 0 for t in group),
            "success_steps": n_steps,
            "waste_share": _rate(c["waste"] + c["invalid"], n_steps),
            "invalid_share": _rate(c["invalid"], n_steps),
            "keep_rate_progress": _rate(c["progress_kept"], c["progress"]),
            "keep_rate_waste": _rate(c["waste_kept"], c["waste"]),
            "dropped": c["progress_dropped"] + c["waste_dropped"] + c["invalid_dropped"],
            "dropped_that_were_progress": _rate(
                c["progress_dropped"],
                c["progress_dropped"] + c["waste_dropped"] + c["invalid_dropped"]),
            "mean_excess_steps": round(float(np.mean(excess)), 2) if excess else None,
            "successes_with_excess": _rate(sum(e > 0 for e in excess), len(excess)),
            "levels_all": dict(sorted(levels_all.items())),
            "levels_kept": dict(sorted(levels_kept.items())),
            "counts": dict(sorted(c.items())),
            "progress_steps_by_action": dict(progress_kinds.most_common()),
            "dropped_progress_by_action": dict(dropped_kinds.most_common()),
        }
    report["replay_mismatches"] = mismatches
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders (simulator runs with a store)")
    ap.add_argument("--step-filter", default="paper", choices=("paper", "released"))
    ap.add_argument("--json", help="write the reports here")
    args = ap.parse_args(argv)
    reports = []
    for r in args.runs:
        rep = anatomy(r, args.step_filter)
        reports.append(rep)
        print(f"\n{r}  (step filter {rep['step_filter']}; replay mismatches "
              f"{rep['replay_mismatches']})")
        print(f"{'source':>14} {'succ':>5} {'steps':>6} {'waste':>6} {'inval':>6} "
              f"{'keep|prog':>9} {'keep|waste':>10} {'drop=prog':>9} {'excess':>6}")
        for name in sorted(rep["sources"], key=lambda n: (n != "pile", len(n), n)):
            s = rep["sources"][name]

            def f(x):
                return "-" if x is None else f"{x:.2f}"
            print(f"{name:>14} {s['successes']:>5} {s['success_steps']:>6} "
                  f"{f(s['waste_share']):>6} {f(s['invalid_share']):>6} "
                  f"{f(s['keep_rate_progress']):>9} {f(s['keep_rate_waste']):>10} "
                  f"{f(s['dropped_that_were_progress']):>9} {f(s['mean_excess_steps']):>6}")
            kr = {a: f"{1 - s['dropped_progress_by_action'].get(a, 0) / n:.2f}"
                  for a, n in s["progress_steps_by_action"].items()}
            print(f"{'':>14} keep rate of progress steps by action: {kr}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(reports, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
