"""Look at what the agent did: actions drawn on screenshots, filmstrips with the critics'
grades, learning curves, run folders, and re-grading with another judge (issue 8).

- :func:`draw_action` (``draw.py``): a dot for a tap, an arrow for a swipe, a label for keys
  and typed text, placed through :func:`digirl_lite.actions.to_gesture` ([y, x] read once).
- :class:`Run` (``runs.py``): a Trainer's run folder (metrics, summary, stored evaluation
  episodes, checkpoints).
- :class:`Grader` (``grades.py``): both critics' values, Eq. 4.4 and Eq. 4.3, and what the
  filters would keep, from a run's checkpoint; :class:`OnPolicyGrader` for PPO and GRPO
  runs: the value head's values, GAE advantages and returns, recorded log-probabilities.
- :func:`filmstrip`, :func:`trajectory_html`, :func:`replay` (``film.py``): a trajectory
  frame by frame, as one image or as HTML cards (Jupyter and :mod:`digirl_lite.report`).
- :func:`plot_learning_curves`, :func:`plot_seed_bands`, :func:`plot_training_metrics`
  (``curves.py``).
- :func:`regrade`, :func:`compare_verdicts` (``regrading.py``): ask another judge, compare.

``import digirl_lite.viz`` is light: Pillow, matplotlib and torch load on first use.
"""

from __future__ import annotations

from digirl_lite._lazy import lazy_exports

_EXPORTS = {
    "ACTION_COLOR": "draw",
    "action_label": "draw",
    "draw_action": "draw",
    "thumbnail": "draw",
    "EvalPoint": "runs",
    "Run": "runs",
    "load_runs": "runs",
    "Grader": "grades",
    "TrajectoryGrade": "grades",
    "OnPolicyGrader": "grades",
    "OnPolicyGrade": "grades",
    "grade_rows": "grades",
    "StepView": "film",
    "step_views": "film",
    "replay": "film",
    "filmstrip": "film",
    "trajectory_html": "film",
    "image_data_uri": "film",
    "curve_rows": "curves",
    "final_success": "curves",
    "mean_ci95": "curves",
    "plot_learning_curves": "curves",
    "plot_seed_bands": "curves",
    "plot_training_metrics": "curves",
    "ReplayMismatch": "regrading",
    "replay_states": "regrading",
    "regrade": "regrading",
    "VerdictComparison": "regrading",
    "compare_verdicts": "regrading",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
