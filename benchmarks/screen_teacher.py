"""How often DarwinX's default teacher solves a task (issue 48, item 1).

:class:`~digirl_lite.harness.teachers.ScreenTeacher` acts from the UI tree alone; here it plays
the first ``--tasks`` test tasks of each world, one episode each, on observations with no
``obs.state`` (as a real device gives them), on the default live phone (``live``: the older
dialog layout, the default surprises) and on the paper setting's phone (``paper``: the
current layout, pop-ups 0.4, sponsored rows 0.3). The simulator's state-reading expert
(``privileged_expert``) plays the same episodes for comparison.

    python benchmarks/screen_teacher.py      # writes benchmarks/results/screen_teacher.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHONES = {"live": {}, "paper": {"layout": "current",
                                "surprises": {"popup": 0.4, "sponsored": 0.3}}}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def play(world: str, phone: dict, n: int, agent_name: str, seed: int) -> dict:
    """Success on the first ``n`` test tasks (task ``i`` at env seed ``seed + i``)."""
    from digirl_lite.envs.sim.agents import ScriptedExpert
    from digirl_lite.envs.sim.env import SimPhoneEnv
    from digirl_lite.harness.teachers import ScreenTeacher

    tasks = [t.text for t in SimPhoneEnv._load_task_list(f"{world}_test")][:n]
    env = SimPhoneEnv(tasks=world, ui_tree=True, seed=seed, **phone)
    failed, steps = [], 0
    for i, task in enumerate(tasks):
        obs, _ = env.reset(task=task, seed=seed + i)
        agent = ScreenTeacher() if agent_name == "screen" else ScriptedExpert()
        while True:
            seen = obs if agent_name == "privileged_expert" else \
                dataclasses.replace(obs, state=None)
            obs, reward, term, trunc, _ = env.step(agent.act(seen))
            steps += 1
            if term or trunc:
                break
        if reward <= 0:
            failed.append(task)
    wins = len(tasks) - len(failed)
    return {"successes": wins, "tasks": len(tasks), "success_rate": wins / len(tasks),
            "steps": steps, "failed": failed}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=96, help="the first N test tasks per world")
    ap.add_argument("--seed", type=int, default=10_000, help="env seed of the first task")
    ap.add_argument("--out", default="benchmarks/results/screen_teacher.json")
    args = ap.parse_args(argv)
    t0 = time.time()
    results: dict = {}
    for world in ("webshop", "general"):
        for phone, kw in PHONES.items():
            for agent in ("screen", "privileged_expert"):
                r = play(world, kw, args.tasks, agent, args.seed)
                results.setdefault(world, {}).setdefault(phone, {})[agent] = r
                print(f"{world} {phone} {agent}: {r['successes']}/{r['tasks']}", flush=True)
    record = {"command": "python benchmarks/screen_teacher.py " + " ".join(argv or sys.argv[1:]),
              "git": {"commit": _git("rev-parse", "HEAD"),
                      "dirty": bool(_git("status", "--porcelain", "--", "digirl_lite",
                                         "benchmarks/screen_teacher.py"))},
              "phones": PHONES,
              "results": results, "wall_s": round(time.time() - t0, 1)}
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
