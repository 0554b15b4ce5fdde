"""A grid's table from its result files alone (``--table``): table.json
(:func:`make_table`), table.md (:func:`table_markdown`) and curves.png
(:func:`plot_curves`), written by :func:`write_table`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .provenance import version_label
from .repo import RESULTS
from .results import _diff_config, load_results
from .spec import GridSpec
from .stats import (
    _nanmean,
    mixed_commits,
    mixed_environments,
    mixed_threads,
    pair_differences,
    paired_difference,
    split_stats,
    stage_stats,
)


def make_table(spec: GridSpec, results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """table.json's content: per arm, every stage's statistics, the mean wall time, the
    configs' differences across seeds, and the seed-by-seed differences from the
    reference arm."""
    arms: dict[str, Any] = {}
    for name, recs in results.items():
        order = list(dict.fromkeys(st for r in recs for st in r["stages"]))
        base = {k: v for k, v in recs[0].get("config", {}).items() if k != "seed"}
        differ = sorted({k for r in recs[1:] for k in _diff_config(
            base, {k: v for k, v in r.get("config", {}).items() if k != "seed"})})
        arms[name] = {
            "grid": recs[0].get("grid"),
            "stages": {st: stage_stats(recs, st) for st in order},
            "wall_s_mean": _nanmean([r.get("wall_s") for r in recs]),
            "piles_built": sum(r.get("pile_cached") is False for r in recs),
            "online_iteration_s": {k: _nanmean([r.get("online_iteration_s", {}).get(k)
                                                for r in recs])
                                   for k in (recs[0].get("online_iteration_s") or {})},
            "config_differs_across_seeds": differ,
            "commands": [r["command"] for r in recs],
            "git_commits": sorted({c or "?" for r in recs for c in (
                (r.get("git") or {}).get("commits") or [(r.get("git") or {}).get("commit")])}),
            "code_versions": sorted({version_label(r) for r in recs}),
            "cpu_kernels": sorted({(r.get("environment") or {}).get("torch_cpu_capability")
                                   or "?" for r in recs}),
        }
    ref = spec.reference or (spec.arms[0].name if spec.arms else None)
    diffs: dict[str, Any] = {}
    if ref in results:
        for name, recs in results.items():
            if name != ref:
                diffs[name] = {st: paired_difference(recs, results[ref], st)
                               for st in spec.stages}
    general = {name: {st: g for st in spec.stages if (g := split_stats(recs, st))}
               for name, recs in results.items()}
    return {"grid": spec.name, "description": spec.description,
            # arms whose DarwinX teacher reads the simulator's state: the title says so
            "privileged": [a.name for a in spec.arms
                           if a.set.get("teacher") == "privileged_expert"],
            "command": f"python benchmarks/grid.py {spec.name}",
            "stages": list(spec.stages), "reference": ref, "arms": arms,
            "differences_from_reference": diffs,
            "pair_differences": pair_differences(spec, results),
            "generalization": {name: g for name, g in general.items() if g},
            "mixed_commits": mixed_commits(results, ref, spec.pairs),
            "mixed_threads": mixed_threads(results, ref, spec.pairs),
            "mixed_environments": mixed_environments(results, ref, spec.pairs)}


def mixed_threads_lines(t: dict[str, Any]) -> list[str]:
    """One line per pair of arms naming its runs that :func:`mixed_threads` found."""
    by_pair: dict[tuple[str, str], list[str]] = {}
    for m in t.get("mixed_threads", []):
        by_pair.setdefault((m["arm"], m["reference"]), []).append(
            f"seed {m['seed']} {'/'.join(map(str, m['threads']))} vs "
            f"{'/'.join(map(str, m['reference_threads']))}")
    return [f"- `{arm}` - `{ref}`: " + "; ".join(seeds)
            for (arm, ref), seeds in by_pair.items()]


def mixed_environments_lines(t: dict[str, Any]) -> list[str]:
    """One line per paired run that :func:`mixed_environments` found."""
    return [f"- `{m['arm']}` - `{m['reference']}` seed {m['seed']}: " + "; ".join(m["differ"])
            for m in t.get("mixed_environments", [])]


def mixed_commits_lines(t: dict[str, Any]) -> list[str]:
    """One line per arm naming its runs that :func:`mixed_commits` found."""
    by_pair: dict[tuple[str, str], list[str]] = {}
    for m in t.get("mixed_commits", []):
        by_pair.setdefault((m["arm"], m["reference"]), []).append(
            f"seed {m['seed']} {m['commit']} vs {m['reference_commit']}")
    return [f"- `{arm}` - `{ref}`: " + "; ".join(seeds)
            for (arm, ref), seeds in by_pair.items()]


def _difference_rows(head: str, diffs: dict[str, Any], stages: list[str]) -> list[str]:
    """A markdown table of seed-by-seed differences: one row per name, one cell per stage
    (mean in points, its 95% interval, the number of seeds)."""
    rows = [f"| {head} | " + " | ".join(stages) + " |", "|---|" + "---|" * len(stages)]
    for name, d in diffs.items():
        cells = ["-" if (x := d.get(st)) is None else
                 f"{100 * x['mean']:+.1f}{_ci(*x['ci95'])} ({len(x['seeds'])})" for st in stages]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return rows


def _pct(x: float | None) -> str:
    return "-" if x is None or x != x else f"{100 * x:.1f}"


def _ci(lo: float, hi: float) -> str:
    return "" if lo != lo else f" [{100 * lo:.1f}, {100 * hi:.1f}]"


def _true_cell(true: dict[str, Any] | None) -> str:
    """The ``true`` column: the pooled true rate, its interval and count, and how often the
    judge was right ("-" for a stage without a truth)."""
    if true is None:
        return "-"
    acc = true["judge_accuracy"]
    right = "" if acc != acc else f"; judge {_pct(acc)}% right"
    return (f"{_pct(true['pooled'])}{_ci(*true['ci95_pooled'])} "
            f"({true['successes']}/{true['n']}{right})")


def table_markdown(t: dict[str, Any]) -> str:
    truth = any(s and s.get("true") for a in t["arms"].values() for s in a["stages"].values())
    priv = t.get("privileged")
    out = [f"# Grid `{t['grid']}`" + (f" (privileged teacher: {', '.join(priv)})" if priv
                                      else ""), ""]
    if t["description"]:
        out += [t["description"], ""]
    out += [f"Reproduce: `{t['command']}` (resumes; `--table` rebuilds this table from the "
            "result files alone).", "",
            "Held-out success per stage, in %. *Over seeds*: mean of the per-seed rates with "
            "a 95% t-interval (n - 1 degrees of freedom, clipped to [0, 100]); *pooled*: all "
            "seeds' episodes together (successes / judged episodes) with a Wilson 95% "
            "interval. *Length*: mean steps of the successful episodes. *Invalid*: share "
            "of evaluation steps whose action did not parse (where reported). "
            + ("*True*: the environment's own check instead of the judge, pooled over the "
               "seeds that have one (successes / episodes with a truth, unjudged ones "
               "included) with a Wilson 95% interval, and the share of judged episodes the "
               "judge called right. " if truth else "")
            + "*Wall*: "
            "minutes per run (mean over seeds; a run that built its pile rather than read "
            "it from the cache takes longer: `piles_built` in table.json).", "",
            "| arm | stage | seeds | over seeds | pooled | " + ("true | " if truth else "")
            + "length | invalid | failure kinds | wall |",
            "|---|---|---|---|---|" + ("---|" if truth else "") + "---|---|---|---|"]
    for name, a in t["arms"].items():
        for st in t["stages"]:
            s = a["stages"].get(st)
            if s is None:
                continue
            true_cell = f"{_true_cell(s.get('true'))} | " if truth else ""
            kinds = ", ".join(f"{k} {v}" for k, v in s["failure_kinds"].items() if v) or "-"
            length = "-" if s["mean_length_success"] != s["mean_length_success"] else \
                f"{s['mean_length_success']:.1f}"
            day = f" (day {s['day']})" if s.get("day") not in (None, 1) else ""
            out.append(f"| {name} | {st}{day} | {s['n_seeds']} | {_pct(s['mean'])}"
                       f"{_ci(*s['ci95_seeds'])} | {_pct(s['pooled'])}{_ci(*s['ci95_pooled'])}"
                       f" ({s['successes']}/{s['n']}) | {true_cell}{length} | "
                       f"{_pct(s['invalid_step_rate'])} | {kinds} | "
                       f"{a['wall_s_mean'] / 60:.1f} |")
    if t["differences_from_reference"]:
        out += ["", f"Difference from `{t['reference']}`, seed by seed (points of success; "
                "mean with a 95% t-interval over the seeds both arms have):", "",
                *_difference_rows("arm", t["differences_from_reference"], t["stages"])]
    if t.get("pair_differences"):
        out += ["", "Paired differences, seed by seed (the spec's `pairs`: points of success; "
                "mean with a 95% t-interval over the seeds every arm of the row has):", "",
                *_difference_rows("difference", t["pair_differences"], t["stages"])]
    if t["differences_from_reference"] or t.get("pair_differences"):
        if lines := mixed_commits_lines(t):
            out += ["", f"**Warning: {len(t['mixed_commits'])} of these pairs compare runs on "
                    "different code** (commit, `+dirty:<diff hash>` for uncommitted changes; "
                    "the difference measures the code's drift as well as the arm; "
                    f"`python benchmarks/grid.py {t['grid']} --rerun-stale <commit>` reruns "
                    "them on one):", "", *lines]
        if lines := mixed_threads_lines(t):
            out += ["", f"**Warning: {len(t['mixed_threads'])} of these pairs compare runs "
                    "with different thread counts** (`OMP_NUM_THREADS`: torch's sums then "
                    "run in another order and the runs part ways as on different code; "
                    "`--jobs` sets it, cpus // jobs):", "", *lines]
        if lines := mixed_environments_lines(t):
            out += ["", f"**Warning: {len(t['mixed_environments'])} of these pairs compare "
                    "runs recorded in different environments** (CPU kernels or library "
                    "versions: the runs part ways as on different code):", "", *lines]
    out += generalization_markdown(t.get("generalization") or {})
    notes = [f"- `{n}`: configs differ across seeds in "
             + ", ".join(a["config_differs_across_seeds"])
             for n, a in t["arms"].items() if a["config_differs_across_seeds"]]
    splits = [f"- `{n}`: " + ", ".join(f"{k} {v:.2f}"
                                       for k, v in a["online_iteration_s"].items())
              for n, a in t["arms"].items() if a["online_iteration_s"]]
    if splits:
        out += ["", "Seconds per online iteration (mean), by part:", "", *splits]
    if notes:
        out += ["", "Warnings:", "", *notes]
    commits = sorted({c for a in t["arms"].values() for c in a["code_versions"]})
    out += ["", f"Code: commit(s) {', '.join(commits)}; the exact command, config and "
            "attempts (commit, threads, wall time) of each run are in its result file.", ""]
    return "\n".join(out)


def generalization_markdown(g: dict[str, Any]) -> list[str]:
    """table.md's "Generalization splits" section (issue 32 item 5): per arm and stage with
    held-out splits, the test list's and each split's rate over seeds and the split's gap
    to the test list (:func:`split_stats`); no lines where no run has splits."""
    if not g:
        return []
    names = list(dict.fromkeys(n for a in g.values() for s in a.values() for n in s["splits"]))
    kinds = {s["rate"] for a in g.values() for s in a.values()}
    mixed = len(kinds) > 1
    which = ("the true success rate where every seed has the environment's check (rows "
             "marked true), else the judged one (rows marked judged)" if mixed else
             {"true": "the environment's true success rate (its own check, not the judge)",
              "judged": "the judged success rate (no ground truth)"}[kinds.pop()])
    out = ["", "## Generalization splits", "",
           f"Held-out splits beside the test list, in %: {which}; mean over seeds with a 95% "
           "t-interval. *Gap*: split - test, seed by seed (points; mean with a 95% "
           "t-interval).", "",
           "| arm | stage | seeds | test | " + " | ".join(f"{n} | gap" for n in names) + " |",
           "|---|---|---|---|" + "---|---|" * len(names)]
    for arm, stages in g.items():
        for st, s in stages.items():
            cells = []
            for n in names:
                x = s["splits"].get(n)
                cells += (["-", "-"] if x is None else
                          [f"{_pct(x['mean'])}{_ci(*x['ci95_seeds'])}",
                           f"{100 * x['gap']['mean']:+.1f}{_ci(*x['gap']['ci95'])}"])
            mark = f" ({s['rate']})" if mixed else ""
            out.append(f"| {arm} | {st}{mark} | {len(s['test']['seeds'])} | "
                       f"{_pct(s['test']['mean'])}{_ci(*s['test']['ci95_seeds'])} | "
                       + " | ".join(cells) + " |")
    return out


def plot_curves(spec: GridSpec, results: dict[str, list[dict[str, Any]]], path: Path
                ) -> Path | None:
    """curves.png: each arm's held-out success against the spec's ``curve_x`` (online
    trajectories, or the phone's drift day), from the offline evaluation on: the mean over
    seeds with its 95% band."""
    import matplotlib

    matplotlib.use("Agg")
    from digirl_lite.viz.curves import plot_seed_bands

    x = spec.curve_x
    arms = {}
    for name, recs in results.items():
        curves = []
        for r in recs:
            pts = [p for p in r.get("curve", []) if p["stage"] != "copier" and x in p]
            curves.append(([p[x] for p in pts],
                           [p["success_rate"] for p in pts]))
        arms[name] = curves
    if not any(xs for c in arms.values() for xs, _ in c):
        return None
    fig = plot_seed_bands(arms, xlabel=x.replace("_", " "),
                          title=f"{spec.name}: held-out success, mean over seeds, 95% band")
    fig.savefig(path, dpi=110)
    return path


def write_table(spec: GridSpec, results_dir: Path = RESULTS) -> list[Path]:
    """table.md, table.json and curves.png in ``results_dir/<grid>/``, from the result files."""
    results = load_results(results_dir, spec)
    d = results_dir / spec.name
    d.mkdir(parents=True, exist_ok=True)
    t = make_table(spec, results)
    (d / "table.json").write_text(json.dumps(t, indent=1, default=float) + "\n")
    md = table_markdown(t)
    (d / "table.md").write_text(md)
    paths = [d / "table.md", d / "table.json"]
    if (png := plot_curves(spec, results, d / "curves.png")) is not None:
        paths.append(png)
    print(md)
    if lines := mixed_commits_lines(t):
        print(f"warning: grid {spec.name}: {len(t['mixed_commits'])} paired run(s) differ "
              "from their reference run in code:\n" + "\n".join(lines), file=sys.stderr)
    if lines := mixed_threads_lines(t):
        print(f"warning: grid {spec.name}: {len(t['mixed_threads'])} paired run(s) ran with "
              "other thread counts than their reference run:\n" + "\n".join(lines),
              file=sys.stderr)
    if lines := mixed_environments_lines(t):
        print(f"warning: grid {spec.name}: {len(t['mixed_environments'])} paired run(s) ran "
              "in another environment than their reference run:\n" + "\n".join(lines),
              file=sys.stderr)
    return paths
