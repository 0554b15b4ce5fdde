"""The main job's time, measured rather than written by hand (issue 32, item 3): runs the
README's command under ``/usr/bin/time -v`` and writes one entry of
``benchmarks/results/main_job_time.json`` (the source of the README's minutes) from the run's
own ``summary.json`` and the time output: wall, user and system time, the largest process's
memory, the phases, held-out success, and the commit.

    python benchmarks/main_job_time.py                      # the main job, pile built (~10 min)
    python benchmarks/main_job_time.py --label processes_1 -- --processes 1   # recipe flags
    python benchmarks/main_job_time.py --dry-run            # the command, run nothing
    python benchmarks/main_job_time.py --fresh-clone        # the README's first command
    python benchmarks/main_job_time.py --readme             # write its figure into README

``--fresh-clone`` measures what a new user meets (issue 49, item 1): a ``git clone`` of this
checkout's HEAD into an empty folder, the README's first command there as written (the install,
timed on its own with pip's cache off, then the run with an empty ``$DIGIRL_LITE_CACHE``), and
writes the entry ``fresh_clone`` with ``install_s``, ``run_s`` and ``total_s`` (install + run; also
as ``first_command_s``).
``--readme`` puts the sentence built from that entry (:func:`readme_sentence`) between the
README's ``<!-- main-job-time -->`` markers; ``tests/package/test_readme.py`` fails when they
differ.

The pile is built (``--cache-dir ''``), as in the entries measured by hand before this script,
unless ``--cached-pile``. Without ``/usr/bin/time`` (Debian/Ubuntu: ``apt install time``) the
times and memory come from Python's ``resource.getrusage(RUSAGE_CHILDREN)`` and the entry says
so (``measured_with``). The other entries of the file are kept; an entry of the same label is
replaced.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "main_job_time.json"
RECIPE = "recipes/offline_to_online.py"
TIME_BIN = "/usr/bin/time"
FRESH_INSTALL = "python3 -m venv .venv && .venv/bin/pip install --quiet torch==2.13.0 -e ."


def _elapsed_s(text: str) -> float:
    """GNU time's ``h:mm:ss`` or ``m:ss.ss`` in seconds."""
    s = 0.0
    for part in text.split(":"):
        s = 60 * s + float(part)
    return s


def parse_time_v(text: str) -> dict[str, Any]:
    """The numbers of ``/usr/bin/time -v``'s report: elapsed, user and system seconds, the
    maximum resident set size (KiB; of the largest process: the kernel's ``ru_maxrss`` of the
    child and the descendants it waited for) and the exit status."""
    fields = {"user_s": r"User time \(seconds\): ([\d.]+)",
              "sys_s": r"System time \(seconds\): ([\d.]+)",
              "elapsed_s": r"Elapsed \(wall clock\) time \([^)]*\): ([\d:.]+)",
              "max_rss_kib": r"Maximum resident set size \(kbytes\): (\d+)",
              "exit_status": r"Exit status: (-?\d+)"}
    out: dict[str, Any] = {}
    for key, pattern in fields.items():
        m = re.search(pattern, text)
        if m is None:
            raise ValueError(f"no {key} in the time report:\n{text}")
        v = m.group(1)
        out[key] = (_elapsed_s(v) if key == "elapsed_s" else
                    int(v) if key in ("max_rss_kib", "exit_status") else float(v))
    return out


def measure(cmd: list[str], time_bin: str | None = TIME_BIN, **popen: Any) -> dict[str, Any]:
    """Run ``cmd`` and measure it: under ``time_bin -v`` where that exists, else with
    ``resource.getrusage(RUSAGE_CHILDREN)`` around it (this process's children: ``cmd``
    alone)."""
    if time_bin and Path(time_bin).is_file():
        with tempfile.TemporaryDirectory() as d:
            report = Path(d) / "time.txt"
            subprocess.run([time_bin, "-v", "-o", str(report), *cmd], **popen)
            out = parse_time_v(report.read_text())
        return {**out, "measured_with": f"{time_bin} -v"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, **popen)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"user_s": round(after.ru_utime - before.ru_utime, 2),
            "sys_s": round(after.ru_stime - before.ru_stime, 2),
            "elapsed_s": round(wall, 2), "max_rss_kib": after.ru_maxrss,
            "exit_status": p.returncode,
            "measured_with": "python resource.getrusage(RUSAGE_CHILDREN): no /usr/bin/time"}


def _git(*args: str) -> str:
    p = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else ""


def code_state() -> dict[str, Any]:
    """The commit, and the uncommitted changes to the package and the recipes."""
    changed = _git("status", "--porcelain", "--", "digirl_lite", "recipes").splitlines()
    return {"commit": _git("rev-parse", "HEAD") or None, "dirty": bool(changed),
            **({"changed": changed} if changed else {})}


def machine() -> dict[str, Any]:
    from digirl_lite.provenance import environment

    env = environment()
    return {"cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(), "cpu": env["cpu"],
            "torch_cpu_capability": env["torch_cpu_capability"],
            "load_1m_at_start": round(os.getloadavg()[0], 2),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}


def entry(summary: dict[str, Any], measured: dict[str, Any], command: str,
          code: dict[str, Any], host: dict[str, Any]) -> dict[str, Any]:
    """One entry of main_job_time.json: the time report's numbers, and from summary.json the
    Trainer's wall time, the phases (process 0's ``timings_s``), the evaluations and their
    held-out success."""
    stages = summary.get("stages", {})
    invalid = {st: round(100 * r["invalid_step_rate"], 1) for st, r in stages.items()
               if r.get("invalid_step_rate") is not None}
    return {
        "command": command,
        "code": code,
        "machine": host,
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "measured_with": measured["measured_with"],
        "elapsed_s": round(measured["elapsed_s"], 1),
        "user_s": measured["user_s"], "sys_s": measured["sys_s"],
        "max_rss_gib_largest_process": round(measured["max_rss_kib"] / 2**20, 2),
        "exit_status": measured["exit_status"],
        "summary_wall_s": summary.get("wall_s"),
        "processes": summary.get("processes"),
        "evaluations": len(stages),
        "phases_s": {k: round(v) if v >= 1 else round(v, 2)
                     for k, v in summary.get("timings_s", {}).items()},
        "held_out_success_pct": {st: round(100 * r["success_rate"], 1)
                                 for st, r in stages.items()},
        **({"invalid_step_pct": invalid} if invalid else {}),
    }


def write_entry(path: Path, label: str, record: dict[str, Any]) -> None:
    """Put ``record`` under ``label`` in the JSON file at ``path``, keeping its other
    entries."""
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[label] = record
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


README = ROOT / "README.md"
MARK = ("<!-- main-job-time -->", "<!-- /main-job-time -->")


def readme_sentence(record: dict[str, Any]) -> str:
    """The README's time figure from the ``fresh_clone`` entry of main_job_time.json."""
    host = record["machine"]
    return (f"Measured on a fresh clone with empty caches ({host['cpus']} CPUs, "
            f"{host['cpu'] or 'unknown CPU'}, {record['when'][:10]}): "
            f"{record['first_command_s'] / 60:.1f} minutes in all, install "
            f"{record['install_s']:.0f} s and run {record['elapsed_s']:.0f} s "
            f"(`benchmarks/results/main_job_time.json`, entry `fresh_clone`, with its commit; "
            f"`python benchmarks/main_job_time.py --fresh-clone` measures it again).")


def readme_with_figure(text: str, record: dict[str, Any]) -> str:
    """``text`` (the README) with :func:`readme_sentence` between the markers."""
    a, b = text.find(MARK[0]), text.find(MARK[1])
    if a < 0 or b < a:
        raise ValueError(f"the README has no {MARK[0]} ... {MARK[1]} markers")
    return text[:a + len(MARK[0])] + readme_sentence(record) + text[b:]


def fresh_clone(args: argparse.Namespace) -> int:
    """Clone HEAD into an empty folder, run the README's first command there, write the
    ``fresh_clone`` entry."""
    code, host = code_state(), machine()
    with tempfile.TemporaryDirectory(prefix="digirl-fresh-") as d:
        clone, cache = Path(d) / "digirl_lite", Path(d) / "cache"
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)],
                       check=True)
        env = {**os.environ, "PIP_NO_CACHE_DIR": "1", "DIGIRL_LITE_CACHE": str(cache)}
        for k in ("PYTHONPATH", "DIGIRL_LITE_DATA", "OMP_NUM_THREADS"):
            env.pop(k, None)
        install = FRESH_INSTALL
        print(f"installing: {install}", flush=True)
        t0 = time.perf_counter()
        p = subprocess.run(["bash", "-c", install], cwd=clone, env=env)
        install_s = time.perf_counter() - t0
        if p.returncode != 0:
            print(f"the install failed (exit {p.returncode}): no entry written", file=sys.stderr)
            return 1
        cmd = [str(clone / ".venv" / "bin" / "python"), RECIPE]
        print(f"running: .venv/bin/python {RECIPE} (cache {cache}, empty)", flush=True)
        measured = measure(cmd, cwd=clone, env=env)
        out = clone / "runs" / "webshop"
        if measured["exit_status"] != 0 or not (out / "summary.json").is_file():
            print(f"the run failed (exit {measured['exit_status']}): no entry written",
                  file=sys.stderr)
            return 1
        summary = json.loads((out / "summary.json").read_text())
    record = entry(summary, measured, f"{install} && .venv/bin/python {RECIPE}", code, host)
    record.update(install_s=round(install_s, 1), run_s=round(measured["elapsed_s"], 1),
                  total_s=round(install_s + measured["elapsed_s"], 1),
                  first_command_s=round(install_s + measured["elapsed_s"], 1),
                  fresh_clone=True, pip_cache="off (PIP_NO_CACHE_DIR=1)",
                  digirl_lite_cache="empty")
    write_entry(args.json, "fresh_clone", record)
    print(json.dumps(record, indent=1))
    print(readme_sentence(record))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe_args", nargs="*", help="more recipe flags, after --")
    ap.add_argument("--label", default="measured",
                    help="the entry's name in the JSON file (default: measured)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "main_job_time",
                    help="the run folder (must not hold a run)")
    ap.add_argument("--json", type=Path, default=RESULT, help="the file the entry goes to")
    ap.add_argument("--recipe", default=RECIPE)
    ap.add_argument("--cached-pile", action="store_true",
                    help="read the pile from the cache when it is there (default: build it)")
    ap.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    ap.add_argument("--fresh-clone", action="store_true",
                    help="clone HEAD, install and run the README's first command there")
    ap.add_argument("--readme", action="store_true",
                    help="write the fresh_clone entry's figure into the README")
    args = ap.parse_args(argv)
    if args.readme:
        record = json.loads(args.json.read_text())["fresh_clone"]
        README.write_text(readme_with_figure(README.read_text(), record))
        print(readme_sentence(record))
        return 0
    if args.fresh_clone:
        if args.dry_run:  # what it would do, run nothing
            print(f"git clone {ROOT} <empty folder> && cd <it> && PIP_NO_CACHE_DIR=1 "
                  f"{FRESH_INSTALL} && DIGIRL_LITE_CACHE=<empty folder> "
                  f".venv/bin/python {RECIPE}")
            return 0
        return fresh_clone(args)
    out = args.out.resolve()
    shown_out = str(out.relative_to(ROOT)) if out.is_relative_to(ROOT) else str(out)
    recipe_args = ["--out", shown_out, *([] if args.cached_pile else ["--cache-dir", ""]),
                   *args.recipe_args]
    cmd = [sys.executable, args.recipe, *recipe_args]
    shown = shlex.join(["python", args.recipe, *recipe_args])
    if args.dry_run:
        print(shown)
        return 0
    if out.exists() and any(out.iterdir()):
        ap.error(f"--out {out} is not empty: remove it or choose another folder")
    code, host = code_state(), machine()
    print(f"running: {shown}", flush=True)
    if not Path(TIME_BIN).is_file():
        print(f"note: no {TIME_BIN}; measuring with Python's resource module", flush=True)
    measured = measure(cmd, cwd=ROOT)
    if measured["exit_status"] != 0 or not (out / "summary.json").is_file():
        print(f"the run failed (exit {measured['exit_status']}): no entry written",
              file=sys.stderr)
        return 1
    summary = json.loads((out / "summary.json").read_text())
    record = entry(summary, measured, shown, code, host)
    write_entry(args.json, args.label, record)
    print(json.dumps(record, indent=1))
    print(f"written: {args.json} [{args.label!r}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
