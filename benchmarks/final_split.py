"""A split for a claim, measured once (issue 32, item 5): each grid arm's starting policy and
main-job checkpoint evaluated on the test list and held-out splits in one call, and the JSON
written from the evaluation reports (no number by hand).

The held-out split ``webshop_unseen_phrasings`` served to design (the span readers, the
extractor's data, the wide train phrasings were chosen on it); ``webshop_final_phrasings`` was
written after, and no run evaluates it by default. This script evaluates it, beside the test
list and the design split, for the policies a claim is about:

    python benchmarks/final_split.py generalization_webshop \\
        --arms varied_phrasing_copy_spanx_wide_once --seeds 0 1 2
    python benchmarks/final_split.py generalization_webshop --arms A --runs A=/elsewhere/runs
    python benchmarks/final_split.py generalization_webshop --arms A --dry-run

For each arm and seed: ``start`` is the arm's starting policy under the arm's settings (its
decoding masks included); ``after`` is the last checkpoint of the arm's run folder
(``<runs>/<grid>/<arm>/seed<S>/checkpoints/``, ``--runs ARM=DIR`` where the run lives in another
checkout), with the run's commit from its grid result file. Each evaluation is
``recipes/evaluate.py`` (``--seed S``, ``--stage final``) in a fresh process; its output stays
in ``--work``. Rows are merged into ``--out`` by (arm, seed, stage): a later call adds or
replaces its own rows only. Rates are the environment's true success where it has one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gridlib import RESULTS, RUNS, load_spec  # noqa: E402

SPLITS = ("unseen_phrasings", "final_phrasings")


def _rate(rep: dict[str, Any]) -> float:
    r = rep.get("true_success_rate")
    return float(rep["success_rate"] if r is None else r)


def row_of(report: dict[str, Any], splits: tuple[str, ...]) -> dict[str, Any]:
    """An evaluation report (``eval_<stage>.json``) as a row: the test list's rate and each
    split's, in %, each split's gap to the test list, and the episode counts."""
    test = _rate(report)
    row: dict[str, Any] = {"test": round(100 * test, 1),
                           "episodes": {"test": report.get("episodes")}}
    for s in splits:
        rep = report.get("splits", {}).get(s)
        if rep is None:
            raise KeyError(f"the evaluation has no split {s!r} (has: "
                           f"{', '.join(report.get('splits', {})) or 'none'})")
        row[s] = round(100 * _rate(rep), 1)
        row[f"gap_{s}"] = round(100 * (_rate(rep) - test), 1)
        row["episodes"][s] = rep.get("episodes", rep.get("n"))
    return row


def last_checkpoint(run: Path) -> Path:
    """The policy of a run folder's last checkpoint."""
    ck = run / "checkpoints"
    latest = ck / "latest"
    name = latest.read_text().strip() if latest.is_file() else None
    if not name:
        names = sorted(p.name for p in ck.glob("ckpt-*")) if ck.is_dir() else []
        if not names:
            raise FileNotFoundError(f"{run}: no checkpoint (is the run finished?)")
        name = names[-1]
    return ck / name / "policy"


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def plan(grid: str, arms: list[str] | None, seeds: list[int] | None, runs: dict[str, Path],
         stages: tuple[str, ...], splits: tuple[str, ...], work: Path) -> list[dict[str, Any]]:
    """One entry per evaluation: arm, seed, stage, policy, the run's commit and the command."""
    spec = load_spec(grid)
    names = [a.name for a in spec.arms]
    for a in arms or []:
        if a not in names:
            raise SystemExit(f"grid {spec.name} has no arm {a!r} (arms: {', '.join(names)})")
    out = []
    for arm in spec.arms:
        if arms and arm.name not in arms:
            continue
        for seed in seeds or spec.seeds:
            run = Path(runs.get(arm.name, RUNS)) / arm.grid / arm.name / f"seed{seed}"
            result = RESULTS / arm.grid / f"{arm.name}-seed{seed}.json"
            run_commit = (json.loads(result.read_text()).get("git", {}).get("commit")
                          if result.is_file() else None)
            sets = [f"{k}={json.dumps(v)}" for k, v in arm.set.items() if k != "starting_policy"]
            for stage in stages:
                policy = (str(arm.set.get("starting_policy", "shipped")) if stage == "start"
                          else str(last_checkpoint(run)))
                dest = work / arm.grid / arm.name / f"seed{seed}" / stage
                cmd = [sys.executable, "recipes/evaluate.py", "--policy", policy, "--out",
                       str(dest), "--seed", str(seed), "--quiet", "--stage", "final",
                       "--splits", *splits,
                       *(["--world", arm.world] if arm.world else []),
                       *(["--config", arm.config] if arm.config else []),
                       *(["--set", *sets] if sets else [])]
                out.append({"arm": arm.name, "seed": seed, "stage": stage, "policy": policy,
                            "run_commit": run_commit if stage == "after" else None,
                            "out": dest, "command": cmd})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid")
    ap.add_argument("--arms", nargs="*", default=None)
    ap.add_argument("--seeds", nargs="*", type=int, default=None)
    ap.add_argument("--stages", nargs="*", default=["start", "after"],
                    choices=["start", "after"])
    ap.add_argument("--splits", nargs="*", default=list(SPLITS))
    ap.add_argument("--runs", nargs="*", default=[], metavar="ARM=DIR",
                    help="the runs folder (holding <grid>/<arm>/seed<S>) of an arm run elsewhere")
    ap.add_argument("--work", default=str(ROOT / "runs" / "final_split"),
                    help="where the evaluations write their episodes and reports")
    ap.add_argument("--out", default=None,
                    help="the JSON (default benchmarks/results/final_split_<grid>.json)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args(argv)
    runs = {}
    for item in args.runs:
        arm, sep, d = item.partition("=")
        if not sep or not d:
            ap.error(f"--runs takes ARM=DIR, got {item!r}")
        runs[arm] = Path(d).expanduser()
    splits = tuple(args.splits)
    todo = plan(args.grid, args.arms, args.seeds, runs, tuple(args.stages), splits,
                Path(args.work))
    if args.dry_run:
        for e in todo:
            print(" ".join(e["command"]))
        return 0
    path = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / \
        f"final_split_{Path(args.grid).stem}.json"
    doc = json.loads(path.read_text()) if path.is_file() else {"rows": []}
    commit = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--", "digirl_lite", "recipes"))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for e in todo:
        print(f"{e['arm']} seed {e['seed']} {e['stage']}: {e['policy']}", flush=True)
        subprocess.run(e["command"], cwd=ROOT, env=env, check=True)
        report = json.loads((e["out"] / "eval_final.json").read_text())
        row = {"arm": e["arm"], "seed": e["seed"], "stage": e["stage"],
               "policy": e["policy"], "run_commit": e["run_commit"],
               "eval_commit": commit, "eval_dirty": dirty,
               **row_of(report, splits),
               "command": " ".join(e["command"][1:])}
        doc["rows"] = [r for r in doc["rows"] if (r["arm"], r["seed"], r["stage"])
                       != (e["arm"], e["seed"], e["stage"])] + [row]
        doc["rows"].sort(key=lambda r: (r["arm"], r["stage"] != "start", r["seed"]))
        doc["description"] = __doc__.split("\n\n")[0].replace("\n", " ")
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"  test {row['test']}  " + "  ".join(
            f"{s} {row[s]} (gap {row['gap_' + s]})" for s in splits), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
