"""A finished run's small result file, ``benchmarks/results/grid/<grid>/<arm>-seed<S>.json``:
built from the run's summary.json and metrics.jsonl with its provenance
(:func:`result_record`), written and committed, and read back for the table
(:func:`load_results`).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import repo
from .provenance import provenance, read_attempts
from .repo import _git, _rel
from .spec import GridSpec, Job

OPTIONAL_STAGE_KEYS = ("invalid_step_rate", "unjudged", "unjudged_step_rate", "day",
                       "success_rate_unjudged_as_failures", "truth", "true_success_rate",
                       "true_successes", "true_episodes", "judge_agreement",
                       "failure_causes", "success_with_recovery", "recoveries",
                       "decided", "decided_by_kind", "per_task")
"""Copied into a result file where the run's summary has them (the truth keys: issue 32; a
harness evolution's steps decided by rules, in all and per task kind, and each held-out
task's outcome: issue 48)."""
EVOLUTION_KEYS = ("best", "generations", "accepted", "episodes", "invalid_proposals", "kinds",
                  "root_solved_lost", "held_out_lost", "held_out_gained")
"""A harness evolution's summary (``evolution``) as its result file keeps it, with its kept
edits' kinds and ids (``edits``)."""


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
        "environment": summary.get("environment"),
        "online_iteration_s": _time_split(job.out),
        "timings_s": summary.get("timings_s", {}),
        "command": shlex.join(["python", _rel(repo.ROOT / job.arm.recipe), *job.recipe_args()]),
        "config": _redacted(summary.get("config", {})),
        **({"evolution": {**{k: ev[k] for k in EVOLUTION_KEYS if k in ev},
                          "edits": [{"kind": e.get("kind"), "id": _edit_id(e)}
                                    for e in ev.get("edits", [])]}}
           if (ev := summary.get("evolution")) else {}),
        **({"claw": {"active": [u["id"] for u in cl.get("active", [])],
                     **{k: cl[k] for k in ("held_out_lost", "held_out_gained") if k in cl},
                     "promoted_by_cycle": [c.get("promoted", [])
                                           for c in summary.get("cycles", [])]}}
           if (cl := summary.get("claw")) else {}),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _edit_id(edit: dict[str, Any]) -> str | None:
    """A kept harness edit's rule or skill id (its content is JSON with an ``id``), else
    None."""
    try:
        return json.loads(edit.get("content", "")).get("id")
    except (ValueError, AttributeError):
        return None


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
        add = subprocess.run(["git", "add", "--", *rel], cwd=repo.ROOT, capture_output=True,
                             text=True)
        if add.returncode == 0:
            if not _git("status", "--porcelain", "--", *rel):
                return True  # committed already, unchanged
            c = subprocess.run(["git", "commit", "-q", "-m", message, "--", *rel], cwd=repo.ROOT,
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
