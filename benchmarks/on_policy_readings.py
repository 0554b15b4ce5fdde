"""The per-iteration readings of PPO / GRPO runs side by side (issue 28): what tells an
on-policy update's health apart, read from each run's metrics.jsonl.

    python benchmarks/on_policy_readings.py runs/ppo runs/ppo_lr1e-5      # a table per run
    python benchmarks/on_policy_readings.py RUN... --json out.json        # and the numbers

Per online iteration: the success of the trajectories it collected, the share of their steps
that did not parse (``sampled_invalid_share``), the sampling policy's mean token entropy and
its KL (k3) to the starting policy (``kl_start``), the first pass's clip fraction and the
gradient norms of policy and value head (before any cap), the smallest ratio of the last pass
and the token-weighted mean advantage; and each evaluation's held-out success and invalid-step
share. A collapse shows as ``kl_start`` and ``sampled_invalid_share`` rising together.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COLUMNS = ("collect_success", "sampled_invalid_share", "entropy", "kl_start",
           "clip_fraction_first", "grad_norm_policy_first", "grad_norm_value_first",
           "ratio_min", "mean_advantage")
SHORT = ("success", "invalid", "entropy", "KL start", "clip", "|g| policy", "|g| value",
         "ratio min", "mean A")


def readings(run: Path) -> dict:
    """``{"iterations": [...], "evaluations": [...]}`` from ``run``/metrics.jsonl."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    its = [{"iteration": r["iteration"], **{k: r.get(k) for k in COLUMNS}}
           for r in lines if r.get("stage") == "online"]
    evals = [{"stage": r["stage"].removeprefix("eval:"),
              "online_trajectories": r.get("online_trajectories"),
              "success_rate": r.get("success_rate"),
              "invalid_step_rate": r.get("invalid_step_rate")}
             for r in lines if str(r.get("stage", "")).startswith("eval:")]
    return {"run": str(run), "iterations": its, "evaluations": evals}


def _cell(v) -> str:
    return "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))


def table(r: dict) -> str:
    out = [f"### {r['run']}", "", "held-out: " + ", ".join(
        f"{e['stage']} {100 * e['success_rate']:.1f}% ({100 * e['invalid_step_rate']:.1f}% inv)"
        for e in r["evaluations"]), "",
        "| iteration | " + " | ".join(SHORT) + " |", "|---" * (len(SHORT) + 1) + "|"]
    for it in r["iterations"]:
        out.append(f"| {it['iteration']} | " + " | ".join(_cell(it[k]) for k in COLUMNS) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders (with metrics.jsonl)")
    ap.add_argument("--json", type=Path, help="also write the readings here")
    args = ap.parse_args(argv)
    missing = [str(r) for r in args.runs if not (r / "metrics.jsonl").is_file()]
    if missing:
        print(f"no metrics.jsonl in {', '.join(missing)}", file=sys.stderr)
        return 2
    rs = [readings(r) for r in args.runs]
    print("\n".join(table(r) for r in rs))
    if args.json:
        args.json.write_text(json.dumps(rs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
