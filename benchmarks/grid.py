"""A grid of runs, arms x seeds: each (arm, seed) one `recipes/offline_to_online.py` process,
several at a time, resumable, with one small result file per finished run and one table over
seeds (issue 16, item 3).

    python benchmarks/grid.py table1_webshop              # run what is missing, then the table
    python benchmarks/grid.py table1_webshop --jobs 2 --commit   # commit each result as it lands
    python benchmarks/grid.py table1_webshop --table      # the table from the result files only
    python benchmarks/grid.py ablations_webshop --arms awr critic_mse --seeds 0 --dry-run
    python benchmarks/grid.py table1_webshop --quick --arms digirl --seeds 0   # wiring check
    python benchmarks/grid.py table1_webshop --rerun-stale HEAD   # rerun what is on other code
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
first); ``pairs``: more differences, each ``[arm, its reference]`` (e.g. a noisy-judge arm
against its oracle-judged twin), and with two or more pairs the differences between them
(does one arm lose less than another?); ``curve_x``: curves.png's x, "online_trajectories"
(default) or "day" (the simulated phone's drift day); ``placeholder``: the grid is not ready
to run. Keys starting with "_" are comments.

Where things go (``<grid>`` of the arm: its ``from_grid``, else this grid):

    runs/grid/<grid>/<arm>/seed<S>/                  the run folder (--out of the recipe)
    runs/grid/<grid>/<arm>/seed<S>.log               its output, appended over attempts
    runs/grid/<grid>/<arm>/seed<S>.attempts.jsonl    each process's start and end
    benchmarks/results/grid/<grid>/<arm>-seed<S>.json  the result, written when the run ends
    benchmarks/results/grid/<grid>/table.md, table.json, curves.png

A job with a result file is done and skipped; one whose run wrote its summary gets its result
file; one whose run folder has a checkpoint is rerun with ``--resume``; a run folder without one
holds nothing to keep and is started afresh. So an interrupted grid goes on where it stopped,
here or (with the results committed) elsewhere. A job another live runner holds (its
``seed<S>.lock``) is left to it. Each job runs with ``OMP_NUM_THREADS = cpus // jobs``. The
table and the curves read only result files. ``--quick`` (a wiring check) puts runs and results
under runs/grid_quick/.

Provenance (issue 32, item 3). A run is not started on uncommitted changes to what it computes
with (the package, this runner, the grid spec(s), the recipe, a config file): the grid names
the files and stops, unless ``--allow-dirty``, which marks the run ``dirty`` with the sha256 of
the diff. Each process that works on a run (an attempt: the first, each resume) records when
it started and ended, its commit, the :func:`code_id` of the package and recipe there, dirty
or not, its threads and host; the result file carries them (``attempts``), its ``wall_s`` is
their sum, and a run picked up after it finished keeps the commits of the attempts that made
it. The table warns where a difference from the reference pairs runs on different code (the
code, not the commit: ``--commit`` adds a commit per result), and ``--rerun-stale COMMIT``
clears every run not on COMMIT's code, clean, before running what is missing.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
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
             "pairs", "world", "config", "set", "args", "recipe"}
ARM_KEYS = {"name", "from_grid", "world", "config", "set", "args", "recipe"}
RUNNER_FLAGS = {"--out": "the runner sets it", "--seed": "use the spec's seeds",
                "--resume": "the runner adds it", "--quiet": "the runner adds it",
                "--world": "use the world field", "--set": "use the set field",
                "--config": "use the config field", "--quick": "pass --quick to the runner",
                "--filtered-bc": 'make Filtered BC its own arm: "set": {"algorithm": '
                                 '"filtered_bc"}'}
OPTIONAL_STAGE_KEYS = ("invalid_step_rate", "unjudged", "unjudged_step_rate", "day",
                       "success_rate_unjudged_as_failures", "truth", "true_success_rate",
                       "true_successes", "true_episodes", "judge_agreement",
                       "failure_causes", "success_with_recovery", "recoveries")
"""Copied into a result file where the run's summary has them (the truth keys: issue 32)."""
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
    pairs: tuple[tuple[str, str], ...] = ()


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
    pairs = d.get("pairs", [])
    _check(isinstance(pairs, list) and all(
        isinstance(p, list) and len(p) == 2 and p[0] != p[1] and set(p) <= set(names)
        for p in pairs), f"{path}: pairs", f"must be a list of [arm, reference] pairs of "
           f"two different arms ({', '.join(names)})")
    desc = d.get("description", "")
    _check(isinstance(desc, str), f"{path}: description", "must be a string")
    return GridSpec(name=name, path=path, description=desc, seeds=tuple(seeds),
                    arms=tuple(arms), stages=tuple(stages), reference=reference,
                    placeholder=placeholder, curve_x=curve_x,
                    pairs=tuple((a, b) for a, b in pairs))


# -- jobs -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """One run: an arm at one seed, with where its run folder, log and result go. ``specs``:
    the grid spec files its settings come from (the grid run, and the arm's own when it is
    borrowed with ``from_grid``)."""

    arm: Arm
    seed: int
    runs_dir: Path
    results_dir: Path
    quick: bool = False
    specs: tuple[Path, ...] = ()

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
    def attempts(self) -> Path:
        """One line per process start and end (:func:`read_attempts`), beside the run
        folder rather than in it: a recipe may want its folder empty to start."""
        return self.out.with_suffix(".attempts.jsonl")

    def code_files(self) -> list[str]:
        """The code whose version names the run's (:func:`code_id`), relative to the
        repository: the package and the recipes (every arm's, so that two arms on one
        commit compare equal)."""
        return _code_files(self.arm.recipe)

    def watched_files(self) -> list[str]:
        """What must be committed before the run starts: the package, the recipe, the
        config file, this runner and the grid spec(s)."""
        config = [_rel(ROOT / self.arm.config)] if self.arm.config else []
        return ["digirl_lite", _rel(ROOT / self.arm.recipe), *config, "benchmarks/grid.py",
                *(_rel(p) for p in self.specs)]

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
    return [Job(a, s, runs_dir, results_dir, quick, _spec_files(spec, a)) for a in spec.arms
            if not arms or a.name in arms for s in (seeds or spec.seeds)]


def _code_files(recipe: str) -> list[str]:
    recipe = _rel(ROOT / recipe)
    return ["digirl_lite", "recipes", *([] if recipe.startswith("recipes/") else [recipe])]


def _spec_files(spec: GridSpec, arm: Arm) -> tuple[Path, ...]:
    own = spec.path.parent / f"{arm.grid}.json"
    return (spec.path,) if arm.grid == spec.name else (spec.path, own)


def _git(*args: str) -> str:
    p = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return p.stdout if p.returncode == 0 else ""


# -- provenance (issue 32, item 3) ------------------------------------------------------------
class DirtyTreeError(SpecError):
    """Uncommitted changes to what a run would compute with; the message names the files."""


def _git_or_none(*args: str) -> str | None:
    """git's output, or None where it fails (not a checkout, an unknown commit or path)."""
    p = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return p.stdout if p.returncode == 0 else None


def code_id(commit: str | None, files: list[str]) -> str | None:
    """A short hash of the git objects ``files`` are at ``commit`` (``git ls-tree``: the
    package's tree, the recipes'): the same for two commits whose code is the same, as
    across the commits of result files that ``--commit`` makes while a grid runs. None
    where the commit is not known here."""
    if not commit:
        return None
    return _code_id(str(ROOT), commit, tuple(files))


@functools.cache  # a commit's content never changes
def _code_id(root: str, commit: str, files: tuple[str, ...]) -> str | None:
    tree = _git_or_none("ls-tree", f"{commit}^{{commit}}", "--", *files)
    return None if tree is None else hashlib.sha256(tree.encode()).hexdigest()[:12]


def tree_state(watched: list[str], code: list[str]) -> dict[str, Any]:
    """The commit HEAD is at, the :func:`code_id` of ``code`` there, and the uncommitted
    changes to ``watched`` (paths relative to the repository, or absolute outside it):
    ``changed`` as ``git status --porcelain`` lists them ("M path", "?? path"; "outside
    path" for a file outside the repository), ``diff_sha256`` the sha256 of ``git diff HEAD
    --binary -- <watched>`` followed by each untracked or outside file's path and bytes (the
    command is in ``diff``); both None for a clean tree."""
    commit = (_git_or_none("rev-parse", "--verify", "-q", "HEAD^{commit}") or "").strip()
    if not commit:
        return {"commit": None, "code_id": None, "dirty": True, "diff_sha256": None,
                "changed": [f"{ROOT} is not a git checkout with a commit"]}
    inside = [w for w in watched if not Path(w).is_absolute()]
    outside = [w for w in watched if Path(w).is_absolute() and Path(w).exists()]
    status = _git_or_none("status", "--porcelain", "--untracked-files=all", "--", *inside)
    if status is None:
        return {"commit": commit, "code_id": None, "dirty": True, "diff_sha256": None,
                "changed": ["git status failed"]}
    changed = [line for line in status.splitlines() if line.strip()]
    changed += [f"outside {w}" for w in outside]
    state = {"commit": commit, "code_id": code_id(commit, code), "dirty": bool(changed),
             "diff_sha256": None}
    if changed:
        diff = ["git", "diff", "HEAD", "--binary", "--", *inside]
        h = hashlib.sha256(subprocess.run(diff, cwd=ROOT, capture_output=True).stdout)
        extra = [line[3:] for line in changed if line.startswith("?? ")] + outside
        for f in extra:
            h.update(f"\n{f}\n".encode())
            h.update((ROOT / f).read_bytes())
        state.update(diff_sha256=h.hexdigest(), changed=changed, diff=shlex.join(diff[1:]))
    return state


def job_tree_state(job: Job) -> dict[str, Any]:
    return tree_state(job.watched_files(), job.code_files())


def require_clean(jobs: list[Job], what: str) -> None:
    """Raise :class:`DirtyTreeError` naming the uncommitted files ``jobs`` would run with."""
    watched = list(dict.fromkeys(w for j in jobs for w in j.watched_files()))
    state = tree_state(watched, [])
    if state["dirty"]:
        files = "\n".join(f"  {line}" for line in state["changed"])
        raise DirtyTreeError(
            f"refusing to start {what}: uncommitted changes to what its runs compute with:\n"
            f"{files}\ncommit them (a result names the commit it ran on), or pass "
            "--allow-dirty (each run is then marked dirty, with the sha256 of the diff)")


def _utc(t: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if t is None else t, timezone.utc
                                  ).isoformat(timespec="seconds")


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()  # a naive time (the log's) is local


def _write_attempt(job: Job, **record: Any) -> None:
    job.attempts.parent.mkdir(parents=True, exist_ok=True)
    with open(job.attempts, "a") as f:
        f.write(json.dumps(record) + "\n")


def start_attempt(job: Job, state: dict[str, Any], threads: int, resume: bool) -> None:
    """Record a process starting on the job: when, where, on what code, with how many
    threads (``OMP_NUM_THREADS`` = ``MKL_NUM_THREADS``; torch takes its intra-op threads
    from it, and the recipes do not set them)."""
    if not resume:  # a fresh start: earlier attempts left nothing the run keeps
        job.attempts.unlink(missing_ok=True)
    _write_attempt(job, event="start", started=_utc(), host=socket.gethostname(),
                   resume=resume, threads=threads, **state)


def end_attempt(job: Job, wall_s: float, exit_code: int | None) -> None:
    _write_attempt(job, event="end", finished=_utc(), wall_s=round(wall_s, 1),
                   exit=exit_code)


def _metric_times(job: Job) -> list[float]:
    path = job.out / "metrics.jsonl"
    times = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            t = json.loads(line).get("time")
        except json.JSONDecodeError:  # a line torn by a kill
            continue
        if isinstance(t, (int, float)):
            times.append(float(t))
    return times


def _log_attempts(job: Job) -> list[dict[str, Any]]:
    """A run from before attempt records: its attempts from the log's headers (``==
    <local time> OMP_NUM_THREADS=<n> <command>``), from its last fresh start on, commit
    unknown."""
    out: list[dict[str, Any]] = []
    text = job.log.read_text(errors="replace") if job.log.is_file() else ""
    for m in re.finditer(r"^== (\S+) OMP_NUM_THREADS=(\d+) (.*)$", text, re.M):
        resume = "--resume" in m.group(3).split()
        if not resume:
            out = []
        out.append({"started": _utc(_epoch(m.group(1))), "resume": resume,
                    "threads": int(m.group(2)), "commit": None, "from": "log"})
    return out


def read_attempts(job: Job) -> list[dict[str, Any]]:
    """The processes that ran the job since its run folder was last started afresh, oldest
    first: what the runner wrote when each started (commit, code_id, dirty, diff_sha256,
    threads, resume, host) and ended (finished, wall_s, exit). An attempt whose end was
    never written (its runner was killed) ends at the last line it wrote to metrics.jsonl
    (``"wall_s_from": "metrics.jsonl"``). A run from before these records: the log's
    (:func:`_log_attempts`)."""
    attempts: list[dict[str, Any]] = []
    path = job.attempts
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        event = r.pop("event", None)
        if event == "start":
            attempts.append(r)
        elif event == "end" and attempts and "finished" not in attempts[-1]:
            attempts[-1].update(r)
    logged = _log_attempts(job)  # one header per attempt: the first ones predate records
    if not attempts or attempts[0].get("resume"):
        attempts = logged[:max(0, len(logged) - len(attempts))] + attempts
    if any("finished" not in a for a in attempts):
        times = _metric_times(job)
        starts = [_epoch(a["started"]) for a in attempts] + [float("inf")]
        for a, t0, t1 in zip(attempts, starts, starts[1:]):
            mine = [t for t in times if t0 <= t < t1]
            if "finished" not in a and mine:
                a.update(finished=_utc(max(mine)), wall_s=round(max(mine) - t0, 1),
                         wall_s_from="metrics.jsonl")
    return attempts


def provenance(attempts: list[dict[str, Any]], trainer_wall_s: float | None
               ) -> dict[str, Any]:
    """A result's provenance fields from its attempts: ``wall_s`` the processes' wall time
    summed over attempts (the Trainer's own ``wall_s`` counts only the last attempt of a
    resumed run: ``trainer_wall_s``), the last attempt's commit, threads and wall time,
    every commit, and whether any attempt ran on uncommitted changes."""
    last = attempts[-1] if attempts else {}
    walls = [a["wall_s"] for a in attempts if a.get("wall_s") is not None]
    if attempts and len(walls) == len(attempts):
        wall, wall_from = round(sum(walls), 1), "attempts"
    elif walls:
        wall, wall_from = round(sum(walls), 1), (f"attempts ({len(walls)} of "
                                                 f"{len(attempts)} known: a lower bound)")
    else:
        wall, wall_from = trainer_wall_s, "summary.json (the last attempt only)"
    dirty = [a for a in attempts if a.get("dirty")]
    return {"wall_s": wall, "wall_s_from": wall_from, "trainer_wall_s": trainer_wall_s,
            "job_wall_s": last.get("wall_s"), "resumed": last.get("resume"),
            "omp_threads": last.get("threads"),
            "dirty": bool(dirty), "diff_sha256": dirty[-1].get("diff_sha256") if dirty else None,
            "git": {"commit": last.get("commit"),
                    "commits": list(dict.fromkeys(a.get("commit") for a in attempts))},
            "attempts": attempts}


def run_versions(rec: dict[str, Any]) -> list[tuple[str, tuple[str, str | None]]]:
    """The code a result's run ran on, one entry per distinct version over its attempts:
    (a label, a key). Keys are equal when the code was (the :func:`code_id`, and the diff's
    hash where dirty); a commit not known, or uncommitted edits whose diff was not hashed
    (results from before attempt records: ``git.modified``), make a key equal to no other."""
    unique = f"{rec.get('grid')}/{rec.get('arm')}-seed{rec.get('seed')}"
    attempts = rec.get("attempts")
    if not attempts:  # a result from before attempt records
        git = rec.get("git") or {}
        try:
            recipe = _rel(ROOT / shlex.split(rec.get("command", ""))[1])
        except IndexError:
            recipe = RECIPE
        edited = [f for f in git.get("modified", [])
                  if f == recipe or f.startswith("digirl_lite/")]
        attempts = [{"commit": git.get("commit"),
                     "code_id": code_id(git.get("commit"), _code_files(recipe)),
                     "dirty": bool(edited), "diff_sha256": None}]
    out: dict[tuple[str, str | None], str] = {}
    for a in attempts:
        commit = a.get("commit")
        label = commit[:10] if commit else "unknown commit"
        ident = a.get("code_id") or commit or f"unknown:{unique}"
        if a.get("dirty"):
            sha = a.get("diff_sha256")
            label += f"+dirty:{sha[:8]}" if sha else "+uncommitted edits"
            key = (ident, sha or f"unhashed:{unique}")
        else:
            key = (ident, None)
        out.setdefault(key, label)
    return [(label, key) for key, label in out.items()]


def version_label(rec: dict[str, Any]) -> str:
    return " + ".join(label for label, _ in run_versions(rec))


def is_stale(job: Job, commit: str) -> str | None:
    """Why the job's result (or, without one, its unfinished run) is not on ``commit``'s
    code, clean; None when it is (or when there is nothing yet)."""
    want = (code_id(commit, job.code_files()), None)
    if job.result.is_file():
        rec = json.loads(job.result.read_text())
        versions = run_versions(rec)
        if any(key != want for _, key in versions):
            return f"result on {version_label(rec)}"
        return None
    attempts = read_attempts(job) if job.out.exists() or job.attempts.exists() else []
    if job.out.exists() and not attempts:
        return "a run folder from an unknown commit"
    other = [a for a in attempts
             if a.get("dirty") or (a.get("code_id") or a.get("commit")) != want[0]]
    if other:
        return "unfinished run begun on " + ", ".join(
            dict.fromkeys((a.get("commit") or "an unknown commit")[:10] for a in other))
    return None


def _diff_config(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Fields both configs have that differ in what the run does (a field one lacks: added
    since, left out): a field the algorithm does not read is left out, and one whose None
    means the algorithm's own value (``actor_lr``, ``policy_loss_norm``) is compared as
    that value, so a default that moved shows and a spelling of the same run does not."""
    from digirl_lite.redaction import redact
    from digirl_lite.train.config import effective_fields

    # compared redacted (a result file's config has its credentials redacted, issue 32)
    a, b = effective_fields(redact(a)), effective_fields(redact(b))
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
        if st.startswith("eval:") and ":" not in st[5:]:  # a held-out split's: no point
            last.pop(st[5:], None)
            last[st[5:]] = r
    pts = []
    for st, r in last.items():
        rep = stages.get(st, r)
        pts.append({"stage": st, "online_trajectories": int(r.get("online_trajectories", 0)),
                    "success_rate": rep["success_rate"], "ci95": list(rep["ci95"]),
                    **({"day": r["day"]} if "day" in r else {})})
    return pts


def _recovery_curve(out: Path) -> list[dict[str, Any]]:
    """Issue 47's mechanism per online iteration (the last record of each, a resumed
    iteration being logged twice): the share of its (truly) successful episodes that took a
    way back (``success_with_recovery``), their count and the iteration's success rate."""
    rows: dict[int, dict[str, Any]] = {}
    path = out / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if r.get("stage") == "online" and "true_successes" in r:
            rows[int(r["iteration"])] = {
                "iteration": int(r["iteration"]),
                "online_trajectories": int(r.get("online_trajectories", 0)),
                "collect_success": r.get("collect_success"),
                "success_with_recovery": r.get("success_with_recovery"),
                "successes_with_recovery": r.get("successes_with_recovery"),
                "true_successes": r.get("true_successes")}
    return [rows[k] for k in sorted(rows)]


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


def _redacted(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without credentials (a summary.json written before the trainer redacted)."""
    from digirl_lite.redaction import redact

    return redact(config)


def _stage_row(rep: dict[str, Any]) -> dict[str, Any]:
    """A stage's row of a result file, from its report in summary.json; its held-out splits'
    rows under ``splits`` (issue 32 item 5)."""
    row = {"success_rate": rep["success_rate"],
           "n": rep.get("judged_episodes", rep.get("episodes")),
           "successes": rep.get("successes"), "ci95": list(rep["ci95"]),
           "mean_length": rep.get("mean_length"),
           "mean_length_success": rep.get("mean_length_success"),
           "failure_kinds": rep.get("failure_kinds", {})}
    row.update({k: rep[k] for k in OPTIONAL_STAGE_KEYS if k in rep})
    if rep.get("splits"):
        row["splits"] = {name: _stage_row(r) for name, r in rep["splits"].items()}
    return row


def result_record(job: Job, attempts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The small result file of a finished run, from its summary.json and metrics.jsonl,
    and its provenance from the processes that ran it (``attempts``, default
    :func:`read_attempts`; the fields :func:`provenance` gives). ``command`` runs it from
    scratch."""
    summary = json.loads((job.out / "summary.json").read_text())
    stages = {st: _stage_row(rep) for st, rep in summary.get("stages", {}).items()}
    return {
        "grid": job.arm.grid, "arm": job.arm.name, "seed": job.seed,
        "stages": stages,
        "curve": _curve(job.out, summary.get("stages", {})),
        "recovery_curve": _recovery_curve(job.out),
        **provenance(read_attempts(job) if attempts is None else attempts,
                     summary.get("wall_s")),
        "pile_cached": _pile_cached(job.out),
        "online_iteration_s": _time_split(job.out),
        "timings_s": summary.get("timings_s", {}),
        "command": shlex.join(["python", _rel(ROOT / job.arm.recipe), *job.recipe_args()]),
        "config": _redacted(summary.get("config", {})),
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
    """``online 62.5%``, or ``online 62.5% (true 60.4%)`` where the run has a truth."""
    def rate(r: dict[str, Any]) -> str:
        true = (f" (true {100 * r['true_success_rate']:.1f}%)"
                if r.get("truth") == "environment" else "")
        return f"{100 * r['success_rate']:.1f}%{true}"

    return ", ".join(f"{st} {rate(record['stages'][st])}"
                     for st in stages if st in record["stages"])


# -- running ----------------------------------------------------------------------------------
def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        return os.cpu_count() or 1


_LOCKS: dict[Path, Any] = {}  # the jobs this process holds: lock file -> FileLock


def _take_lock(job: Job) -> str | None:
    """Claim the job for this process (``runs/grid/<grid>/<arm>/seed<S>.lock``, a
    :class:`~digirl_lite.paths.FileLock`): None when taken, else who holds it (a grid run
    twice at once, or two grids sharing an arm, never run one job twice). The system drops
    a lock whose runner died, however it died."""
    from digirl_lite.paths import FileLock

    path = job.out.with_suffix(".lock")
    if path in _LOCKS:
        return None
    lock = FileLock(path)
    if (holder := lock.acquire()) is not None:
        return holder
    _LOCKS[path] = lock
    return None


def _lock_fds(job: Job) -> tuple[int, ...]:
    """The job lock's descriptor, for the job's process to inherit (none where unlocked)."""
    lock = _LOCKS.get(job.out.with_suffix(".lock"))
    return (lock.fileno(),) if lock is not None and lock.held else ()


def _drop_lock(job: Job) -> None:
    if (lock := _LOCKS.pop(job.out.with_suffix(".lock"), None)) is not None:
        lock.release()


def run_jobs(jobs: list[Job], n_jobs: int, *, commit: bool = False,
             stages: tuple[str, ...] = STAGES, python: str = sys.executable,
             check_configs: bool = True, poll_s: float = 1.0,
             allow_dirty: bool = False) -> dict[str, list[Job]]:
    """Run what is missing, ``n_jobs`` processes at a time. Returns the jobs by outcome:
    "skipped" (a result file already), "busy" (another live runner has it), "ran",
    "failed", "refused" (the code turned dirty while the grid ran). Every job's config is
    built first (:meth:`Job.expected_config`), so a bad field stops the grid before
    anything runs; so do uncommitted changes to what a run would compute with
    (:class:`DirtyTreeError`), unless ``allow_dirty``: then each attempt records the
    diff's hash. Each process's start and end are recorded (:func:`start_attempt`)."""
    threads = max(1, cpu_count() // max(1, n_jobs))
    outcome: dict[str, list[Job]] = {"skipped": [], "busy": [], "ran": [], "failed": [],
                                     "refused": []}
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
    starting = [j for j in todo if j.state() != "finished"]
    if starting and not allow_dirty:
        require_clean(starting, "the grid")
    if commit:  # results written earlier but not committed (a commit that failed)
        left = [j.result for j in outcome["skipped"]
                if _git("status", "--porcelain", "--", _rel(j.result))]
        if left:
            commit_files(left, f"grid: {len(left)} earlier result file(s)")
    total = len(todo)
    running: list[tuple[Job, subprocess.Popen, float, Any]] = []
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONUNBUFFERED": "1"}
    started = 0
    try:
        while todo or running:
            while todo and len(running) < n_jobs:
                job = todo.pop(0)
                if (holder := _take_lock(job)) is not None:
                    outcome["busy"].append(job)
                    print(f"busy {job.arm.grid}/{job.name}: {holder} runs it", flush=True)
                    continue
                st = job.state()
                if st in ("done", "finished"):  # done meanwhile / the runner died after it
                    if st == "finished":  # its attempts' records, not this runner's
                        _finish(job, commit, stages, outcome)
                    _drop_lock(job)
                    continue
                state = job_tree_state(job)  # the code this attempt runs
                if state["dirty"] and not allow_dirty:
                    outcome["refused"].append(job)
                    print(f"not started {job.arm.grid}/{job.name}: uncommitted changes to "
                          f"{', '.join(state['changed'])} (--allow-dirty runs it)", flush=True)
                    _drop_lock(job)
                    continue
                if st == "resume" and (before := [
                        a for a in read_attempts(job)
                        if (a.get("code_id") or a.get("commit")) != state["code_id"]]):
                    print(f"warning: {job.arm.grid}/{job.name}: resuming on "
                          f"{state['commit'][:10]} a run begun on other code ("
                          + ", ".join(dict.fromkeys((a.get("commit") or "unknown")[:10]
                                                    for a in before))
                          + "); --rerun-stale starts it afresh", flush=True)
                if st == "fresh" and job.out.exists():
                    shutil.rmtree(job.out)  # no checkpoint: nothing in it to keep
                cmd = job.command(resume=st == "resume", python=python)
                job.out.parent.mkdir(parents=True, exist_ok=True)
                log = open(job.log, "a")
                log.write(f"\n== {datetime.now().isoformat(timespec='seconds')} "
                          f"OMP_NUM_THREADS={threads} {shlex.join(cmd)}\n")
                log.flush()
                start_attempt(job, state, threads, resume=st == "resume")
                # the job's lock goes with it: should this runner die (kill -9), the job
                # stays held while it runs, and no other runner clears its folder
                p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                                     stderr=subprocess.STDOUT, pass_fds=_lock_fds(job))
                started += 1
                print(f"[{started}/{total}] {'resume' if st == 'resume' else 'start'} "
                      f"{job.arm.grid}/{job.name} ({threads} thread(s)); log {_rel(job.log)}",
                      flush=True)
                running.append((job, p, time.perf_counter(), log))
            time.sleep(poll_s)
            for item in list(running):
                job, p, t0, log = item
                if p.poll() is None:
                    continue
                running.remove(item)
                log.close()
                end_attempt(job, time.perf_counter() - t0, p.returncode)
                if p.returncode == 0 and (job.out / "summary.json").is_file():
                    _finish(job, commit, stages, outcome)
                else:
                    outcome["failed"].append(job)
                    print(f"FAILED {job.arm.grid}/{job.name} (exit {p.returncode}); see "
                          f"{_rel(job.log)}", flush=True)
                _drop_lock(job)
    except KeyboardInterrupt:
        for _, p, *_ in running:  # each has checkpoints: the next call resumes it
            p.terminate()
        for job, p, t0, _ in running:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            end_attempt(job, time.perf_counter() - t0, p.returncode)
            _drop_lock(job)
        raise
    return outcome


def _finish(job: Job, commit: bool, stages: tuple[str, ...],
            outcome: dict[str, list[Job]]) -> None:
    rec = result_record(job)
    path = write_result(job, rec)
    outcome["ran"].append(job)
    line = _stage_line(rec, stages)
    print(f"done {job.arm.grid}/{job.name}: {line}; {(rec['wall_s'] or 0) / 60:.1f} min; "
          f"{_rel(path)}", flush=True)
    if commit:
        commit_files([path], f"grid {job.arm.grid}: {job.arm.name} seed {job.seed} ({line})")


# -- the table --------------------------------------------------------------------------------
FINAL = "final"
"""A stage every run has: its last of "online" and "offline" (an offline-only run ends at
"offline"), so an offline-only arm pairs with an offline-then-online one at the end of each
(issue 47: the paper's comparison at equal attempts)."""


def with_final_stage(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with the :data:`FINAL` stage (a copy of its last stage), where it has one."""
    st = record.get("stages") or {}
    last = next((st[k] for k in ("online", "offline") if k in st), None)
    if last is not None and FINAL not in st:
        st[FINAL] = last
    return record


def load_results(results_dir: Path, spec: GridSpec) -> dict[str, list[dict[str, Any]]]:
    """The result files of each of the spec's arms (from its own grid's folder), by seed;
    an arm with none is left out. An arm borrowed with ``from_grid`` brings the spec's
    seeds only (its grid may have run more)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for arm in spec.arms:
        recs = []
        for p in sorted((results_dir / arm.grid).glob(f"{arm.name}-seed*.json")):
            if re.fullmatch(re.escape(arm.name) + r"-seed-?\d+\.json", p.name):
                rec = json.loads(p.read_text())
                with_final_stage(rec)
                if arm.grid == spec.name or rec["seed"] in spec.seeds:
                    recs.append(rec)
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
    # a seed without successes has no success length (NaN in summary.json): it adds none
    length = sum(x["mean_length_success"] * x["successes"] for _, x in rows
                 if x["successes"])
    kinds: dict[str, int] = {}
    for _, x in rows:
        for k, v in x.get("failure_kinds", {}).items():
            kinds[k] = kinds.get(k, 0) + int(v)
    inv = [x["invalid_step_rate"] for _, x in rows if "invalid_step_rate" in x]
    days = {x.get("day") for _, x in rows}
    true = _true_stats([x for _, x in rows])
    return {"seeds": [s for s, _ in rows], "n_seeds": len(rows),
            "per_seed": [x["success_rate"] for _, x in rows],
            "mean": m, "ci95_seeds": [max(0.0, lo), min(1.0, hi)] if lo == lo else [lo, hi],
            "pooled": wins / n if n else float("nan"), "successes": wins, "n": n,
            "ci95_pooled": [plo, phi],
            "mean_length_success": length / wins if wins else float("nan"),
            "failure_kinds": kinds,
            "invalid_step_rate": _nanmean(inv) if inv else None,
            "day": days.pop() if len(days) == 1 else None,  # the drift day, where all agree
            **({"true": true} if true else {})}


def _true_stats(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The environment's truth over the seeds that have one (issue 32): the mean of their
    true rates with a 95% t-interval, the pooled true rate with a Wilson interval, and the
    judge's pooled accuracy against it; None where no seed has a truth."""
    from digirl_lite.judge.calibration import wilson_interval
    from digirl_lite.viz.curves import mean_ci95

    rows = [x for x in rows if x.get("truth") == "environment" and x.get("true_episodes")]
    if not rows:
        return None
    m, lo, hi = mean_ci95([x["true_success_rate"] for x in rows])
    k = sum(int(x["true_successes"]) for x in rows)
    n = sum(int(x["true_episodes"]) for x in rows)
    agree = [x["judge_agreement"] for x in rows if x.get("judge_agreement")]
    right = sum(a["judged_success"]["true_success"] + a["judged_failure"]["true_failure"]
                for a in agree)
    judged = sum(a["episodes"] for a in agree)
    return {"n_seeds": len(rows), "mean": m,
            "ci95_seeds": [max(0.0, lo), min(1.0, hi)] if lo == lo else [lo, hi],
            "pooled": k / n, "successes": k, "n": n,
            "ci95_pooled": list(wilson_interval(k, n)),
            "judge_accuracy": right / judged if judged else float("nan")}


def split_stats(records: list[dict[str, Any]], stage: str) -> dict[str, Any] | None:
    """One arm's stage on its held-out splits (issue 32 item 5), over the seeds whose stage
    has them: the test list's and each split's mean rate with a 95% t-interval, and each
    split's gap to the test list (split - test, seed by seed, mean with a 95% t-interval).
    ``rate``: "true" (the environment's check) where every one of these rows has a truth,
    else "judged"; None where no seed has splits."""
    from digirl_lite.viz.curves import mean_ci95

    rows = [(r["seed"], r["stages"][stage]) for r in records
            if r["stages"].get(stage, {}).get("splits")]
    if not rows:
        return None
    true = all(x.get("truth") == "environment"
               for _, st in rows for x in (st, *st["splits"].values()))
    key = "true_success_rate" if true else "success_rate"

    def over_seeds(per_seed: dict[int, float]) -> dict[str, Any]:
        m, lo, hi = mean_ci95(list(per_seed.values()))
        return {"seeds": sorted(per_seed), "per_seed": list(per_seed.values()), "mean": m,
                "ci95_seeds": [max(0.0, lo), min(1.0, hi)] if lo == lo else [lo, hi]}

    test = {s: st[key] for s, st in rows}
    out = {"rate": "true" if true else "judged", "test": over_seeds(test), "splits": {}}
    for name in dict.fromkeys(n for _, st in rows for n in st["splits"]):
        per = {s: st["splits"][name][key] for s, st in rows if name in st["splits"]}
        gm, glo, ghi = mean_ci95([per[s] - test[s] for s in per])
        out["splits"][name] = {**over_seeds(per), "gap": {"mean": gm, "ci95": [glo, ghi]}}
    return out


def paired_difference(a: list[dict[str, Any]], b: list[dict[str, Any]], stage: str
                      ) -> dict[str, Any] | None:
    """Arm ``a`` minus arm ``b`` at ``stage``, seed by seed (seeds both have): the mean
    difference of success rates with a 95% t-interval."""
    return seed_contrast([(1, a), (-1, b)], stage)


def seed_contrast(terms: list[tuple[int, list[dict[str, Any]]]], stage: str
                  ) -> dict[str, Any] | None:
    """The sum of ``sign * success rate`` over the ``(sign, arm's results)`` terms at
    ``stage``, seed by seed (seeds every term has): its mean with a 95% t-interval."""
    from digirl_lite.viz.curves import mean_ci95

    rates = [{r["seed"]: r["stages"][stage]["success_rate"] for r in recs
              if stage in r["stages"]} for _, recs in terms]
    seeds = sorted(set.intersection(*(set(r) for r in rates))) if rates else []
    if not seeds:
        return None
    m, lo, hi = mean_ci95([sum(sign * r[s] for (sign, _), r in zip(terms, rates))
                           for s in seeds])
    return {"seeds": seeds, "mean": m, "ci95": [lo, hi]}


def pair_differences(spec: GridSpec, results: dict[str, list[dict[str, Any]]]
                     ) -> dict[str, Any]:
    """The spec's ``pairs`` (arm minus its reference, seed by seed) and, for every two of
    them, the difference between their differences (``(a - b) - (c - d)``), per stage."""
    from itertools import combinations

    have = [(a, b) for a, b in spec.pairs if a in results and b in results]
    out: dict[str, Any] = {}
    for a, b in have:
        out[f"{a} - {b}"] = {st: seed_contrast([(1, results[a]), (-1, results[b])], st)
                             for st in spec.stages}
    for (a, b), (c, d) in combinations(have, 2):
        terms = [(1, results[a]), (-1, results[b]), (-1, results[c]), (1, results[d])]
        out[f"({a} - {b}) - ({c} - {d})"] = {st: seed_contrast(terms, st)
                                             for st in spec.stages}
    return out


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
            "mixed_threads": mixed_threads(results, ref, spec.pairs)}


def _paired_runs(results: dict[str, list[dict[str, Any]]], ref: str | None,
                 pairs: Sequence[tuple[str, str]] = ()
                 ) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(arm, reference arm, run, reference run) for every run the tables pair: the
    differences from the reference, and the spec's ``pairs``, at the same seed."""
    compared = [(name, ref) for name in results if ref in results and name != ref]
    compared += [p for p in pairs if p not in compared and set(p) <= set(results)]
    out = []
    for name, other_arm in compared:
        by_seed = {r["seed"]: r for r in results[other_arm]}
        out += [(name, other_arm, r, by_seed[r["seed"]]) for r in results[name]
                if r["seed"] in by_seed]
    return out


def mixed_commits(results: dict[str, list[dict[str, Any]]], ref: str | None,
                  pairs: Sequence[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    """The pairs of the differences from the reference, and of the spec's ``pairs`` (an
    arm's run and its reference's at the same seed), whose runs ran on different code
    (:func:`run_versions`), each with the commits of both."""
    out = []
    for name, other_arm, r, other in _paired_runs(results, ref, pairs):
        mine, theirs = run_versions(r), run_versions(other)
        if len(mine) > 1 or {k for _, k in mine} != {k for _, k in theirs}:
            out.append({"arm": name, "seed": r["seed"], "commit": version_label(r),
                        "reference": other_arm, "reference_commit": version_label(other)})
    return out


def run_threads(rec: dict[str, Any]) -> list[int]:
    """The thread counts (``OMP_NUM_THREADS``) a result's run ran with, over its attempts."""
    got = [a.get("threads") for a in rec.get("attempts") or []] or [rec.get("omp_threads")]
    return sorted({int(t) for t in got if t is not None})


def mixed_threads(results: dict[str, list[dict[str, Any]]], ref: str | None,
                  pairs: Sequence[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    """The paired runs (as :func:`mixed_commits`) that ran with different thread counts:
    torch's CPU reductions then sum in another order, and two runs of one seed part ways
    as they would on different code. A run whose threads are not recorded is not listed."""
    out = []
    for name, other_arm, r, other in _paired_runs(results, ref, pairs):
        mine, theirs = run_threads(r), run_threads(other)
        if mine and theirs and (len(mine) > 1 or mine != theirs):
            out.append({"arm": name, "seed": r["seed"], "threads": mine,
                        "reference": other_arm, "reference_threads": theirs})
    return out


def mixed_threads_lines(t: dict[str, Any]) -> list[str]:
    """One line per pair of arms naming its runs that :func:`mixed_threads` found."""
    by_pair: dict[tuple[str, str], list[str]] = {}
    for m in t.get("mixed_threads", []):
        by_pair.setdefault((m["arm"], m["reference"]), []).append(
            f"seed {m['seed']} {'/'.join(map(str, m['threads']))} vs "
            f"{'/'.join(map(str, m['reference_threads']))}")
    return [f"- `{arm}` - `{ref}`: " + "; ".join(seeds)
            for (arm, ref), seeds in by_pair.items()]


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
    return paths


def rerun_stale(jobs: list[Job], commit: str, *, dry_run: bool = False) -> list[Job]:
    """Clear the jobs whose result, or unfinished run, is not on ``commit``'s code, clean
    (:func:`is_stale`): their result file, run folder and attempt records go, so that the
    grid runs them afresh. HEAD must be ``commit``, or a commit with the same code (the
    same :func:`code_id`: result files committed on top of it, as ``--commit`` does), else
    :class:`SpecError`. A job another live runner holds is left to it."""
    target = (_git_or_none("rev-parse", "--verify", "-q", f"{commit}^{{commit}}") or ""
              ).strip()
    if not target:
        raise SpecError(f"--rerun-stale {commit}: not a commit of this repository")
    head = (_git_or_none("rev-parse", "--verify", "-q", "HEAD") or "").strip()
    if head != target:
        differ = sorted({f for j in jobs for f in j.code_files()
                         if code_id(head, [f]) != code_id(target, [f])})
        if differ:
            raise SpecError(f"--rerun-stale {commit}: HEAD is {head[:10]}, not "
                            f"{target[:10]}, and {', '.join(differ)} differ there: check "
                            f"out {commit} first (git checkout {commit}), or name HEAD")
        print(f"note: HEAD {head[:10]} is not {target[:10]} but has its code "
              f"({', '.join(jobs[0].code_files()) if jobs else 'the package'})")
    stale = []
    for job in jobs:
        if not (why := is_stale(job, target)):
            continue
        if not dry_run and (holder := _take_lock(job)) is not None:
            print(f"busy {job.arm.grid}/{job.name} ({why}): {holder} runs it")
            continue
        stale.append(job)
        print(f"stale {job.arm.grid}/{job.name}: {why}"
              + (": would rerun" if dry_run else ": cleared, to rerun"), flush=True)
        if not dry_run:
            job.result.unlink(missing_ok=True)
            shutil.rmtree(job.out, ignore_errors=True)
            job.attempts.unlink(missing_ok=True)
            _drop_lock(job)
    return stale


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
    runs_dir = (args.runs_dir or (ROOT / "runs" / "grid_quick" if args.quick else RUNS)).resolve()
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
