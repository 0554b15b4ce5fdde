"""Drift: how a policy frozen on day 1 decays on later days.

Stand-in for a frozen policy: the expert's action strings recorded on day 1 (clean screens)
replayed open-loop, task by task, on day k. Prints the success rate per day.

    python benchmarks/bench_drift.py --days 1 2 3 7 --tasks webshop_test
"""

from __future__ import annotations

import argparse
import json

from digirl_lite.envs.sim import ScriptedExpert, SimPhoneEnv, Surprises


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="webshop_test")
    ap.add_argument("--days", type=int, nargs="+", default=[1, 2, 3, 7])
    ap.add_argument("--n", type=int, default=96)
    args = ap.parse_args(argv)

    env1 = SimPhoneEnv(args.tasks, day=1, surprises=Surprises.none())
    scripts = []
    for task in env1.tasks[: args.n]:
        obs, _ = env1.reset(task)
        acts, expert = [], ScriptedExpert()
        while True:
            a = expert.act(obs)
            acts.append(a)
            obs, r, term, trunc, _ = env1.step(a)
            if term or trunc:
                break
        scripts.append((task, acts))
    out = {}
    for day in args.days:
        env = SimPhoneEnv(args.tasks, day=day, surprises=Surprises.none())
        wins = 0
        for task, acts in scripts:
            env.reset(task)
            for a in acts:
                _, r, term, trunc, _ = env.step(a)
                if term or trunc:
                    break
            wins += r > 0
        out[f"day{day}"] = round(wins / len(scripts), 3)
    print(json.dumps({"tasks": args.tasks, "n": len(scripts), "success_by_day": out}))
    return out


if __name__ == "__main__":
    main()
