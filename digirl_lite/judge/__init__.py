"""Judges: the interface, the paper's VLM evaluator and its backends, the guards,
calibration against labels, and the oracles (exact, the environment's own check, noisy:
:mod:`.oracle`, which read a state that checks its own task).

The factory that builds any judge from a config, :func:`~digirl_lite.envs.judges.make_judge`
/ ``check_judge``, is in :mod:`digirl_lite.envs`: this package imports no environment.

Backends import their clients (``google-genai``, ``openai``: the ``judge`` extra) only when
used.
"""

from digirl_lite.judge.backends import (
    Backend,
    BackendError,
    BackendReply,
    GeminiBackend,
    OpenAIBackend,
)
from digirl_lite.judge.base import Judge, JudgeResult
from digirl_lite.judge.calibration import calibrate, wilson_interval
from digirl_lite.judge.guards import (
    MSE_THRESHOLD,
    GuardedJudge,
    ScreenGuards,
    is_blank,
    screen_mse,
    shrink,
)
from digirl_lite.judge.oracle import CheckableState, EnvJudge, NoisyOracleJudge, OracleJudge
from digirl_lite.judge.paper import FewShotExample, FewShotSet, PaperJudge, parse_status

__all__ = [
    "Backend", "BackendError", "BackendReply", "GeminiBackend", "OpenAIBackend",
    "Judge", "JudgeResult", "calibrate", "wilson_interval",
    "MSE_THRESHOLD", "GuardedJudge", "ScreenGuards", "is_blank", "screen_mse", "shrink",
    "FewShotExample", "FewShotSet", "PaperJudge", "parse_status",
    "CheckableState", "OracleJudge", "EnvJudge", "NoisyOracleJudge",
]
