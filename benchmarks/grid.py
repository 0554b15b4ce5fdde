"""A grid of runs, arms x seeds: each (arm, seed) one `recipes/offline_to_online.py` process,
several at a time, resumable, with one small result file per finished run and one table over
seeds (issue 16, item 3).

    python benchmarks/grid.py table1_webshop              # run what is missing, then the table
    python benchmarks/grid.py table1_webshop --jobs 2 --commit   # commit each result as it lands
    python benchmarks/grid.py table1_webshop --table      # the table from the result files only
    python benchmarks/grid.py ablations_webshop --arms awr critic_mse --seeds 0 --dry-run
    python benchmarks/grid.py table1_webshop --quick --arms digirl --seeds 0   # wiring check
    python benchmarks/grid.py --list

A grid is a JSON spec, ``benchmarks/grids/<grid>.json``::

    {"description": "...", "seeds": [0, 1, 2],
     "world": "webshop", "set": {"eval_every": 5},          # shared by every arm
     "arms": [{"name": "digirl", "from_grid": "table1_webshop"},   # that grid's arm and runs
              {"name": "critic_mse", "set": {"critic_loss": "mse"}},
              {"name": "awr", "set": {"algorithm": "awr"}}],
     "stages": ["copier", "offline", "online"], "reference": "digirl"}

An arm (and the shared part) may give ``world``, ``config`` (a JSON config file), ``set``
(config fields, merged over the shared ones), ``args`` (other recipe flags), ``recipe`` (default
recipes/offline_to_online.py). ``from_grid`` takes an arm, settings and runs, from another grid
(the same runs serve both tables). ``stages``: the table's rows per arm (every stage is in
table.json); ``reference``: the arm the others are compared with, seed by seed (default: the
first); ``curve_x``: curves.png's x, "online_trajectories" (default) or "day" (the simulated
phone's drift day); ``placeholder``: the grid is not ready to run. Keys starting with "_" are
comments.

Where things go (``<grid>`` of the arm: its ``from_grid``, else this grid):

    runs/grid/<grid>/<arm>/seed<S>/                  the run folder (--out of the recipe)
    runs/grid/<grid>/<arm>/seed<S>.log               its output, appended over attempts
    benchmarks/results/grid/<grid>/<arm>-seed<S>.json  the result, written when the run ends
    benchmarks/results/grid/<grid>/table.md, table.json, curves.png

A job with a result file is done and skipped; one whose run wrote its summary gets its result
file; one whose run folder has a checkpoint is rerun with ``--resume``; a run folder without one
holds nothing to keep and is started afresh. So an interrupted grid goes on where it stopped,
here or (with the results committed) elsewhere. A job another live runner holds (its
``seed<S>.lock``) is left to it. Each job runs with ``OMP_NUM_THREADS = cpus // jobs``. The
table and the curves read only result files. ``--quick`` (a wiring check) puts runs and results
under runs/grid_quick/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GRIDS = ROOT / "benchmarks" / "grids"
RUNS = ROOT / "runs" / "grid"
RESULTS = ROOT / "benchmarks" / "results" / "grid"
RECIPE = "recipes/offline_to_online.py"
OWN_CONFIG_RECIPES = {"evolve_harness.py"}
"""Recipes in recipes/ with their own config (not DigiRLConfig): their fields are checked by
the recipe itself when it starts."""
STAGES = ("copier", "offline", "online")
SPEC_KEYS = {"description", "seeds", "arms", "stages", "reference", "placeholder", "curve_x",
             "world", "config", "set", "args", "recipe"}
ARM_KEYS = {"name", "from_grid", "world", "config", "set", "args", "recipe"}
RUNNER_FLAGS = {"--out": "the runner sets it", "--seed": "use the spec's seeds",
                "--resume": "the runner adds it", "--quiet": "the runner adds it",
                "--world": "use the world field", "--set": "use the set field",
                "--config": "use the config field", "--quick": "pass --quick to the runner",
                "--filtered-bc": 'make Filtered BC its own arm: "set": {"algorithm": '
                                 '"filtered_bc"}'}
OPTIONAL_STAGE_KEYS = ("invalid_step_rate", "unjudged", "unjudged_step_rate", "day")
CURVE_X = ("online_trajectories", "day")


class SpecError(ValueError):
    """A grid spec that cannot run; the message names the file and the field."""


# -- the spec ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arm:
    """One arm, its settings merged (shared, then the arm's). ``grid``: the grid whose runs
    and result files it uses (its ``from_grid``, else the spec's own)."""

    name: str
    grid: str
    recipe: str = RECIPE
    world: str | None = None
    config: str | None = None
    set: dict[str, Any] = field(default_factory=dict)
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class GridSpec:
    name: str
    path: Path
    description: str
    seeds: tuple[int, ...]
    arms: tuple[Arm, ...]
    stages: tuple[str, ...] = STAGES
    reference: str | None = None
    placeholder: str | None = None
    curve_x: str = "online_trajectories"


def spec_path(grid: str | os.PathLike[str]) -> Path:
    """A grid's spec file: a path, or a name under benchmarks/grids/."""
    p = Path(grid)
    return p if p.suffix == ".json" else GRIDS / f"{grid}.json"


def _check(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise SpecError(f"{where}: {msg}")


def _settings(d: dict[str, Any], where: str) -> dict[str, Any]:
    """The run settings of a spec or arm (world, config, set, args, recipe), type-checked."""
    out: dict[str, Any] = {}
    if "world" in d:
        _check(isinstance(d["world"], str), f"{where}.world", "must be a string")
        out["world"] = d["world"]
    if "config" in d:
        _check(isinstance(d["config"], str), f"{where}.config", "must be a file path")
        out["config"] = d["config"]
    if "recipe" in d:
        _check(isinstance(d["recipe"], str), f"{where}.recipe", "must be a file path")
        out["recipe"] = d["recipe"]
    if "set" in d:
        _check(isinstance(d["set"], dict), f"{where}.set",
               'must be an object of config fields, e.g. {"critic_loss": "mse"}')
        out["set"] = dict(d["set"])
    if "args" in d:
        args = d["args"]
        _check(isinstance(args, list) and all(isinstance(a, str) for a in args),
               f"{where}.args", "must be a list of strings")
        for a in args:
            flag = a.split("=")[0]
            _check(flag not in RUNNER_FLAGS, f"{where}.args",
                   f"{flag} is not allowed here ({RUNNER_FLAGS.get(flag)})")
        out["args"] = tuple(args)
    return out


def load_spec(grid: str | os.PathLike[str], _seen: tuple[str, ...] = ()) -> GridSpec:
    """Read and check a grid spec; :class:`SpecError` names the file and the field."""
    path = spec_path(grid)
    name = path.stem
    if not path.is_file():
        have = ", ".join(sorted(p.stem for p in GRIDS.glob("*.json"))) or "none"
        raise SpecError(f"no grid spec {path} (grids: {have})")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}: not valid JSON: {e}") from None
    _check(isinstance(d, dict), str(path), "must be a JSON object")
    d = {k: v for k, v in d.items() if not k.startswith("_")}
    unknown = sorted(set(d) - SPEC_KEYS)
    _check(not unknown, f"{path}: {unknown[0] if unknown else ''}",
           f"unknown field (fields: {', '.join(sorted(SPEC_KEYS))})")
    seeds = d.get("seeds")
    _check(isinstance(seeds, list) and seeds
           and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
           and len(set(seeds)) == len(seeds), f"{path}: seeds",
           "must be a non-empty list of distinct integers")
    stages = d.get("stages", list(STAGES))
    _check(isinstance(stages, list) and stages and all(isinstance(s, str) for s in stages),
           f"{path}: stages", "must be a non-empty list of stage names")
    placeholder = d.get("placeholder")
    _check(placeholder is None or isinstance(placeholder, str), f"{path}: placeholder",
           "must be a string saying what is missing")
    shared = _settings(d, f"{path}: (shared)")
    arms_in = d.get("arms")
    _check(isinstance(arms_in, list) and arms_in, f"{path}: arms", "must be a non-empty list")
    arms: list[Arm] = []
    for i, a in enumerate(arms_in):
        where = f"{path}: arms[{i}]"
        _check(isinstance(a, dict), where, "must be an object")
        a = {k: v for k, v in a.items() if not k.startswith("_")}
        unknown = sorted(set(a) - ARM_KEYS)
        _check(not unknown, f"{where}.{unknown[0] if unknown else ''}",
               f"unknown field (fields: {', '.join(sorted(ARM_KEYS))})")
        arm_name = a.get("name")
        _check(isinstance(arm_name, str) and re.fullmatch(r"[A-Za-z0-9_.=-]+", arm_name or ""),
               f"{where}.name", "must be a name of letters, digits, '_', '.', '=', '-'")
        where = f"{path}: arms[{i}] ({arm_name})"
        if "from_grid" in a:
            other = a["from_grid"]
            _check(isinstance(other, str), f"{where}.from_grid", "must be a grid name")
            _check(set(a) == {"name", "from_grid"}, f"{where}.from_grid",
                   "an arm taken from another grid has only name and from_grid")
            _check(other not in (*_seen, name), f"{where}.from_grid", "a cycle of grids")
            try:  # a grid beside this one
                src = load_spec(path.parent / f"{other}.json", (*_seen, name))
            except SpecError as e:
                raise SpecError(f"{where}.from_grid: {e}") from None
            match = [x for x in src.arms if x.name == arm_name]
            _check(bool(match), f"{where}.from_grid", f"grid {other} has no arm {arm_name}")
            arms.append(match[0])
            continue
        own = _settings(a, where)
        merged = {**shared, **own, "set": {**shared.get("set", {}), **own.get("set", {})},
                  "args": (*shared.get("args", ()), *own.get("args", ()))}
        arms.append(Arm(name=arm_name, grid=name, **merged))
    names = [a.name for a in arms]
    dup = sorted({n for n in names if names.count(n) > 1})
    _check(not dup, f"{path}: arms", f"arm name {dup[0] if dup else ''} appears twice")
    reference = d.get("reference")
    _check(reference is None or reference in names, f"{path}: reference",
           f"{reference!r} is not an arm ({', '.join(names)})")
    curve_x = d.get("curve_x", "online_trajectories")
    _check(curve_x in CURVE_X, f"{path}: curve_x", f"must be one of {', '.join(CURVE_X)}")
    desc = d.get("description", "")
    _check(isinstance(desc, str), f"{path}: description", "must be a string")
    return GridSpec(name=name, path=path, description=desc, seeds=tuple(seeds),
                    arms=tuple(arms), stages=tuple(stages), reference=reference,
                    placeholder=placeholder, curve_x=curve_x)


# -- jobs -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """One run: an arm at one seed, with where its run folder, log and result go."""

    arm: Arm
    seed: int
    runs_dir: Path
    results_dir: Path
    quick: bool = False

    @property
    def name(self) -> str:
        return f"{self.arm.name}-seed{self.seed}"

    @property
    def out(self) -> Path:
        return self.runs_dir / self.arm.grid / self.arm.name / f"seed{self.seed}"

    @property
    def log(self) -> Path:
        return self.out.with_suffix(".log")

    @property
    def result(self) -> Path:
        return self.results_dir / self.arm.grid / f"{self.name}.json"

    def recipe_args(self, resume: bool = False) -> list[str]:
        """The recipe's arguments (everything after the script)."""
        a = self.arm
        args = ["--out", _rel(self.out), "--seed", str(self.seed), "--quiet"]
        if a.world:
            args += ["--world", a.world]
        if a.config:
            args += ["--config", a.config]
        if self.quick:
            args.append("--quick")
        args += list(a.args)
        if a.set:
            args += ["--set", *(f"{k}={json.dumps(v)}" for k, v in a.set.items())]
        if resume:
            args.append("--resume")
        return args

    def command(self, resume: bool = False, python: str = sys.executable) -> list[str]:
        return [python, self.arm.recipe, *self.recipe_args(resume)]

    def state(self) -> str:
        """"done" (a result file), "finished" (the run wrote summary.json, no result file
        yet), "resume" (a checkpoint) or "fresh"."""
        if self.result.is_file():
            return "done"
        if (self.out / "summary.json").is_file():
            return "finished"
        if (self.out / "checkpoints" / "latest").is_file():
            return "resume"
        return "fresh"

    def expected_config(self) -> dict[str, Any] | None:
        """The config this job's recipe will build (DigiRLConfig.as_dict()), for recipes in
        recipes/ that use the shared command line; None for another recipe. Raises
        :class:`SpecError` naming the arm when the config cannot be built (an unknown field,
        a bad value)."""
        if not (ROOT / self.arm.recipe).resolve().is_relative_to(ROOT / "recipes"):
            return None
        if Path(self.arm.recipe).name in OWN_CONFIG_RECIPES:
            return None
        from digirl_lite.train.cli import config_from_args, run_parser

        ns, _ = run_parser("grid").parse_known_args(self.recipe_args())
        try:
            return config_from_args(ns).as_dict()
        except SystemExit as e:
            raise SpecError(f"arm {self.arm.name} (grid {self.arm.grid}): {e}") from None


def _rel(p: Path) -> str:
    p = Path(os.path.abspath(p))
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def jobs_of(spec: GridSpec, *, arms: list[str] | None = None, seeds: list[int] | None = None,
            runs_dir: Path = RUNS, results_dir: Path = RESULTS,
            quick: bool = False) -> list[Job]:
    names = [a.name for a in spec.arms]
    for a in arms or []:
        if a not in names:
            raise SpecError(f"grid {spec.name} has no arm {a!r} (arms: {', '.join(names)})")
    return [Job(a, s, runs_dir, results_dir, quick) for a in spec.arms
            if not arms or a.name in arms for s in (seeds or spec.seeds)]


def _git(*args: str) -> str:
    p = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return p.stdout if p.returncode == 0 else ""


def git_state() -> dict[str, Any]:
    """The commit the code is at, and the tracked files that differ from it."""
    dirty = [line[3:] for line in _git("status", "--porcelain", "--untracked-files=no")
             .splitlines() if line.strip()]
    return {"commit": _git("rev-parse", "HEAD").strip() or None, "modified": dirty}


def _diff_config(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Fields both configs have that differ in what the run does (a field one lacks: added
    since, left out): a field the algorithm does not read is left out, and one whose None
    means the algorithm's own value (``actor_lr``, ``policy_loss_norm``) is compared as
    that value, so a default that moved shows and a spelling of the same run does not."""
    from digirl_lite.train.config import effective_fields

    a, b = effective_fields(a), effective_fields(b)
    return sorted(k for k in set(a) & set(b) if a[k] != b[k])


# -- a job's result ---------------------------------------------------------------------------
def _curve(out: Path, stages: dict[str, Any]) -> list[dict[str, Any]]:
    """Every evaluation of the run, in order: the last record of each stage in metrics.jsonl
    (a stage redone after a resume is logged twice), with the summary's numbers."""
    last: dict[str, dict[str, Any]] = {}
    path = out / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:  # a line torn by a kill
            continue
        st = str(r.get("stage", ""))
        if st.startswith("eval:"):
            last.pop(st[5:], None)
            last[st[5:]] = r
    pts = []
    for st, r in last.items():
        rep = stages.get(st, r)
        pts.append({"stage": st, "online_trajectories": int(r.get("online_trajectories", 0)),
                    "success_rate": rep["success_rate"], "ci95": list(rep["ci95"]),
                    **({"day": r["day"]} if "day" in r else {})})
    return pts


def _time_split(out: Path) -> dict[str, float]:
    """Mean seconds per online iteration, by part (the Trainer's ``time_split``)."""
    path = out / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if r.get("stage") == "online" and "time_split" in r:
            rows.append({**r["time_split"], "total": r.get("seconds", 0.0)})
    if not rows:
        return {}
    return {k: round(sum(x.get(k, 0.0) for x in rows) / len(rows), 3) for k in rows[0]}


def _pile_cached(out: Path) -> bool | None:
    """Did the run read its pile from the cache (so its wall time has no pile in it)?"""
    path = out / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        if '"pile"' in line:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if r.get("stage") == "pile":
                return "cached" in r
    return None


def result_record(job: Job, *, job_wall_s: float | None = None, threads: int | None = None,
                  git: dict[str, Any] | None = None, resumed: bool | None = None
                  ) -> dict[str, Any]:
    """The small result file of a finished run, from its summary.json and metrics.jsonl.
    ``command`` runs it from scratch (``resumed``: whether the last attempt was a
    ``--resume``, None when not known); ``wall_s`` is the Trainer's, summed over attempts;
    ``job_wall_s`` the last attempt's, process start to end."""
    summary = json.loads((job.out / "summary.json").read_text())
    stages = {}
    for st, rep in summary.get("stages", {}).items():
        row = {"success_rate": rep["success_rate"],
               "n": rep.get("judged_episodes", rep.get("episodes")),
               "successes": rep.get("successes"), "ci95": list(rep["ci95"]),
               "mean_length": rep.get("mean_length"),
               "mean_length_success": rep.get("mean_length_success"),
               "failure_kinds": rep.get("failure_kinds", {})}
        row.update({k: rep[k] for k in OPTIONAL_STAGE_KEYS if k in rep})
        stages[st] = row
    return {
        "grid": job.arm.grid, "arm": job.arm.name, "seed": job.seed,
        "stages": stages,
        "curve": _curve(job.out, summary.get("stages", {})),
        "wall_s": summary.get("wall_s"),
        "job_wall_s": None if job_wall_s is None else round(job_wall_s, 1),
        "resumed": resumed,
        "pile_cached": _pile_cached(job.out),
        "omp_threads": threads,
        "online_iteration_s": _time_split(job.out),
        "timings_s": summary.get("timings_s", {}),
        "command": shlex.join(["python", _rel(ROOT / job.arm.recipe), *job.recipe_args()]),
        "config": summary.get("config", {}),
        "git": git or git_state(),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def write_result(job: Job, record: dict[str, Any]) -> Path:
    job.result.parent.mkdir(parents=True, exist_ok=True)
    tmp = job.result.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=float) + "\n")
    tmp.replace(job.result)
    return job.result


def commit_files(paths: list[Path], message: str, tries: int = 5) -> bool:
    """``git add`` and commit exactly ``paths`` (``git commit -- paths``: whatever else is
    staged stays staged and out of the commit). Retries while another process holds the
    index lock; False (and a warning) if it never succeeds."""
    rel = [_rel(p) for p in paths]
    for k in range(tries):
        add = subprocess.run(["git", "add", "--", *rel], cwd=ROOT, capture_output=True,
                             text=True)
        if add.returncode == 0:
            if not _git("status", "--porcelain", "--", *rel):
                return True  # committed already, unchanged
            c = subprocess.run(["git", "commit", "-q", "-m", message, "--", *rel], cwd=ROOT,
                               capture_output=True, text=True)
            if c.returncode == 0:
                return True
            err = c.stderr
        else:
            err = add.stderr
        time.sleep(1 + 2 * k)
    print(f"warning: could not commit {', '.join(rel)}: {err.strip()}", file=sys.stderr)
    return False


def _stage_line(record: dict[str, Any], stages: tuple[str, ...]) -> str:
    return ", ".join(f"{st} {100 * record['stages'][st]['success_rate']:.1f}%"
                     for st in stages if st in record["stages"])


# -- running ----------------------------------------------------------------------------------
def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        return os.cpu_count() or 1


def _take_lock(job: Job) -> int | None:
    """Claim the job for this process (``runs/grid/<grid>/<arm>/seed<S>.lock``, holding its
    pid): None when taken, else the pid of the live process that holds it (a grid run twice
    at once, or two grids sharing an arm, never run one job twice)."""
    path = job.out.with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(path.read_text() or 0)
                os.kill(pid, 0)
                if pid != os.getpid():
                    return pid
            except (ValueError, ProcessLookupError):
                pass  # a lock left by a runner that died
            except PermissionError:  # alive, someone else's
                return pid
            path.unlink(missing_ok=True)
            continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return None
    return -1


def _drop_lock(job: Job) -> None:
    job.out.with_suffix(".lock").unlink(missing_ok=True)


def run_jobs(jobs: list[Job], n_jobs: int, *, commit: bool = False,
             stages: tuple[str, ...] = STAGES, python: str = sys.executable,
             check_configs: bool = True, poll_s: float = 1.0) -> dict[str, list[Job]]:
    """Run what is missing, ``n_jobs`` processes at a time. Returns the jobs by outcome:
    "skipped" (a result file already), "busy" (another live runner has it), "ran",
    "failed". Every job's config is built first (:meth:`Job.expected_config`), so a bad
    field stops the grid before anything runs."""
    threads = max(1, cpu_count() // max(1, n_jobs))
    outcome: dict[str, list[Job]] = {"skipped": [], "busy": [], "ran": [], "failed": []}
    todo: list[Job] = []
    for job in jobs:
        expected = job.expected_config() if check_configs else None
        if job.state() != "done":
            todo.append(job)
            continue
        outcome["skipped"].append(job)
        if expected is not None:
            have = json.loads(job.result.read_text()).get("config", {})
            if diff := _diff_config(have, expected):
                print(f"warning: {_rel(job.result)} was run with other values of "
                      f"{', '.join(diff)} than the spec gives now; delete it to rerun",
                      file=sys.stderr)
    if commit:  # results written earlier but not committed (a commit that failed)
        left = [j.result for j in outcome["skipped"]
                if _git("status", "--porcelain", "--", _rel(j.result))]
        if left:
            commit_files(left, f"grid: {len(left)} earlier result file(s)")
    total = len(todo)
    running: list[tuple[Job, subprocess.Popen, float, Any, dict[str, Any], bool]] = []
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONUNBUFFERED": "1"}
    started = 0
    try:
        while todo or running:
            while todo and len(running) < n_jobs:
                job = todo.pop(0)
                if (pid := _take_lock(job)) is not None:
                    outcome["busy"].append(job)
                    print(f"busy {job.arm.grid}/{job.name}: process {pid} runs it", flush=True)
                    continue
                st = job.state()
                if st in ("done", "finished"):  # done meanwhile / the runner died after it
                    if st == "finished":
                        _finish(job, None, threads, git_state(), None, commit, stages,
                                outcome)
                    _drop_lock(job)
                    continue
                if st == "fresh" and job.out.exists():
                    shutil.rmtree(job.out)  # no checkpoint: nothing in it to keep
                cmd = job.command(resume=st == "resume", python=python)
                job.out.parent.mkdir(parents=True, exist_ok=True)
                log = open(job.log, "a")
                log.write(f"\n== {datetime.now().isoformat(timespec='seconds')} "
                          f"OMP_NUM_THREADS={threads} {shlex.join(cmd)}\n")
                log.flush()
                git = git_state()  # the code this attempt runs
                p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                                     stderr=subprocess.STDOUT)
                started += 1
                print(f"[{started}/{total}] {'resume' if st == 'resume' else 'start'} "
                      f"{job.arm.grid}/{job.name} ({threads} thread(s)); log {_rel(job.log)}",
                      flush=True)
                running.append((job, p, time.perf_counter(), log, git, st == "resume"))
            time.sleep(poll_s)
            for item in list(running):
                job, p, t0, log, git, resumed = item
                if p.poll() is None:
                    continue
                running.remove(item)
                log.close()
                if p.returncode == 0 and (job.out / "summary.json").is_file():
                    _finish(job, time.perf_counter() - t0, threads, git, resumed, commit,
                            stages, outcome)
                else:
                    outcome["failed"].append(job)
                    print(f"FAILED {job.arm.grid}/{job.name} (exit {p.returncode}); see "
                          f"{_rel(job.log)}", flush=True)
                _drop_lock(job)
    except KeyboardInterrupt:
        for _, p, *_ in running:  # each has checkpoints: the next call resumes it
            p.terminate()
        for job, p, *_ in running:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
            _drop_lock(job)
        raise
    return outcome


def _finish(job: Job, wall: float | None, threads: int, git: dict[str, Any],
            resumed: bool | None, commit: bool, stages: tuple[str, ...],
            outcome: dict[str, list[Job]]) -> None:
    rec = result_record(job, job_wall_s=wall, threads=threads, git=git, resumed=resumed)
    path = write_result(job, rec)
    outcome["ran"].append(job)
    line = _stage_line(rec, stages)
    print(f"done {job.arm.grid}/{job.name}: {line}; {(rec['wall_s'] or 0) / 60:.1f} min; "
          f"{_rel(path)}", flush=True)
    if commit:
        commit_files([path], f"grid {job.arm.grid}: {job.arm.name} seed {job.seed} ({line})")


# -- the table --------------------------------------------------------------------------------
def load_results(results_dir: Path, spec: GridSpec) -> dict[str, list[dict[str, Any]]]:
    """The result files of each of the spec's arms (from its own grid's folder), by seed;
    an arm with none is left out."""
    out: dict[str, list[dict[str, Any]]] = {}
    for arm in spec.arms:
        recs = []
        for p in sorted((results_dir / arm.grid).glob(f"{arm.name}-seed*.json")):
            if re.fullmatch(re.escape(arm.name) + r"-seed-?\d+\.json", p.name):
                recs.append(json.loads(p.read_text()))
        if recs:
            out[arm.name] = sorted(recs, key=lambda r: r["seed"])
    return out


def _nanmean(xs: list[float | None]) -> float:
    v = [x for x in xs if x is not None and x == x]
    return sum(v) / len(v) if v else float("nan")


def stage_stats(records: list[dict[str, Any]], stage: str) -> dict[str, Any] | None:
    """One arm's stage over its seeds: the mean of the per-seed success rates with a 95%
    t-interval; the pooled rate over seeds x tasks with a Wilson 95% interval; the mean
    length of all successful episodes; the failure kinds summed; the mean invalid-step
    rate (seeds that report one)."""
    from digirl_lite.judge.calibration import wilson_interval
    from digirl_lite.viz.curves import mean_ci95

    rows = [(r["seed"], r["stages"][stage]) for r in records if stage in r["stages"]]
    if not rows:
        return None
    m, lo, hi = mean_ci95([x["success_rate"] for _, x in rows])
    wins = sum(int(x["successes"]) for _, x in rows)
    n = sum(int(x["n"]) for _, x in rows)
    plo, phi = wilson_interval(wins, n)
    length = sum((x["mean_length_success"] or 0.0) * x["successes"] for _, x in rows)
    kinds: dict[str, int] = {}
    for _, x in rows:
        for k, v in x.get("failure_kinds", {}).items():
            kinds[k] = kinds.get(k, 0) + int(v)
    inv = [x["invalid_step_rate"] for _, x in rows if "invalid_step_rate" in x]
    days = {x.get("day") for _, x in rows}
    return {"seeds": [s for s, _ in rows], "n_seeds": len(rows),
            "per_seed": [x["success_rate"] for _, x in rows],
            "mean": m, "ci95_seeds": [max(0.0, lo), min(1.0, hi)] if lo == lo else [lo, hi],
            "pooled": wins / n if n else float("nan"), "successes": wins, "n": n,
            "ci95_pooled": [plo, phi],
            "mean_length_success": length / wins if wins else float("nan"),
            "failure_kinds": kinds,
            "invalid_step_rate": _nanmean(inv) if inv else None,
            "day": days.pop() if len(days) == 1 else None}  # the drift day, where all agree


def paired_difference(a: list[dict[str, Any]], b: list[dict[str, Any]], stage: str
                      ) -> dict[str, Any] | None:
    """Arm ``a`` minus arm ``b`` at ``stage``, seed by seed (seeds both have): the mean
    difference of success rates with a 95% t-interval."""
    from digirl_lite.viz.curves import mean_ci95

    ra = {r["seed"]: r["stages"][stage]["success_rate"] for r in a if stage in r["stages"]}
    rb = {r["seed"]: r["stages"][stage]["success_rate"] for r in b if stage in r["stages"]}
    seeds = sorted(set(ra) & set(rb))
    if not seeds:
        return None
    m, lo, hi = mean_ci95([ra[s] - rb[s] for s in seeds])
    return {"seeds": seeds, "mean": m, "ci95": [lo, hi]}


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
            "git_commits": sorted({(r.get("git") or {}).get("commit") or "?" for r in recs}),
        }
    ref = spec.reference or (spec.arms[0].name if spec.arms else None)
    diffs: dict[str, Any] = {}
    if ref in results:
        for name, recs in results.items():
            if name != ref:
                diffs[name] = {st: paired_difference(recs, results[ref], st)
                               for st in spec.stages}
    return {"grid": spec.name, "description": spec.description,
            "command": f"python benchmarks/grid.py {spec.name}",
            "stages": list(spec.stages), "reference": ref, "arms": arms,
            "differences_from_reference": diffs}


def _pct(x: float | None) -> str:
    return "-" if x is None or x != x else f"{100 * x:.1f}"


def _ci(lo: float, hi: float) -> str:
    return "" if lo != lo else f" [{100 * lo:.1f}, {100 * hi:.1f}]"


def table_markdown(t: dict[str, Any]) -> str:
    out = [f"# Grid `{t['grid']}`", ""]
    if t["description"]:
        out += [t["description"], ""]
    out += [f"Reproduce: `{t['command']}` (resumes; `--table` rebuilds this table from the "
            "result files alone).", "",
            "Held-out success per stage, in %. *Over seeds*: mean of the per-seed rates with "
            "a 95% t-interval (n - 1 degrees of freedom, clipped to [0, 100]); *pooled*: all "
            "seeds' episodes together (successes / judged episodes) with a Wilson 95% "
            "interval. *Length*: mean steps of the successful episodes. *Invalid*: share "
            "of evaluation steps whose action did not parse (where reported). *Wall*: "
            "minutes per run (mean over seeds; a run that built its pile rather than read "
            "it from the cache takes longer: `piles_built` in table.json).", "",
            "| arm | stage | seeds | over seeds | pooled | length | invalid | failure kinds "
            "| wall |", "|---|---|---|---|---|---|---|---|---|"]
    for name, a in t["arms"].items():
        for st in t["stages"]:
            s = a["stages"].get(st)
            if s is None:
                continue
            kinds = ", ".join(f"{k} {v}" for k, v in s["failure_kinds"].items() if v) or "-"
            length = "-" if s["mean_length_success"] != s["mean_length_success"] else \
                f"{s['mean_length_success']:.1f}"
            day = f" (day {s['day']})" if s.get("day") not in (None, 1) else ""
            out.append(f"| {name} | {st}{day} | {s['n_seeds']} | {_pct(s['mean'])}"
                       f"{_ci(*s['ci95_seeds'])} | {_pct(s['pooled'])}{_ci(*s['ci95_pooled'])}"
                       f" ({s['successes']}/{s['n']}) | {length} | "
                       f"{_pct(s['invalid_step_rate'])} | {kinds} | "
                       f"{a['wall_s_mean'] / 60:.1f} |")
    if t["differences_from_reference"]:
        out += ["", f"Difference from `{t['reference']}`, seed by seed (points of success; "
                "mean with a 95% t-interval over the seeds both arms have):", "",
                "| arm | " + " | ".join(t["stages"]) + " |",
                "|---|" + "---|" * len(t["stages"])]
        for name, d in t["differences_from_reference"].items():
            cells = []
            for st in t["stages"]:
                x = d.get(st)
                cells.append("-" if x is None else
                             f"{100 * x['mean']:+.1f}{_ci(*x['ci95'])} ({len(x['seeds'])})")
            out.append(f"| {name} | " + " | ".join(cells) + " |")
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
    commits = sorted({c for a in t["arms"].values() for c in a["git_commits"]})
    out += ["", f"Code: commit(s) {', '.join(c[:10] for c in commits)}; the exact command "
            "and config of each run are in its result file.", ""]
    return "\n".join(out)


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
    return paths


# -- the command line -------------------------------------------------------------------------
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
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
    ap.add_argument("--runs-dir", type=Path, default=None)
    ap.add_argument("--results-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    runs_dir = (args.runs_dir or (ROOT / "runs" / "grid_quick" if args.quick else RUNS)).resolve()
    results_dir = (args.results_dir or (runs_dir / "results" if args.quick else RESULTS)).resolve()
    if args.list:
        list_grids(runs_dir, results_dir)
        return 0
    if not args.grid:
        ap.error("name a grid (or --list)")
    if args.quick and args.commit:
        ap.error("--quick results are a wiring check: not committed")
    try:
        spec = load_spec(args.grid)
        jobs = jobs_of(spec, arms=args.arms, seeds=args.seeds, runs_dir=runs_dir,
                       results_dir=results_dir, quick=args.quick)
        if not args.table:
            if spec.placeholder:
                raise SpecError(f"grid {spec.name} is a placeholder: {spec.placeholder}")
            if args.dry_run:
                for j in jobs:
                    j.expected_config()
                    st = j.state()
                    print(f"{j.arm.grid}/{j.name}: {st}" + ("" if st == "done" else
                          "\n    " + shlex.join(j.command(resume=st == "resume",
                                                          python="python"))))
                return 0
            outcome = run_jobs(jobs, max(1, args.jobs), commit=args.commit,
                               stages=spec.stages)
            print(f"grid {spec.name}: {len(outcome['ran'])} run, {len(outcome['skipped'])} "
                  f"already done, {len(outcome['busy'])} run by another process, "
                  f"{len(outcome['failed'])} failed")
    except SpecError as e:
        print(f"grid: {e}", file=sys.stderr)
        return 2
    paths = write_table(spec, results_dir)
    if args.commit:
        commit_files(paths, f"grid {spec.name}: table")
    return 1 if not args.table and outcome["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
