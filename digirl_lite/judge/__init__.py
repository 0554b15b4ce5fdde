"""Judges: the interface, the paper's VLM evaluator and its backends, the simulator's oracle
(exact and noisy), the guards, and calibration against labels.

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
from digirl_lite.judge.base import EnvJudge, Judge, JudgeResult, NoisyOracleJudge, OracleJudge
from digirl_lite.judge.calibration import calibrate, wilson_interval
from digirl_lite.judge.factory import check_judge, make_judge
from digirl_lite.judge.guards import (
    MSE_THRESHOLD,
    GuardedJudge,
    ScreenGuards,
    is_blank,
    screen_mse,
    shrink,
)
from digirl_lite.judge.paper import FewShotExample, FewShotSet, PaperJudge, parse_status

__all__ = [
    "Backend", "BackendError", "BackendReply", "GeminiBackend", "OpenAIBackend",
    "EnvJudge", "Judge", "JudgeResult", "NoisyOracleJudge", "OracleJudge",
    "calibrate", "wilson_interval", "check_judge", "make_judge",
    "MSE_THRESHOLD", "GuardedJudge", "ScreenGuards", "is_blank", "screen_mse", "shrink",
    "FewShotExample", "FewShotSet", "PaperJudge", "parse_status",
]
