"""The synchronous loop against the asynchronous learner (issue 17, item 5): trajectories per
minute, phones kept busy, and the staleness of the data used, policy cost included.

    python benchmarks/learner_throughput.py
    python benchmarks/learner_throughput.py --phones 16 --iterations 6 --median-s 0.25

Each learner runs the Trainer's online iterations from the shipped starting policy on
``--phones`` simulated phones whose every step takes a log-normal time (``sim_faults``:
median ``--median-s``, sigma ``--sigma``; the paper's emulators, about 1 s with a heavy tail,
scaled down), with the real policy sampling every action and the real DigiRL update
(critics, filters, actor) between takes:

* ``sync``: ``learner="sync"`` on the lockstep fleet: collect ``rollouts_per_iteration``
  (= phones) trajectories, every phone waiting for the slowest and for the update;
* ``async``: ``learner="async"`` on :class:`AsyncFleet`: the phones never stop, the learner
  takes completed trajectories in the order their episodes started (``take_order``
  "start", the default), drops those beyond ``max_staleness``;
* ``async:completion``: the same, taking the first trajectories to complete (Darwin's A.1).

Which trajectories the learner uses (take order), measured with ``--actor-updates 0`` (the
policy frozen, so the synchronous loop's trajectories are an unbiased sample of what the
policy does) and ``--eval-every 2`` (an evaluation stops and restarts the collection, as in
a run): success rate and mean length of the trajectories used, against the synchronous
loop's::

    python benchmarks/learner_throughput.py --actor-updates 0 --eval-every 2 \
        --learners sync,async:completion,async

The first iteration is a warm-up (the async phones start then); the next ``--iterations`` are
timed. *Busy*: device seconds (environment and judge) of the trajectories the learner used,
over phones x wall: the share of the phones' time that went into data the learner trained on
(episodes dropped as stale or still running at the end count as idle). *Ideal*: phones / mean
episode device time. Prints a table and the JSON of the same numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np


def run(name: str, args: argparse.Namespace, out: Path) -> dict:
    from digirl_lite.train.config import sim_webshop
    from digirl_lite.train.trainer import Trainer

    learner, _, order = name.partition(":")
    cfg = sim_webshop(
        learner=learner, fleet="async" if learner == "async" else "local",
        **({"take_order": order} if order else {}),
        n_envs=args.phones, rollouts_per_iteration=args.phones, iterations=args.iterations + 1,
        eval_every=0, eval_tasks=1, seed=args.seed, actor_updates=args.actor_updates,
        sim_faults={"latency_median_s": args.median_s, "latency_sigma": args.sigma},
        **({"max_staleness": args.max_staleness} if learner == "async" else {}))
    run_dir = out / name.replace(":", "-")
    t = Trainer(cfg, run_dir, cache_dir=None, progress=False)
    try:
        t.build_starting_policy()
        t.online_iteration(1)  # warm-up: the async phones start here
        t0, evaluating = time.perf_counter(), 0.0
        for k in range(2, args.iterations + 2):
            t.online_iteration(k)
            if args.eval_every and (k - 1) % args.eval_every == 0 and k < args.iterations + 1:
                e0 = time.perf_counter()  # stops the collection, as a run's evaluation does
                t.evaluate(f"bench-{k}")
                evaluating += time.perf_counter() - e0
        wall = time.perf_counter() - t0 - evaluating
        discarded = {k: v for k, v in t.summary.get("async", {}).items()
                     if k.startswith("discarded")}
    finally:
        t.close()
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in lines if r.get("stage") == "online" and r["iteration"] >= 2]
    # the timed iterations' trajectories, the critics' held-out ones included
    used = [tr for tr in t.buffer.trajectories("all", usable_only=False) if tr.iteration >= 2]
    device = [sum(s.timings.get("env_s", 0.0) + s.timings.get("judge_s", 0.0)
                  for s in tr.steps) for tr in used]
    # versions between the weights that took a trajectory (k - 1) and its oldest step's
    staleness = Counter((tr.iteration - 1) - min(s.policy_version for s in tr.steps)
                        for tr in used if tr.steps)
    split = {k: round(float(np.sum([r["time_split"].get(k, 0.0) for r in timed])), 1)
             for k in ("collect", "inference", "critics", "actor")}
    per_min = len(used) / wall * 60
    ideal = args.phones / float(np.mean(device)) * 60
    return {"learner": name, "phones": args.phones, "trajectories": len(used),
            "wall_s": round(wall, 1), "traj_per_min": round(per_min, 1),
            "mean_episode_device_s": round(float(np.mean(device)), 2),
            "ideal_per_min": round(ideal, 1), "busy": round(sum(device) / (args.phones * wall), 3),
            "dropped": int(sum(r.get("async_dropped", 0) for r in timed)),
            "staleness": {str(k): staleness[k] for k in sorted(staleness)},
            "collect_success": round(float(np.mean([tr.is_success for tr in used])), 3),
            "mean_length": round(float(np.mean([len(tr.steps) for tr in used])), 2),
            **discarded,
            "seconds_by_part": split}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phones", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=6, help="timed iterations per learner")
    ap.add_argument("--median-s", type=float, default=0.25,
                    help="median step latency (the paper's ~1 s, scaled down)")
    ap.add_argument("--sigma", type=float, default=0.8, help="log-normal sigma (heavy tail)")
    ap.add_argument("--actor-updates", type=int, default=20, help="the main job's 20")
    ap.add_argument("--max-staleness", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--learners", default="sync,async",
                    help="sync, async (take_order start) and async:completion")
    ap.add_argument("--eval-every", type=int, default=0,
                    help="evaluate (stopping the collection) after every K timed iterations")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(name, args, Path(tmp)) for name in args.learners.split(",")]
    print(f"{args.phones} phones, step latency log-normal(median {args.median_s} s, sigma "
          f"{args.sigma}), {args.iterations} timed iterations of {args.phones} trajectories, "
          f"{args.actor_updates} actor updates each")
    print(f"{'learner':<18}{'traj/min':>9}{'ideal':>8}{'busy':>7}{'dropped':>9}{'success':>9}"
          f"{'length':>8}  staleness")
    for r in rows:
        print(f"{r['learner']:<18}{r['traj_per_min']:>9.1f}{r['ideal_per_min']:>8.1f}"
              f"{r['busy']:>7.1%}{r['dropped']:>9}{r['collect_success']:>9.1%}"
              f"{r['mean_length']:>8.2f}  {r['staleness']}")
    print(json.dumps(rows))
    if args.json:
        cmd = " ".join(["python benchmarks/learner_throughput.py", *(argv or sys.argv[1:])])
        Path(args.json).write_text(json.dumps({"command": cmd, "rows": rows}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
