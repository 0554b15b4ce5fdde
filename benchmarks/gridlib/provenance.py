"""What code a run ran on (issue 32, item 3): the commit, :func:`code_id` and uncommitted
changes of each process that worked on it (an attempt: the first, each resume), recorded
beside its run folder and carried into its result file; the refusal to start runs on
uncommitted changes (:func:`require_clean`); and which runs are stale for a commit
(:func:`is_stale`).

A run's :func:`code_id` hashes the git trees of what it computes with (the package and the
recipes) at its commit, not the runner's own files: the runner moving from one file,
benchmarks/grid.py, into this package (issue 50) left every recorded code_id as it was. The
runner's files are watched for uncommitted changes all the same (``RUNNER_CODE``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shlex
import socket
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import repo
from .repo import _git_or_none, _rel
from .spec import RECIPE, Job, SpecError, _code_files


class DirtyTreeError(SpecError):
    """Uncommitted changes to what a run would compute with; the message names the files."""


def code_id(commit: str | None, files: list[str]) -> str | None:
    """A short hash of the git objects ``files`` are at ``commit`` (``git ls-tree``: the
    package's tree, the recipes'): the same for two commits whose code is the same, as
    across the commits of result files that ``--commit`` makes while a grid runs. None
    where the commit is not known here."""
    if not commit:
        return None
    return _code_id(str(repo.ROOT), commit, tuple(files))


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
                "changed": [f"{repo.ROOT} is not a git checkout with a commit"]}
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
        h = hashlib.sha256(subprocess.run(diff, cwd=repo.ROOT, capture_output=True).stdout)
        extra = [line[3:] for line in changed if line.startswith("?? ")] + outside
        for f in extra:
            h.update(f"\n{f}\n".encode())
            h.update((repo.ROOT / f).read_bytes())
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
            recipe = _rel(repo.ROOT / shlex.split(rec.get("command", ""))[1])
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
