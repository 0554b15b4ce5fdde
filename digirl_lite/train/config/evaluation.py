"""The evaluations: the held-out test list, the learning curve, the held-out splits, and the
judge they are scored by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from digirl_lite.errors import ConfigError

__all__ = ["EvaluationConfig", "EVAL_ONLY"]

EVAL_ONLY = ("eval_splits", "eval_split_tasks")
"""Fields that add evaluations beside the run's and change none of its numbers (each
evaluation samples from a random stream of its own): left out when two runs are compared
(:func:`~digirl_lite.train.config.effective_fields`), so a run saved before them resumes
under a preset that sets them."""


@dataclass
class EvaluationConfig:
    """What is evaluated when, and by which judge."""

    eval_judge: dict[str, Any] | None = None
    """The evaluations' judge (env "sim": a second set of simulated phones); None: the run's
    ``judge``. ``{"judge": "oracle"}`` measures a noisy-judge run on ground truth."""
    eval_tasks: int = 96
    """First 96 tasks of the test list (paper)."""
    eval_every: int = 0
    """Evaluate every N iterations for the learning curve (0: only at stage ends)."""
    eval_splits: tuple[str, ...] = ()
    """Held-out splits evaluated beside the test list at the stage ends: split names
    (``tasks/<world>_<name>.txt``) or task file paths; evaluations only (:data:`EVAL_ONLY`)."""
    eval_split_tasks: int = 48
    """First N tasks of each of ``eval_splits`` (half the test list's 96)."""
    min_judged_share: float = 0.9
    """An evaluation with fewer of its tasks judged than this share is reported as
    "incomplete" instead of its rate."""


def check(cfg: Any) -> None:
    """The evaluations' fields of ``cfg`` (a :class:`~digirl_lite.train.config.DigiRLConfig`)."""
    for f in ("eval_tasks", "eval_split_tasks"):
        if getattr(cfg, f) <= 0:
            raise ValueError(f"{f} must be positive")
    _check_splits(cfg)
    if cfg.eval_judge is not None and cfg.env != "sim":
        raise ConfigError(f"eval_judge: an evaluation judge of its own needs env 'sim' (a "
                          f"second set of simulated phones), not env={cfg.env!r}; leave "
                          "it null to evaluate with the run's judge")
    if not 0.0 <= cfg.min_judged_share <= 1.0:
        raise ValueError(f"min_judged_share must be in [0, 1], got {cfg.min_judged_share}")


def _check_splits(cfg: Any) -> None:
    """``eval_splits``: names or paths, each reported under a name of its own (their files
    are checked by :meth:`~digirl_lite.train.config.DigiRLConfig.check_paths`)."""
    if not all(isinstance(s, str) and s for s in cfg.eval_splits):
        raise ValueError(f"eval_splits must be split names or task file paths, got "
                         f"{cfg.eval_splits!r}")
    from digirl_lite.envs.setup import split_name

    names = [split_name(cfg, s) for s in cfg.eval_splits]
    if len(set(names)) < len(names):
        raise ValueError(f"eval_splits: two splits would be reported under one name "
                         f"({', '.join(names)}); rename a file")
