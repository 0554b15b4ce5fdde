"""Calibrate a judge on the simulated phone, where the oracle provides the labels.

    python recipes/calibrate_judge.py --episodes 300 --false-success 0.028 --false-failure 0.028

Runs copier episodes with a noisy oracle behind the paper's guards and reports, per
trajectory (final verdict vs "a true success screen was reached") and per judged step, the
calibration metrics with 95% intervals, plus how many judge calls the guards saved.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from digirl_lite.data import Verdict
from digirl_lite.envs.sim import Copier, SimPhoneEnv
from digirl_lite.envs.sim.oracle import NoisyOracleJudge
from digirl_lite.judge import GuardedJudge, calibrate


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="webshop")
    ap.add_argument("--episodes", type=int, default=300)
    ap.add_argument("--false-success", type=float, default=0.028)
    ap.add_argument("--false-failure", type=float, default=0.028)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the report (JSON) here")
    args = ap.parse_args(argv)

    noisy = NoisyOracleJudge(args.false_success, args.false_failure, seed=args.seed)
    judge = GuardedJudge(noisy)
    env = SimPhoneEnv(args.tasks, seed=args.seed, judge=judge)
    traj_pred, traj_true, step_pred, step_true = [], [], [], []
    steps = 0
    for i in range(args.episodes):
        agent = Copier(seed=args.seed * 100_000 + i)
        obs, _ = env.reset(seed=args.seed * 100_000 + i)
        reached = False
        while True:
            obs, reward, term, trunc, info = env.step(agent.act(obs))
            steps += 1
            reached |= bool(info.get("success"))
            if info.get("verdict") is not None and not info.get("judge_skipped"):
                step_pred.append(info["verdict"] is Verdict.SUCCESS)
                step_true.append(bool(info["success"]))
            if term or trunc:
                break
        traj_pred.append(reward > 0)
        traj_true.append(reached)
    report = {
        "judge": noisy.config(), "episodes": args.episodes, "steps": steps,
        "judge_calls": judge.calls,
        "calls_saved_by_guards": judge.guards.saved_calls,
        "saved_unchanged_screen": judge.guards.skipped_unchanged,
        "saved_seen_recently": judge.guards.skipped_seen,
        "trajectory_level": calibrate(traj_pred, traj_true),
        "step_level": calibrate(step_pred, step_true),
    }
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return report


if __name__ == "__main__":
    main()
