"""Why a simulator run's held-out failures failed, and whether the scripted expert could
have succeeded on the same tasks at the same seeds (issue 47: how much room an evaluation
leaves above a stage).

Every failed episode of the run's evaluation ``--stage`` is replayed from its stored seed
and actions (:func:`digirl_lite.viz.regrading.replay_states`, under the run's own phone:
layout, surprises, horizon) and reported with the surprises that came up
in it (a pop-up, voice input, a cookie banner: each time one appeared) and its actions.
Then the scripted expert (which reads the simulator's state: an analysis of the world, not
an agent) plays every task of the stage at the same episode seed: its successes bound what
any agent could reach on this evaluation (the surprises it meets differ where its actions
draw differently from the agent's).

    python benchmarks/eval_anatomy.py runs/grid/paper3_general/digirl/seed0 --stage online \\
        --json benchmarks/results/eval_anatomy_paper3_general_seed0.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

OVERLAYS = ("popup", "voice", "consent")


def _env_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    """The simulated phone's settings of a run (as the run's fleet built them)."""
    from digirl_lite.envs.setup import make_phones
    from digirl_lite.train.config import DigiRLConfig

    cfg = DigiRLConfig.from_dict(config)
    if cfg.env != "sim":
        raise SystemExit(f"not a simulator run (env {cfg.env!r}): nothing to replay")
    kw = dict(make_phones(cfg, seed=0, probe=False).make_env.env_kwargs)
    kw.pop("tasks", None)
    return kw


def _action_kind(text: str) -> str:
    from digirl_lite.actions import parse_action

    try:
        return parse_action(text).action_type.name
    except ValueError:
        return "INVALID"


def anatomy(run_dir: str, stage: str) -> dict[str, Any]:
    from digirl_lite.envs.sim import SimPhoneEnv
    from digirl_lite.envs.sim.agents import ScriptedExpert
    from digirl_lite.viz import Run
    from digirl_lite.viz.regrading import replay_states

    run = Run(run_dir)
    kw = _env_kwargs(run.config)
    trajs, _ = run.eval_trajectories(stage, with_images=False)
    failures, expert_wins, both = [], 0, 0
    for t in trajs:
        seed = int(t.seeds["env"])
        env = SimPhoneEnv([t.task], seed=seed, **{**kw, "horizon": t.horizon})
        obs, info = env.reset(task=t.task, seed=seed)
        done, ex = False, ScriptedExpert()
        while not done:
            obs, _, term, trunc, info = env.step(ex.act(obs))
            done = term or trunc
        env.close()
        expert_ok = bool(info["true_success"])
        expert_wins += expert_ok
        if t.true_success:
            continue
        both += not expert_ok
        states = replay_states(t, **kw)
        came = Counter(s.overlay for a, s in zip(states, states[1:])
                       if s.overlay in OVERLAYS and s.overlay != a.overlay)
        failures.append({
            "task": t.task, "steps": len(t.steps),
            "surprises": dict(came),
            "actions": dict(Counter(_action_kind(s.action_text) for s in t.steps)),
            "expert_succeeds": expert_ok})
    n = len(trajs)
    return {"run": str(run_dir), "stage": stage, "episodes": n,
            "agent_successes": sum(bool(t.true_success) for t in trajs),
            "expert_successes": expert_wins, "failures_the_expert_also_fails": both,
            "failures": failures}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a simulator run folder (with eval/<stage>/)")
    ap.add_argument("--stage", default="online", help="evaluation stage (eval/<stage>)")
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args(argv)
    rep = anatomy(args.run, args.stage)
    print(f"{args.run} [{args.stage}]: agent {rep['agent_successes']}/{rep['episodes']}, "
          f"the scripted expert at the same seeds {rep['expert_successes']}/{rep['episodes']}; "
          f"{rep['failures_the_expert_also_fails']} of the agent's "
          f"{len(rep['failures'])} failures the expert fails too")
    for f in rep["failures"]:
        print(f"  {f['task'][:50]:50s} surprises {f['surprises']} "
              f"actions {f['actions']} expert {'ok' if f['expert_succeeds'] else 'FAILS'}")
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({**rep, "commit": commit}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
