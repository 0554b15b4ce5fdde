"""Evaluation on held-out tasks: success rate with a 95% interval, episode length, and why
the failures failed (spec section 9's comparison; the paper evaluates the first 96 tasks)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from digirl_lite.data.records import Ending, ScreenTable, Source
from digirl_lite.judge.calibration import wilson_interval
from digirl_lite.rollout.fleet import BatchAgent, Episode

__all__ = ["FAILURE_KINDS", "failure_kind", "evaluate", "summarize"]

FAILURE_KINDS = ("never_reached_site", "wrong_page_at_end", "ran_out_of_steps",
                 "infrastructure", "unjudged")
EVAL_TASKS = 96


def _reached(task, state) -> bool:
    """Did ``state`` get to the task's first milestone (the site, Google, the app)?"""
    p = state.page
    if task.kind == "webshop":
        return p.site == task.site
    if task.kind == "search":
        return p.kind in ("google_results", "web_result")
    return p.app == task.app


def failure_kind(episode: Episode) -> str | None:
    """None for a success; else one of :data:`FAILURE_KINDS`.

    Infrastructure first (not the agent's fault), then "unjudged" (the judge could not
    answer on some step: not the agent's fault either); then "never reached the site" (the first
    milestone never appeared, read from the simulator's states); then "ran out of steps"
    (the budget ended it); else the agent stopped on the wrong page.
    """
    t = episode.trajectory
    if t.is_success:
        return None
    if t.ending is Ending.INFRA:
        return "infrastructure"
    if t.num_unjudged:
        return "unjudged"
    states = [s for s in episode.states if s is not None]
    if states:
        from digirl_lite.envs.sim.tasks import parse_task

        task = parse_task(t.task)
        if not any(_reached(task, s) for s in states):
            return "never_reached_site"
    if t.ending is Ending.BUDGET:
        return "ran_out_of_steps"
    return "wrong_page_at_end"


def summarize(episodes: Sequence[Episode]) -> dict[str, Any]:
    """Success rate (Wilson 95% interval over usable episodes), mean length, failure kinds.

    Episodes cut by the infrastructure, and episodes with an unjudged step (the judge could
    not say whether the task was done), are left out of the denominator: neither is the
    agent's failure. ``unjudged`` counts the latter, ``unjudged_step_rate`` is the share of
    all steps that came back unjudged.
    """
    trajs = [e.trajectory for e in episodes]
    judged = [t for t in trajs if t.is_usable]
    unjudged = sum(1 for t in trajs if not t.is_infra_truncated and t.num_unjudged)
    steps = sum(len(t) for t in trajs)
    wins = sum(t.is_success for t in judged)
    n = len(judged)
    kinds = Counter(k for k in (failure_kind(e) for e in episodes) if k)
    return {
        "success_rate": wins / n if n else float("nan"),
        "ci95": list(wilson_interval(wins, n)),
        "episodes": len(trajs),
        "judged_episodes": n,
        "unjudged": unjudged,
        "unjudged_step_rate": sum(t.num_unjudged for t in trajs) / steps if steps else 0.0,
        "successes": wins,
        "mean_length": float(np.mean([len(t) for t in judged])) if judged else float("nan"),
        "mean_length_success": float(np.mean([len(t) for t in judged if t.is_success]))
        if wins else float("nan"),
        "failure_kinds": {k: kinds.get(k, 0) for k in FAILURE_KINDS},
    }


def evaluate(fleet, agent: BatchAgent, tasks: Sequence[Any], *, seed: int = 10_000,
             id_prefix: str = "eval", screens: ScreenTable | None = None,
             n_tasks: int | None = EVAL_TASKS) -> tuple[dict[str, Any], list[Episode]]:
    """Run each of the first ``n_tasks`` tasks once; return the summary and the episodes."""
    tasks = list(tasks)[:n_tasks] if n_tasks else list(tasks)
    episodes = fleet.collect(agent, tasks, screens if screens is not None else ScreenTable(),
                             id_prefix=id_prefix, source=Source.ONLINE, seed=seed)
    return summarize(episodes), episodes
