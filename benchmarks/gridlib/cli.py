"""The command line of ``benchmarks/grid.py`` (:func:`main`; the package docstring says what
a grid is)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from . import repo
from .provenance import require_clean, tree_state
from .repo import GRIDS, RESULTS, RUNS
from .results import commit_files
from .runner import cpu_count, rerun_stale, run_jobs
from .spec import Job, SpecError, jobs_of, load_spec
from .tables import write_table


def list_grids(runs_dir: Path, results_dir: Path) -> None:
    for p in sorted(GRIDS.glob("*.json")):
        try:
            spec = load_spec(p)
        except SpecError as e:
            print(f"{p.stem}: BAD SPEC: {e}")
            continue
        jobs = jobs_of(spec, runs_dir=runs_dir, results_dir=results_dir)
        done = sum(j.state() == "done" for j in jobs)
        flag = f" (placeholder: {spec.placeholder})" if spec.placeholder else ""
        print(f"{spec.name}: {len(spec.arms)} arms x {len(spec.seeds)} seeds, {done}/"
              f"{len(jobs)} done{flag}")


def main(argv: list[str] | None = None) -> int:
    # the package docstring's first paragraph: what a grid is
    ap = argparse.ArgumentParser(description=sys.modules[__package__].__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("grid", nargs="?", help="a name under benchmarks/grids/, or a spec path")
    ap.add_argument("--list", action="store_true", help="the grids and how far each is")
    ap.add_argument("--table", action="store_true",
                    help="only write the table (from the result files)")
    ap.add_argument("--jobs", type=int, default=cpu_count(),
                    help="runs at a time (default: the CPUs; each gets cpus // jobs threads)")
    ap.add_argument("--arms", nargs="+", help="only these arms")
    ap.add_argument("--seeds", type=int, nargs="+", help="these seeds instead of the spec's")
    ap.add_argument("--commit", action="store_true",
                    help="git-commit each result file as it is written, and the table")
    ap.add_argument("--quick", action="store_true",
                    help="pass --quick to the recipe (a wiring check: runs and results go "
                         "under runs/grid_quick/, never committed)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print each job's state and command, run nothing")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="start runs on uncommitted changes to the package, this runner, "
                         "the grid spec or the recipe (refused otherwise); each result is "
                         "marked dirty, with the sha256 of the diff (--quick allows them: "
                         "a wiring check)")
    ap.add_argument("--rerun-stale", metavar="COMMIT",
                    help="first clear the runs whose result (or unfinished run) is not on "
                         "COMMIT's code, clean, so that they run again; HEAD must be "
                         "COMMIT (or have its code)")
    ap.add_argument("--runs-dir", type=Path, default=None)
    ap.add_argument("--results-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    runs_dir = (args.runs_dir or (repo.ROOT / "runs" / "grid_quick" if args.quick
                                  else RUNS)).resolve()
    results_dir = (args.results_dir or (runs_dir / "results" if args.quick else RESULTS)).resolve()
    if args.list:
        list_grids(runs_dir, results_dir)
        return 0
    if not args.grid:
        ap.error("name a grid (or --list)")
    if args.quick and args.commit:
        ap.error("--quick results are a wiring check: not committed")
    if args.rerun_stale and (args.table or args.allow_dirty):
        ap.error("--rerun-stale runs on a clean tree: not with --table or --allow-dirty")
    try:
        spec = load_spec(args.grid)
        jobs = jobs_of(spec, arms=args.arms, seeds=args.seeds, runs_dir=runs_dir,
                       results_dir=results_dir, quick=args.quick)
        if not args.table:
            if spec.placeholder:
                raise SpecError(f"grid {spec.name} is a placeholder: {spec.placeholder}")
            if args.rerun_stale:
                if not args.dry_run:  # nothing is cleared that could not be rerun
                    require_clean(jobs, f"grid {spec.name}")
                rerun_stale(jobs, args.rerun_stale, dry_run=args.dry_run)
            if args.dry_run:
                _print_tree(jobs)
                for j in jobs:
                    j.expected_config()
                    st = j.state()
                    print(f"{j.arm.grid}/{j.name}: {st}" + ("" if st == "done" else
                          "\n    " + shlex.join(j.command(resume=st == "resume",
                                                          python="python"))))
                return 0
            outcome = run_jobs(jobs, max(1, args.jobs), commit=args.commit,
                               stages=spec.stages,
                               allow_dirty=args.allow_dirty or args.quick)
            print(f"grid {spec.name}: {len(outcome['ran'])} run, {len(outcome['skipped'])} "
                  f"already done, {len(outcome['busy'])} run by another process, "
                  f"{len(outcome['failed'])} failed"
                  + (f", {len(outcome['refused'])} not started (uncommitted changes)"
                     if outcome["refused"] else ""))
    except SpecError as e:
        print(f"grid: {e}", file=sys.stderr)
        return 2
    paths = write_table(spec, results_dir)
    if args.commit:
        commit_files(paths, f"grid {spec.name}: table")
    return 1 if not args.table and (outcome["failed"] or outcome["refused"]) else 0


def _print_tree(jobs: list[Job]) -> None:
    watched = list(dict.fromkeys(w for j in jobs for w in j.watched_files()))
    state = tree_state(watched, [])
    print(f"code: {state['commit']}" + ("" if not state["dirty"] else
          ", uncommitted changes (a run is refused without --allow-dirty): "
          + ", ".join(line.strip() for line in state["changed"])))


if __name__ == "__main__":
    sys.exit(main())
