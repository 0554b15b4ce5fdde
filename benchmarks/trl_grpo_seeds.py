"""TRL's SFT warm-up then GRPO on the simulated phone, per seed: held-out success before
(after SFT) and after GRPO, the paired difference's 95% t-interval (issue 51).

    python benchmarks/trl_grpo_seeds.py --seeds 0 1 2       # the recipe's --tiny --warmup setting

Runs ``recipes/trl_grpo.py --tiny --warmup --seed S --out runs/trl_grpo_seeds/seed_S`` plus
the arguments after ``--`` once per seed (one after the other), then writes
``benchmarks/results/trl_grpo.json``: per seed ``before`` and ``after`` (the true rate, the
judged one, the valid tool-call share), each phase's steps/second and wall time, the GRPO
reward/KL curve; the paired difference after - before with its t-interval; the commit and
whether the package or the recipes had uncommitted changes (gridlib's ``tree_state``); the
settings.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "trl_grpo.json"


def paired(per_seed: dict[str, dict[str, Any]], key: str) -> dict[str, Any]:
    """after - before of ``key`` per seed, its mean and 95% t-interval."""
    from digirl_lite.viz.curves import mean_ci95

    diffs = [s["after"][key] - s["before"][key] for s in per_seed.values()]
    m, lo, hi = mean_ci95(diffs)
    return {"per_seed": diffs, "mean": m, "ci95": [lo, hi],
            "every_seed_up": all(d > 0 for d in diffs), "interval_above_0": lo > 0}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--runs", default=str(ROOT / "runs" / "trl_grpo_seeds"))
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--collect-only", action="store_true",
                    help="only read the runs' summaries and write the results")
    args = ap.parse_args(argv)
    if str(ROOT) not in sys.path:  # run as a script, sys.path[0] is benchmarks/
        sys.path.insert(0, str(ROOT))
    from benchmarks.gridlib.provenance import tree_state

    # the commit, the code's id there, and any uncommitted change to what the runs execute
    code = tree_state(["digirl_lite", "recipes"], ["digirl_lite", "recipes"])
    per_seed: dict[str, dict[str, Any]] = {}
    for seed in args.seeds:
        run = Path(args.runs) / f"seed_{seed}"
        cmd = [sys.executable, str(ROOT / "recipes" / "trl_grpo.py"), "--tiny", "--warmup",
               "--seed", str(seed), "--out", str(run), *extra]
        if not args.collect_only:
            t0 = time.perf_counter()
            print("+", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True, cwd=ROOT)
            print(f"seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
        s = json.loads((run / "summary.json").read_text())
        per_seed[str(seed)] = {
            "before": s["before"], "after": s["after"], "phases": s["phases"],
            "grpo_log": s["rewards"], "infrastructure": s["infrastructure"],
            "settings": s["settings"], "command": s["command"]}
    worlds = sorted({s["settings"]["world"] for s in per_seed.values()})
    result = {
        "what": "TRL SFT warm-up on the scripted expert's tool calls, then GRPO "
                "(environment_factory, the served phone); held-out success by the package's "
                f"evaluation on the first eval_tasks test tasks of {', '.join(worlds)} (issue 51)",
        "code": code, "extra_args": extra, "seeds": per_seed,
        "paired_true": paired(per_seed, "true_success_rate"),
        "paired_judged": paired(per_seed, "success_rate"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=float) + "\n")
    p = result["paired_true"]
    for seed, s in per_seed.items():
        print(f"seed {seed}: before {100 * s['before']['true_success_rate']:.1f}% "
              f"after {100 * s['after']['true_success_rate']:.1f}% (true)")
    print(f"after - before: {100 * p['mean']:+.1f} points, 95% t-interval "
          f"[{100 * p['ci95'][0]:+.1f}, {100 * p['ci95'][1]:+.1f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
