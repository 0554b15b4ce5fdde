"""A grid's spec, ``benchmarks/grids/<grid>.json`` (the package docstring shows one): its
arms, seeds and stages, checked as it is read (:func:`load_spec`, :class:`SpecError` naming
the file and the field); and its jobs, one per arm and seed, with where each one's run
folder, log, attempt records and result go (:class:`Job`, :func:`jobs_of`).
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import repo
from .repo import GRIDS, RESULTS, RUNS, _rel

RECIPE = "recipes/offline_to_online.py"
OWN_CONFIG_RECIPES = {"evolve_harness.py", "claw.py"}
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
CURVE_X = ("online_trajectories", "day")
RUNNER_CODE = ("benchmarks/grid.py", "benchmarks/gridlib")
"""This runner's code, relative to the repository: watched for uncommitted changes before a
run starts (:meth:`Job.watched_files`), not part of a run's :func:`code_id`."""


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
        config file, this runner (benchmarks/grid.py and its package) and the grid spec(s)."""
        config = [_rel(repo.ROOT / self.arm.config)] if self.arm.config else []
        return ["digirl_lite", _rel(repo.ROOT / self.arm.recipe), *config, *RUNNER_CODE,
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
        if not (repo.ROOT / self.arm.recipe).resolve().is_relative_to(repo.ROOT / "recipes"):
            return None
        if Path(self.arm.recipe).name in OWN_CONFIG_RECIPES:
            return None
        from digirl_lite.train.cli import config_from_args, run_parser

        ns, _ = run_parser("grid").parse_known_args(self.recipe_args())
        try:
            return config_from_args(ns).as_dict()
        except SystemExit as e:
            raise SpecError(f"arm {self.arm.name} (grid {self.arm.grid}): {e}") from None


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
    recipe = _rel(repo.ROOT / recipe)
    return ["digirl_lite", "recipes", *([] if recipe.startswith("recipes/") else [recipe])]


def _spec_files(spec: GridSpec, arm: Arm) -> tuple[Path, ...]:
    own = spec.path.parent / f"{arm.grid}.json"
    return (spec.path,) if arm.grid == spec.name else (spec.path, own)
