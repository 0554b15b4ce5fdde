"""Simulated phone speed: time per env.step (action parse, transition, screenshot, judge).

    python benchmarks/bench_sim.py --episodes 100 --agent copier
    python benchmarks/bench_sim.py --episodes 100 --agent copier --render-cache 0

Prints JSON: median / p90 step time in ms, steps per second of env.step alone and of the
whole loop (agent included), and the render cache's hit rate.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from digirl_lite.envs.sim import Copier, ScriptedExpert, SimPhoneEnv


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="webshop_test")
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--agent", choices=["copier", "expert"], default="copier")
    ap.add_argument("--render-cache", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    env = SimPhoneEnv(args.tasks, seed=args.seed, render_cache=args.render_cache)
    step_s: list[float] = []
    t_loop = time.perf_counter()
    for i in range(args.episodes):
        agent = Copier(seed=i) if args.agent == "copier" else ScriptedExpert()
        obs, _ = env.reset(seed=args.seed * 100_000 + i)
        while True:
            text = agent.act(obs)
            t0 = time.perf_counter()
            obs, _, term, trunc, _ = env.step(text)
            step_s.append(time.perf_counter() - t0)
            if term or trunc:
                break
    loop = time.perf_counter() - t_loop
    a = np.array(step_s) * 1e3
    r = env.renderer
    out = {
        "agent": args.agent, "tasks": args.tasks, "episodes": args.episodes, "steps": len(a),
        "render_cache": args.render_cache,
        "step_ms_median": round(float(np.median(a)), 2),
        "step_ms_p90": round(float(np.percentile(a, 90)), 2),
        "env_steps_per_s": round(len(a) / (a.sum() / 1e3), 1),
        "loop_steps_per_s": round(len(a) / loop, 1),
        "render_hit_rate": round(r.hits / max(1, r.hits + r.misses), 3),
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
