"""Memory of the main job over online iterations: the learner's resident set size (RSS)
after each iteration, how many screenshots the run keeps decoded in memory, what its screen
table and caches hold, and how long each iteration's store append takes.

    python benchmarks/bench_memory.py                      # 10 iterations, 2 actor updates
    python benchmarks/bench_memory.py --iterations 30 --actor-updates 20
    # issue 15: a long run of a small config, the buffer full (and evicting) from iteration 8;
    # no actor updates (they change the policy, not what the run keeps): 2-3 s an iteration
    python benchmarks/bench_memory.py --iterations 200 --pile-size 0 --capacity 32 \
        --rollouts 4 --horizon 4 --critic-updates 1 --grad-accum 1 --actor-updates 0 \
        --text-spare 256 --print-at 1 10 50 100 150 200 \
        --out benchmarks/results/bench_memory_long.json

The run is the default simulated Web Shopping configuration (shipped starting policy, the
pile built or taken from the cache) without the offline training and the evaluations, which
do not change what the run keeps; each iteration is the Trainer's own ``online_iteration``
(collect, store append, buffer, critics, filters, actor, checkpoint). A run whose memory or
append time grows with iterations shows it here long before a 30-iteration job is killed for
memory. Prints one line per iteration (or per ``--print-at`` iteration) and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
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
    ap.add_argument("--pile-size", type=int, default=None,
                    help="offline pile (default: the preset's 528; 0: no pile)")
    ap.add_argument("--capacity", type=int, default=None, help="replay buffer (default 5000)")
    ap.add_argument("--rollouts", type=int, default=None,
                    help="rollouts per iteration (and phones; default 16)")
    ap.add_argument("--horizon", type=int, default=None, help="step budget H (default 20)")
    ap.add_argument("--critic-updates", type=int, default=None, help="per iteration")
    ap.add_argument("--grad-accum", type=int, default=None, help="critic minibatches/update")
    ap.add_argument("--text-spare", type=int, default=None,
                    help="text embeddings kept beyond the buffer's (default: the library's "
                    "SPARE_TEXTS, 4096: more than a short run embeds)")
    ap.add_argument("--no-bound", action="store_true",
                    help="for comparison: keep every screen and cache entry, as before issue 15 "
                    "(Trainer._bound_memory does nothing)")
    ap.add_argument("--print-at", type=int, nargs="*", default=None,
                    help="print only these iterations (default: every one)")
    ap.add_argument("--out", default=None, help="also write every row and the summary here")
    args = ap.parse_args()

    from digirl_lite.train.config import sim_webshop
    from digirl_lite.train.trainer import Trainer

    if args.text_spare is not None:
        import digirl_lite.critics.text as text_mod

        text_mod.SPARE_TEXTS = args.text_spare  # read by Trainer._bound_memory at each call
    if args.no_bound:
        Trainer._bound_memory = lambda self: {}
    overrides = {k: v for k, v in {
        "pile_size": args.pile_size or None, "capacity": args.capacity,
        "rollouts_per_iteration": args.rollouts, "n_envs": args.rollouts,
        "horizon": args.horizon, "critic_updates": args.critic_updates,
        "grad_accum": args.grad_accum}.items() if v is not None}
    cfg = sim_webshop(seed=args.seed, actor_updates=args.actor_updates, **overrides)
    rows = []
    with tempfile.TemporaryDirectory() as out:
        tr = Trainer(cfg, out, cache_dir=args.cache, progress=False)
        try:
            tr.build_starting_policy()
            pile = tr.build_pile() if args.pile_size != 0 else []
            tr._store_append(pile)
            tr.buffer.add(pile)
            start = rss_gb()
            print(f"after the pile ({len(pile)} trajectories): RSS {start:.2f} GB, "
                  f"{len(tr.screens)} screens, {tr.screens.in_memory()} decoded", flush=True)
            t0 = time.perf_counter()
            for k in range(1, args.iterations + 1):
                stored = tr.timings.get("store", 0.0)
                tr.online_iteration(k)
                shards = len(json.loads((Path(out) / "store" / "digirl_store.json")
                                        .read_text())["shards"])
                rows.append({"iteration": k, "rss_gb": round(rss_gb(), 3),
                             "append_ms": round(1e3 * (tr.timings["store"] - stored), 1),
                             "store_shards": shards, "buffer": len(tr.buffer),
                             "screens": len(tr.screens),
                             "decoded_in_memory": tr.screens.in_memory(),
                             "feature_cache": len(tr.features), "text_cache": len(tr.text),
                             "wall_s": round(time.perf_counter() - t0, 1)})
                if args.print_at is None or k in args.print_at:
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            tr.close()
    half = rows[len(rows) // 2]["rss_gb"] if rows else start
    summary = {"rss_after_pile_gb": round(start, 3),
               "rss_mid_gb": half, "rss_end_gb": rows[-1]["rss_gb"] if rows else start,
               "growth_second_half_gb": round(rows[-1]["rss_gb"] - half, 3) if rows
               else 0.0, "iterations": args.iterations}
    if rows:
        tail = max(1, len(rows) // 10)  # mean append time of the first and last tenth
        summary.update({
            "append_ms_first_tenth": round(sum(r["append_ms"] for r in rows[:tail]) / tail, 1),
            "append_ms_last_tenth": round(sum(r["append_ms"] for r in rows[-tail:]) / tail, 1),
            "screens_max": max(r["screens"] for r in rows),
            "feature_cache_max": max(r["feature_cache"] for r in rows),
            "text_cache_max": max(r["text_cache"] for r in rows)})
    print(json.dumps(summary))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"config": {"iterations": args.iterations,
                                                         "actor_updates": args.actor_updates,
                                                         "seed": args.seed,
                                                         "text_spare": args.text_spare,
                                                         "no_bound": args.no_bound,
                                                         **overrides},
                                              "summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
