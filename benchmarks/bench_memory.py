"""Memory of the main job over online iterations: the learner's resident set size (RSS)
after each phase, and how many screenshots the run keeps decoded in memory.

    python benchmarks/bench_memory.py                      # 10 iterations, 2 actor updates
    python benchmarks/bench_memory.py --iterations 30 --actor-updates 20

The run is the default simulated Web Shopping configuration (shipped starting policy, the
pile built or taken from the cache) without the offline training and the evaluations, which
do not change what the run keeps. A run whose memory grows with iterations shows it here long
before a 30-iteration job is killed for memory. Prints one line per iteration and a JSON
summary.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def rss_gb() -> float:
    """This process's resident set size in GB (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1e6
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--actor-updates", type=int, default=2,
                    help="per iteration (the preset's 20 only adds time, not memory)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", default="runs/cache", help="pile cache (as the recipe's)")
    args = ap.parse_args()

    from digirl_lite.train.config import sim_webshop
    from digirl_lite.train.trainer import Trainer

    cfg = sim_webshop(seed=args.seed, actor_updates=args.actor_updates)
    rows = []
    with tempfile.TemporaryDirectory() as out:
        tr = Trainer(cfg, out, cache_dir=args.cache, progress=False)
        try:
            tr.build_starting_policy()
            pile = tr.build_pile()
            tr._store_append(pile)
            tr.buffer.add(pile)
            start = rss_gb()
            print(f"after the pile ({len(pile)} trajectories): RSS {start:.2f} GB, "
                  f"{len(tr.screens)} screens, {tr.screens.in_memory()} decoded", flush=True)
            for k in range(1, args.iterations + 1):
                tr.online_iteration(k)
                rows.append({"iteration": k, "rss_gb": round(rss_gb(), 3),
                             "screens": len(tr.screens),
                             "decoded_in_memory": tr.screens.in_memory()})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            tr.close()
    half = rows[len(rows) // 2]["rss_gb"] if rows else start
    print(json.dumps({"rss_after_pile_gb": round(start, 3),
                      "rss_mid_gb": half, "rss_end_gb": rows[-1]["rss_gb"] if rows else start,
                      "growth_second_half_gb": round(rows[-1]["rss_gb"] - half, 3) if rows
                      else 0.0, "iterations": args.iterations}))


if __name__ == "__main__":
    main()
