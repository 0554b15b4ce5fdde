"""Fleet throughput: finished trajectories per minute of sync, async and Ray-async fleets.

    python benchmarks/fleet_throughput.py
    python benchmarks/fleet_throughput.py --phones 16 --median-s 0.25 --fleets sync,async

Sixteen simulated phones whose every step takes a log-normal time (the paper's emulators:
median about 1 s with a heavy tail; scaled down by ``--median-s`` so a run takes minutes),
driven by the scripted expert (so the policy costs nothing and the fleet's own overhead
shows). Each fleet collects ``--episodes`` trajectories after ``--warmup`` more:

* ``sync``: :class:`SyncFleet.collect`, the reference code's lockstep batch mode (all
  phones step together, each step waits for the slowest phone).
* ``async``: :class:`AsyncFleet` streaming, as the learner uses it (``take`` once enough
  trajectories are in, the phones never stop); ``async-collect`` is its ``collect`` (one
  fixed set of tasks, so the last phones' tails count).
* ``ray-async``: :class:`RayFleet` streaming, phones in Ray actors (``--per-actor`` each).

Ideal = phones / mean episode time, where an episode's time is what its phone spent in
steps (the spec's "ideal with zero overhead": every phone busy all the time). Prints one row
per fleet and the JSON of the same numbers.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import numpy as np

from digirl_lite.data import ScreenTable
from digirl_lite.envs.sim import ScriptedExpert, SimEnvFactory, SimPhoneEnv, Surprises
from digirl_lite.rollout import AsyncFleet, ScriptedBatchAgent, SyncFleet


def _expert() -> ScriptedBatchAgent:
    return ScriptedBatchAgent(lambda slot: ScriptedExpert())


def _episode_seconds(episodes) -> list[float]:
    """Device time of each episode: its steps' environment and judge seconds."""
    return [sum(s.timings.get("env_s", 0.0) + s.timings.get("judge_s", 0.0)
                for s in e.trajectory.steps) for e in episodes]


def _stream(fleet, tasks, warmup: int, n: int):
    fleet.start(_expert(), itertools.cycle(tasks), ScreenTable(), id_prefix="bench")
    try:
        fleet.take(warmup)
        t0 = time.perf_counter()
        eps = fleet.take(n)
        wall = time.perf_counter() - t0
    finally:
        fleet.stop()
    return eps, wall


def _collect(fleet, tasks, warmup: int, n: int):
    fleet.collect(_expert(), tasks[:warmup], ScreenTable(), id_prefix="warm")
    t0 = time.perf_counter()
    eps = fleet.collect(_expert(), tasks[:n], ScreenTable(), id_prefix="bench")
    return eps, time.perf_counter() - t0


def run(name: str, make_env, args, tasks) -> dict:
    if name == "sync":
        fleet, how = SyncFleet(make_env, args.phones), _collect
    elif name == "async":
        fleet, how = AsyncFleet(make_env, args.phones), _stream
    elif name == "async-collect":
        fleet, how = AsyncFleet(make_env, args.phones), _collect
    elif name == "ray-async":
        from digirl_lite.rollout import RayFleet

        fleet = RayFleet(make_env, args.phones, devices_per_actor=args.per_actor)
        how = _stream
    else:
        raise SystemExit(f"unknown fleet {name!r}")
    try:
        eps, wall = how(fleet, tasks, args.warmup, args.episodes)
    finally:
        fleet.close()
    per_min = len(eps) / wall * 60
    ep_s = float(np.mean(_episode_seconds(eps)))
    ideal = args.phones / ep_s * 60
    return {"fleet": name, "trajectories": len(eps), "wall_s": round(wall, 2),
            "traj_per_min": round(per_min, 1), "mean_episode_s": round(ep_s, 3),
            "ideal_per_min": round(ideal, 1), "fraction_of_ideal": round(per_min / ideal, 3),
            "successes": sum(e.trajectory.is_success for e in eps)}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phones", type=int, default=16)
    ap.add_argument("--episodes", type=int, default=64, help="trajectories timed per fleet")
    ap.add_argument("--warmup", type=int, default=16, help="trajectories before timing")
    ap.add_argument("--median-s", type=float, default=0.25,
                    help="median step latency (the paper's ~1 s, scaled down)")
    ap.add_argument("--sigma", type=float, default=0.8, help="log-normal sigma (heavy tail)")
    ap.add_argument("--per-actor", type=int, default=4, help="phones per Ray actor")
    ap.add_argument("--fleets", default="sync,async,async-collect,ray-async")
    args = ap.parse_args(argv)

    make_env = SimEnvFactory(tasks="webshop_test", surprises=Surprises.none(),
                             faults={"latency_median_s": args.median_s,
                                     "latency_sigma": args.sigma})
    tasks = SimPhoneEnv("webshop_test").tasks
    tasks = [tasks[i % len(tasks)] for i in range(max(args.episodes, args.warmup))]
    rows = [run(name, make_env, args, tasks) for name in args.fleets.split(",")]
    print(f"{args.phones} phones, step latency log-normal(median {args.median_s} s, "
          f"sigma {args.sigma}), {args.episodes} trajectories timed per fleet")
    print(f"{'fleet':<14}{'traj/min':>10}{'ideal/min':>11}{'of ideal':>10}{'vs sync':>9}")
    sync = next((r["traj_per_min"] for r in rows if r["fleet"] == "sync"), None)
    for r in rows:
        vs = f"{r['traj_per_min'] / sync:.2f}x" if sync else "-"
        print(f"{r['fleet']:<14}{r['traj_per_min']:>10.1f}{r['ideal_per_min']:>11.1f}"
              f"{r['fraction_of_ideal']:>10.1%}{vs:>9}")
    print(json.dumps(rows))
    return rows


if __name__ == "__main__":
    main()
