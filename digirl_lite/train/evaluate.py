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

__all__ = ["FAILURE_KINDS", "INVALID_SHARE", "MIN_JUDGED_SHARE", "failure_kind",
           "invalid_steps", "evaluate", "summarize", "ground_truth", "stage_rates",
           "split_rate", "truth_or_judged", "recovery_stats", "failure_causes"]

FAILURE_KINDS = ("never_reached_site", "wrong_page_at_end", "ran_out_of_steps",
                 "infrastructure", "unjudged", "invalid_actions")
"""Every kind :func:`failure_kind` returns; new kinds are added at the end, so readers of
older summaries find the keys they know ("invalid_actions" came with issue 16)."""
EVAL_TASKS = 96
INVALID_SHARE = 0.25
"""An episode the step budget ended is an "invalid_actions" failure when at least this share
of its steps wrote a string that does not parse (each an idle step, ``digirl_lite.actions``).
Measured on the shipped starting policy, Web Shopping, 96 held-out tasks, seed 0 (issue 16):
all 35 failures had INVALID steps (15-60% of their steps), 26 of them at least a quarter and
11 at least half; 16 of the 61 successes had some too (at most 33%). A quarter (5 of H = 20
steps, half of a typical successful episode) marks the episodes whose budget went largely to
unparseable strings; "any" would mark every failure, half only a third of them."""


def failure_kind(episode: Episode) -> str | None:
    """None for a success; else one of :data:`FAILURE_KINDS`.

    Infrastructure first (not the agent's fault), then "unjudged" (the judge could not
    answer on some step: not the agent's fault either); then "invalid actions" (the budget
    ended it and at least :data:`INVALID_SHARE` of its steps did not parse: the policy wrote
    noise, whatever page it was on); then "never reached the site" (the first milestone never
    appeared: the environment's answer, :attr:`Episode.reached_first_milestone`; where it
    cannot tell, as on a real device, the kind falls to the next); then "ran out of steps"
    (the budget ended it); else the agent stopped on the wrong page.
    """
    t = episode.trajectory
    if t.is_success:
        return None
    if t.ending is Ending.INFRA:
        return "infrastructure"
    if t.num_unjudged:
        return "unjudged"
    if t.ending is Ending.BUDGET and invalid_steps(t) >= INVALID_SHARE * len(t):
        return "invalid_actions"
    if episode.reached_first_milestone is False:  # None: the environment cannot tell
        return "never_reached_site"
    if t.ending is Ending.BUDGET:
        return "ran_out_of_steps"
    return "wrong_page_at_end"


def invalid_steps(trajectory) -> int:
    """How many steps of ``trajectory`` wrote a string that does not parse (INVALID)."""
    return sum(not s.action.is_valid for s in trajectory.steps)


MIN_JUDGED_SHARE = 0.9
"""An evaluation where fewer than this share of its tasks were judged is incomplete (see
:func:`summarize`; the config's ``min_judged_share``)."""


def ground_truth(trajectories: Sequence[Any]) -> dict[str, Any]:
    """The environment's truth beside the judge's verdicts (issue 32).

    ``truth``: ``"environment"`` when some episode carries the environment's own check
    (:attr:`Trajectory.true_success`), else ``"none"`` (a real device: the judge's rate is
    all there is, and the other keys are NaN or None). ``true_success_rate`` (Wilson
    ``true_ci95``): true successes over the episodes with a truth, infrastructure
    truncations left out (they ended on no one's account) and unjudged episodes kept (the
    truth does not need the judge). ``judge_agreement``: over the episodes with both a
    verdict (usable: no unjudged step) and a truth, the confusion matrix
    ``{"judged_success": {"true_success": TP, "true_failure": FP}, "judged_failure":
    {"true_success": FN, "true_failure": TN}}``, its ``episodes`` and ``accuracy``
    ((TP + TN) / episodes); None without a truth.
    """
    truthful = [t for t in trajectories
                if not t.is_infra_truncated and t.true_success is not None]
    k = sum(bool(t.true_success) for t in truthful)
    n = len(truthful)
    both = [t for t in truthful if t.is_usable]
    cells = Counter((t.is_success, bool(t.true_success)) for t in both)
    agreement = None
    if both:
        agreement = {
            "judged_success": {"true_success": cells[True, True],
                               "true_failure": cells[True, False]},
            "judged_failure": {"true_success": cells[False, True],
                               "true_failure": cells[False, False]},
            "episodes": len(both),
            "accuracy": (cells[True, True] + cells[False, False]) / len(both),
        }
    return {"truth": "environment" if truthful else "none",
            "true_success_rate": k / n if n else float("nan"),
            "true_ci95": list(wilson_interval(k, n)),
            "true_successes": k, "true_episodes": n,
            "judge_agreement": agreement}


def stage_rates(report: dict[str, Any]) -> str:
    """The stage line's success: ``success 62.5% (judge) | 60.4% (true)``, or ``success
    62.5% (judge; no ground truth)`` where the environment has no check."""
    judged = f"success {100 * report['success_rate']:.1f}% (judge"
    if report.get("truth") != "environment":
        return judged + "; no ground truth)"
    return f"{judged}) | {100 * report['true_success_rate']:.1f}% (true)"


def truth_or_judged(report: dict[str, Any]) -> float:
    """The rate held-out splits are compared with the test list by (issue 32 item 5): the
    environment's true rate where the report has one, else the judged rate."""
    if report.get("truth") == "environment":
        return report["true_success_rate"]
    return report["success_rate"]


def split_rate(report: dict[str, Any]) -> str:
    """A held-out split's success in the stage line: ``40.0%`` (the true rate where the
    environment has one, :func:`truth_or_judged`), ``40.0% (judge)`` where it has none,
    ``incomplete`` where too few of its tasks were judged."""
    if not report.get("complete", True):
        return "incomplete"
    judge = "" if report.get("truth") == "environment" else " (judge)"
    return f"{100 * truth_or_judged(report):.1f}%{judge}"


def recovery_stats(episodes: Sequence[Episode]) -> dict[str, Any]:
    """Issue 47's mechanism, from the environment's ground truth (``Episode.recoveries``):
    ``success_with_recovery``, the share of the (truly) successful episodes that took a
    way back (a pop-up closed, voice input left, a BACK from a wrong page), their count and
    ``recoveries`` by kind over all episodes. Empty where the environment reports none (a
    real device)."""
    told = [e for e in episodes if e.recoveries is not None
            and not e.trajectory.is_infra_truncated]
    if not told:
        return {}
    wins = [e for e in told if (e.trajectory.true_success if e.trajectory.true_success
                                is not None else e.trajectory.is_success)]
    back = sum(1 for e in wins if e.recoveries)
    return {"success_with_recovery": round(back / len(wins), 4) if wins else None,
            "successes_with_recovery": back, "true_successes": len(wins),
            "recoveries": dict(Counter(k for e in told for k in e.recoveries))}


def failure_causes(episodes: Sequence[Episode]) -> dict[str, int]:
    """Why the failed episodes failed, where the environment can tell
    (``Episode.failure_cause``, the simulator's ground truth: a pop-up not closed, voice
    input not left, mistyped text, the wrong result, ...); empty elsewhere."""
    return dict(Counter(e.failure_cause for e in episodes if e.failure_cause
                        and not e.trajectory.is_infra_truncated))


def summarize(episodes: Sequence[Episode],
              min_judged_share: float = MIN_JUDGED_SHARE) -> dict[str, Any]:
    """Success rate (Wilson 95% interval over usable episodes), mean length, failure kinds.

    Episodes cut by the infrastructure, and episodes with an unjudged step (the judge could
    not say whether the task was done), are left out of the denominator: neither is the
    agent's failure. ``unjudged`` counts the latter, ``unjudged_step_rate`` is the share of
    all steps that came back unjudged; ``invalid_step_rate`` the share of all steps whose
    action string did not parse (INVALID: an idle step, ``digirl_lite.actions``).

    Every task is either judged (``judged_episodes``) or listed in ``not_evaluated`` (its
    trajectory id, task and why: the fault that ended its last attempt, or "unjudged");
    ``complete`` is False when the judged share ``judged_share`` is below
    ``min_judged_share``: the stage's rate then speaks for too few of its tasks, and tables
    print "incomplete" instead of it (issue 29).
    """
    trajs = [e.trajectory for e in episodes]
    judged = [t for t in trajs if t.is_usable]
    unjudged = sum(1 for t in trajs if not t.is_infra_truncated and t.num_unjudged)
    steps = sum(len(t) for t in trajs)
    wins = sum(t.is_success for t in judged)
    n = len(judged)
    kinds = Counter(k for k in (failure_kind(e) for e in episodes) if k)
    n_both = n + unjudged  # the unjudged as failures: every episode not cut by infrastructure
    return {
        "success_rate": wins / n if n else float("nan"),
        "ci95": list(wilson_interval(wins, n)),
        "episodes": len(trajs),
        "judged_episodes": n,
        "unjudged": unjudged,
        "unjudged_step_rate": sum(t.num_unjudged for t in trajs) / steps if steps else 0.0,
        "invalid_step_rate": sum(invalid_steps(t) for t in trajs) / steps if steps else 0.0,
        "successes": wins,
        "success_rate_unjudged_as_failures": wins / n_both if n_both else float("nan"),
        "ci95_unjudged_as_failures": list(wilson_interval(wins, n_both)),
        **ground_truth(trajs),
        "mean_length": float(np.mean([len(t) for t in judged])) if judged else float("nan"),
        "mean_length_success": float(np.mean([len(t) for t in judged if t.is_success]))
        if wins else float("nan"),
        "failure_kinds": {k: kinds.get(k, 0) for k in FAILURE_KINDS},
        "failure_causes": failure_causes(episodes),
        **recovery_stats(episodes),
        "judged_share": n / len(trajs) if trajs else float("nan"),
        "complete": bool(trajs) and n >= min_judged_share * len(trajs),
        "not_evaluated": [{"traj_id": t.traj_id, "task": t.task,
                           "why": t.truncation_reason if t.is_infra_truncated else "unjudged"}
                          for t in trajs if not t.is_usable],
    }


def evaluate(fleet, agent: BatchAgent, tasks: Sequence[Any], *, seed: int = 10_000,
             id_prefix: str = "eval", screens: ScreenTable | None = None,
             n_tasks: int | None = EVAL_TASKS,
             min_judged_share: float = MIN_JUDGED_SHARE
             ) -> tuple[dict[str, Any], list[Episode]]:
    """Run each of the first ``n_tasks`` tasks once; return the summary and the episodes.

    An episode with an unjudged step is run again (the fleet's ``retry_unjudged``, within
    its ``max_task_attempts``) like one an infrastructure fault cut short: the judge, not
    the agent, left it without a verdict, and dropping it would drop the long episodes
    (failures) more often than the short ones. What still has no verdict after the last
    attempt is listed in ``not_evaluated``."""
    tasks = list(tasks)[:n_tasks] if n_tasks else list(tasks)
    episodes = fleet.collect(agent, tasks, screens if screens is not None else ScreenTable(),
                             id_prefix=id_prefix, source=Source.ONLINE, seed=seed,
                             retry_unjudged=True)
    return summarize(episodes, min_judged_share), episodes
