"""Running a grid's jobs, ``n_jobs`` recipe processes at a time (:func:`run_jobs`): each job
held by a lock file while it runs, a checkpointed run resumed, a finished one given its result
file; and the jobs on other code cleared to run again (:func:`rerun_stale`).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from . import repo
from .provenance import (
    code_id,
    end_attempt,
    is_stale,
    job_tree_state,
    read_attempts,
    require_clean,
    start_attempt,
)
from .repo import _git, _git_or_none, _rel
from .results import _diff_config, _stage_line, commit_files, result_record, write_result
from .spec import STAGES, Job, SpecError


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
                p = subprocess.Popen(cmd, cwd=repo.ROOT, env=env, stdout=log,
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
