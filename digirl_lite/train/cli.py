"""The command line every recipe shares: preset, config file, field overrides, output folder.

    ap = run_parser("what this recipe does")
    args = ap.parse_args()
    cfg = config_from_args(args)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from digirl_lite.train.config import ConfigError, load_config, sim_quick, sim_webshop

__all__ = ["run_parser", "config_from_args", "parse_assignments", "config_json",
           "cache_dir_of", "print_table", "SPLIT_FIELDS",
           "per_process", "launch_processes", "add_processes_argument",
           "default_processes", "usable_cpus", "threads_per_process",
           "processes_of_run"]

SPLIT_FIELDS = ("n_envs", "rollouts_per_iteration", "actor_batch", "critic_batch")
"""What ``--processes N`` divides among the processes, so that N processes run the same
experiment as one: the phones, the online trajectories per iteration and the two
minibatches (gradients are averaged, so N minibatches of ``b / N`` rows are one of ``b``).
The pile and the evaluations are already shared out by the Trainer."""


def run_parser(description: str, out: str = "runs/webshop") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", default=out, help="the run folder")
    ap.add_argument("--quick", action="store_true", help="the few-minute smoke preset")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--world", choices=["webshop", "general"], default=None)
    ap.add_argument("--config", help="JSON file of DigiRLConfig fields (recipes/configs/)")
    ap.add_argument("--set", nargs="*", action="extend", default=[], metavar="FIELD=JSON",
                    help='override fields, e.g. --set iterations=10 judge=\'{"judge": '
                         '"noisy_oracle"}\' (given again, it adds to the fields set)')
    ap.add_argument("--cache-dir", default=None,
                    help="starting policy and pile cache (default: $DIGIRL_LITE_CACHE or "
                         "~/.cache/digirl_lite; '' to disable)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines or bars")
    return ap


def add_processes_argument(ap: argparse.ArgumentParser) -> None:
    """``--processes N`` for a recipe that launches itself on N processes
    (:func:`launch_processes`); :func:`config_from_args` then gives each its share."""
    ap.add_argument("--processes", type=int, default=None, metavar="N",
                    help="run the same experiment on N data-parallel processes of this "
                         "machine (gloo; the CPUs' threads divided among them): "
                         + ", ".join(SPLIT_FIELDS) + " are divided by N. Default: "
                         "2 for a full simulated run on a CPU machine with 2 or more CPUs "
                         "and OMP_NUM_THREADS unset, else 1 (default_processes)")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container or ``taskset`` pinned
    to 2 of 64 CPUs has 2), ``os.cpu_count()`` where the platform cannot say."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        return os.cpu_count() or 1


def threads_per_process(n: int) -> int:
    """Each of ``n`` launched processes' threads: ``OMP_NUM_THREADS`` (or the usable CPUs)
    divided by ``n``, at least 1."""
    return max(1, int(os.environ.get("OMP_NUM_THREADS") or usable_cpus()) // n)


def processes_of_run(out) -> int | None:
    """How many processes the run in ``out`` ran on, from its newest checkpoint (None: no
    readable checkpoint), so that ``--resume`` without ``--processes`` goes on as it ran."""
    from pathlib import Path

    root = Path(out) / "checkpoints"
    try:
        state = json.loads((root / (root / "latest").read_text().strip() / "state.json"
                            ).read_text())
        return int(state.get("processes", state.get("summary", {}).get("processes", 1)))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def default_processes(cfg, args: argparse.Namespace) -> int:
    """``--processes`` when it is not given: 2 where two data-parallel processes measured
    faster than one, else 1. On the project's 2-CPU machine the main job took 575 s and
    598 s as two processes of one thread each against 900-955 s as one process
    (``benchmarks/results/main_job_time.json``): its operations are too small for a second
    thread to help, and two processes split every phase instead. So 2 for a full run (not
    ``--quick``: its minute would go to starting the group) of the simulated phone on a CPU
    machine with at least 2 CPUs, when the config divides (:func:`per_process`); 1 where
    the caller chose the threads (``OMP_NUM_THREADS`` set, as the grid runner does for each
    of its jobs), inside a launched group, on a GPU, on real devices, or with ``claw``."""
    if (getattr(args, "quick", False) or "WORLD_SIZE" in os.environ
            or os.environ.get("OMP_NUM_THREADS") or cfg.device != "cpu" or cfg.env != "sim"
            or cfg.learner != "sync" or cfg.claw):  # one experience bank: one process
        return 1
    if usable_cpus() < 2:
        return 1
    try:
        per_process(cfg, 2)
    except ConfigError:
        return 1
    return 2


def per_process(cfg, n: int):
    """``cfg`` with the :data:`SPLIT_FIELDS` divided by ``n``: what each of ``n`` processes
    runs so that together they run ``cfg``. ConfigError naming the field that ``n`` does not
    divide."""
    if n < 1:
        raise ConfigError(f"--processes must be at least 1, got {n}")
    if n == 1:
        return cfg
    bad = [f"{f}={getattr(cfg, f)}" for f in SPLIT_FIELDS if getattr(cfg, f) % n]
    if bad:
        raise ConfigError(f"--processes {n} must divide {', '.join(bad)} (each process runs "
                          f"a 1/{n} share of {', '.join(SPLIT_FIELDS)})")
    return replace(cfg, **{f: getattr(cfg, f) // n for f in SPLIT_FIELDS})


def launch_processes(n: int, script: str, argv: list[str]) -> int:
    """Run ``python script argv`` as ``n`` processes of a standalone
    ``torch.distributed.run`` group on this machine, each with its share of the threads
    (``OMP_NUM_THREADS``, or the usable CPUs, divided by ``n``); returns the group's exit status.

    On this project's 2-CPU machine the main job's operations are too small for two
    threads to speed them up much (one process: about 950 s at 1 thread, 900 s at 2);
    two processes of one thread each split every phase's work instead."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_process(n))}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={n}", script, *argv]
    return subprocess.run(cmd, env=env).returncode


def config_from_args(args: argparse.Namespace, default_config: str | Path | None = None,
                     **extra: Any):
    """The run's config: the preset (``--quick`` or the default simulated Web Shopping),
    then ``--config`` (without it and without ``--quick``: ``default_config`` where given),
    ``--world``/``--seed``, ``--set`` and ``extra``. Exits with the reason when the config
    cannot run (bad field, missing path)."""
    overrides: dict[str, Any] = {}
    for name in ("seed", "world"):
        if getattr(args, name, None) is not None:
            overrides[name] = getattr(args, name)
    overrides.update(parse_assignments(args.set, "--set", "FIELD"))
    overrides.update(extra)
    try:
        path = args.config or (None if args.quick else default_config)
        if path:
            return _share(load_config(path, preset="sim_quick" if args.quick else None,
                                      **overrides), args)
        cfg = (sim_quick if args.quick else sim_webshop)(**overrides)
        cfg.check_paths()
        return _share(cfg, args)
    except (ConfigError, TypeError, ValueError) as e:
        raise SystemExit(f"bad configuration: {e}") from None


def parse_assignments(items: list[str], flag: str, what: str = "NAME") -> dict[str, Any]:
    """``NAME=VALUE`` items of a command-line option (``flag``), each value read as JSON
    (a bare word stays a string); an item without "=" exits naming the flag."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{flag} {item!r}: expected {what}=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def config_json(cfg) -> str:
    """``cfg`` as the JSON a run saves of it (``--print-config``): every field, credentials
    redacted (:func:`~digirl_lite.redaction.redact`)."""
    from digirl_lite.redaction import redact

    return json.dumps(redact(json.loads(json.dumps(cfg.as_dict(), default=str))), indent=2)


def _share(cfg, args: argparse.Namespace):
    """This process's share of ``cfg`` under ``--processes`` (:func:`per_process`); inside
    the group, the group must be the size asked for."""
    n = getattr(args, "processes", None)
    n = 1 if n is None else n  # None: not given (the recipe's launcher decides)
    world = os.environ.get("WORLD_SIZE")
    if n > 1 and world is not None and int(world) != n:
        raise ConfigError(f"--processes {n} inside a group of {world} processes")
    return per_process(cfg, n)


def cache_dir_of(args: argparse.Namespace):
    """``Trainer(cache_dir=...)`` for ``--cache-dir``: the user's cache by default, None
    (no cache) for ''."""
    from digirl_lite.train.trainer import USER_CACHE

    return USER_CACHE if args.cache_dir is None else (args.cache_dir or None)


STAGES = ("copier", "offline", "online")
"""The main job's stages, the table's columns by default."""


def print_table(results: dict[str, dict[str, Any]], eval_tasks: int,
                stages: Sequence[str] = STAGES) -> None:
    """Held-out success (mean episode length; share of steps whose action string did not
    parse) of each run's stages, one row per run; where some tasks were not judged, the
    judged count beside the rate, and "incomplete" instead of it below the run's
    ``min_judged_share`` (issue 29); where the environment has its own check, the true
    rate beside the judged one (issue 32); below it, where some stage has held-out splits,
    their rates and gaps to the test list (issue 32 item 5). ``stages``: the columns (another
    recipe's stages, e.g. TRL's ``("sft", "grpo")``, in the same layout)."""
    print(f"\nheld-out success (mean episode length; invalid steps) on the first {eval_tasks} "
          "test tasks")
    print(f"{'':<12} " + "  ".join(f"{st:^22}" for st in stages))
    for name, summary in results.items():
        cells = []
        for stage in stages:
            r = summary["stages"].get(stage)
            inv = r.get("invalid_step_rate", float("nan")) if r else float("nan")
            if r is not None and not r.get("complete", True):  # too few tasks judged
                what = f"incomplete: {r['judged_episodes']}/{r['episodes']} judged"
                cells.append(f"{what:^22}")
                continue
            judged = r and r.get("judged_episodes", r.get("episodes")) != r.get("episodes")
            cells.append(f"{'-':^22}" if r is None else
                         f"{100 * r['success_rate']:5.1f}% ({r['mean_length']:4.1f}; "
                         f"{100 * inv:4.1f}% inv)"
                         + (f" [{r['judged_episodes']}/{r['episodes']} judged]" if judged
                            else "")
                         + (f" [true {100 * r['true_success_rate']:.1f}%]"  # issue 32
                            if r.get("truth") == "environment" else ""))
        print(f"{name:<12} " + "  ".join(cells))
    _print_generalization(results, stages)


def _print_generalization(results: dict[str, dict[str, Any]],
                          stages: Sequence[str] = STAGES) -> None:
    """Below :func:`print_table`, where some stage has held-out splits (issue 32 item 5):
    per run and stage, the test list's rate, each split's and its gap to the test list
    (split - test, points); the true rates where the environment has its own check."""
    from digirl_lite.train.evaluate import truth_or_judged

    def rate(r: dict[str, Any] | None) -> float | None:
        return None if r is None or not r.get("complete", True) else truth_or_judged(r)

    def splits(summary: dict[str, Any], stage: str) -> dict[str, Any]:
        return (summary["stages"].get(stage) or {}).get("splits") or {}

    stages = [st for st in stages
              if any(splits(s, st) for s in results.values())]
    if not stages:
        return
    names = list(dict.fromkeys(n for s in results.values() for st in stages
                               for n in splits(s, st)))
    w = max(13, *(len(n) for n in names))
    print("\nheld-out splits beside the test list, % (true rates where the environment has "
          "its own check, else judged); in brackets the gap, split - test, in points")
    print(f"{'':<12} " + "  ".join(f"{st:^{6 + (w + 2) * len(names)}}" for st in stages))
    print(f"{'':<12} " + "  ".join(f"{'test':>6}" + "".join(f"  {n:>{w}}" for n in names)
                                   for _ in stages))
    for name, summary in results.items():
        blocks = []
        for st in stages:
            test = rate(summary["stages"].get(st))
            cells = [f"{'-' if test is None else f'{100 * test:.1f}':>6}"]
            for n in names:
                x = rate(splits(summary, st).get(n))
                cell = "-" if x is None else f"{100 * x:.1f}" + (
                    "" if test is None else f" ({100 * (x - test):+.1f})")
                cells.append(f"  {cell:>{w}}")
            blocks.append("".join(cells))
        print(f"{name:<12} " + "  ".join(blocks))
