"""What the span extractor's fine-tuning costs and what a smaller budget loses (issue 47,
item 6: the paper setting's main job must fit the first command's time level, and the
extractor's 300 full fine-tuning steps took 679-1,057 s on a fresh clone).

For each world and budget (steps; encoder layers trained), :class:`SpanExtractor` is
fine-tuned on exactly the pairs a run trains it on (:func:`extractor_pairs` with the paper
setting's ``typed_span_phrasings`` "wide", half the data rephrased, no drills) and scored by
exact match of its best span against the task's typed text (the product; a General search's
query) on the test list and the world's held-out splits. ``--cached`` also scores the
extractors the runs saved in the cache (the grids' 300-step ones), found by their key.

    OMP_NUM_THREADS=1 python benchmarks/span_extractor_budget.py --steps 40 100 --cached \\
        --out benchmarks/results/span_extractor_budget.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import torch


def _scored(ex, world: str) -> dict[str, float]:
    from digirl_lite.envs.sim.tasks import UnsupportedTaskError, load_task_file, parse_task
    from digirl_lite.paths import data_dir
    from digirl_lite.policy.span_extractor import _source
    from digirl_lite.train.config import SHIPPED_SPLITS

    out = {}
    for name in ("test", *SHIPPED_SPLITS[world]):
        hit = n = 0
        for line in load_task_file(data_dir() / "tasks" / f"{world}_{name}.txt"):
            text = line if isinstance(line, str) else line.text
            try:
                q = parse_task(text).query
            except (UnsupportedTaskError, ValueError):
                continue
            if not q:
                continue
            span = ex.best_span(text)
            n += 1
            hit += span is not None and _source(text)[span[0]:span[1]] == q.lower()
        out[name] = round(hit / n, 4)
        out[f"{name}_n"] = n
    return out


def main() -> None:
    from digirl_lite.envs.sim.drills import extractor_pairs
    from digirl_lite.paths import user_cache_dir
    from digirl_lite.policy.span_extractor import SpanExtractor
    from digirl_lite.train.config import sim_webshop
    from digirl_lite.train.starting import span_extractor

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", nargs="+", default=["webshop", "general"])
    ap.add_argument("--steps", type=int, nargs="+", default=[40, 100])
    ap.add_argument("--train-layers", type=int, nargs="+", default=[-1],
                    help="encoder layers fine-tuned (top ones); -1: all (the runs' setting)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cached", action="store_true",
                    help="also score the runs' cached 300-step extractors (never trains one)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    rows = []
    for world in args.worlds:
        if args.cached:
            cfg = sim_webshop(world=world, copy_typed_text=True, typed_span_extractor="minilm",
                              typed_span_phrasings="wide", sft_seed=args.seed)
            cache = user_cache_dir()
            before = set(cache.glob("spanx-*"))
            ex = span_extractor(cfg, cache_dir=cache)
            if set(cache.glob("spanx-*")) != before:
                print("(no cached extractor: one was trained and cached)")
            rows.append({"world": world, "steps": 300, "train_layers": "all",
                         "seconds": None, "source": "cache", **_scored(ex, world)})
            print(rows[-1], flush=True)
        pairs = extractor_pairs(world, 0.5, "wide", args.seed, 0)
        for layers in args.train_layers:
            for steps in args.steps:
                ex = SpanExtractor.pretrained(seed=args.seed)
                t0 = time.perf_counter()
                fit = ex.fit(pairs, steps=steps, seed=args.seed,
                             train_layers=None if layers < 0 else layers)
                secs = round(time.perf_counter() - t0, 1)
                rows.append({"world": world, "steps": steps,
                             "train_layers": "all" if layers < 0 else layers,
                             "seconds": secs, "final_loss": round(fit["final_loss"], 4),
                             **_scored(ex, world)})
                print(rows[-1], flush=True)
    res = {"what": __doc__.split("\n\n")[0], "commit": commit,
           "threads": torch.get_num_threads(), "seed": args.seed, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
