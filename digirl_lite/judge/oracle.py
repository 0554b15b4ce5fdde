"""The oracle judges: exact (:class:`OracleJudge`), the environment's own check
(:class:`EnvJudge`) and noisy (:class:`NoisyOracleJudge`).

They read an environment's state that can check a task itself (:class:`CheckableState`:
the simulated phone's :class:`~digirl_lite.envs.sim.state.PhoneState`), not screenshots, so
they import no environment; :func:`~digirl_lite.envs.judges.make_judge` builds them from a
config. Their old home, ``digirl_lite.envs.sim.oracle``, re-exports them.
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol, runtime_checkable

from digirl_lite.data.records import Verdict
from digirl_lite.judge.base import JudgeResult

__all__ = ["CheckableState", "OracleJudge", "EnvJudge", "NoisyOracleJudge"]


@runtime_checkable
class CheckableState(Protocol):
    """An environment's state that knows whether a task is done in it (the simulated
    phone's :class:`~digirl_lite.envs.sim.state.PhoneState`)."""

    def task_succeeded(self, task: Any) -> bool:
        """Whether ``task`` (the environment's task object or its instruction) is done."""
        ...


class OracleJudge:
    """The simulator's ground truth: reads the task's success predicate on the state.

    It sees the simulator's state, not the screenshots, so it is exact and free. Other
    environments have no state to give it: it then raises, naming what it needs.
    """

    def reset(self) -> None:
        pass

    def judge(self, task, prev, cur, *, history=None, state=None) -> JudgeResult:
        if not isinstance(state, CheckableState):
            raise TypeError("OracleJudge needs the simulator's state (state=PhoneState); "
                            "use a VLM judge for other environments")
        ok = bool(state.task_succeeded(task))
        return JudgeResult(Verdict.SUCCESS if ok else Verdict.FAILURE,
                           reply="Status: success" if ok else "Status: failure")


class EnvJudge(OracleJudge):
    """The environment's own verdict (``{"judge": "env"}``), as AndroidWorld's tasks check
    the device's state: the simulator's ground truth in this process (what
    :class:`OracleJudge` reads), and on a device over Appium the device's success check
    (``digirl: isSuccess`` of a served simulated phone;
    :class:`~digirl_lite.envs.android.AndroidEnv` asks the device instead of calling
    :meth:`judge`). Real phones have no such check: asking for it there is a
    :class:`~digirl_lite.errors.ConfigError` before any collection."""


class NoisyOracleJudge:
    """The oracle with errors, to study what judge mistakes do to learning.

    Each (task, screen) gets one fixed draw, as a VLM at temperature 0 answers the same
    screen the same way: a true failure is called success with ``false_success_rate``, a
    true success is called failure with ``false_failure_rate``. The paper's judge erred on
    2.8% of trajectories on average; per step the errors compound over a trajectory's
    screens (see the judge issue's note for the measured trajectory-level rates).
    """

    def __init__(self, false_success_rate: float = 0.028, false_failure_rate: float = 0.028,
                 seed: int = 0) -> None:
        for name, p in (("false_success_rate", false_success_rate),
                        ("false_failure_rate", false_failure_rate)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {p}")
        self.false_success_rate = false_success_rate
        self.false_failure_rate = false_failure_rate
        self.seed = seed
        self._oracle = OracleJudge()
        self.flips = 0

    def reset(self) -> None:
        pass

    def config(self) -> dict:
        return {"judge": "noisy_oracle", "false_success_rate": self.false_success_rate,
                "false_failure_rate": self.false_failure_rate, "seed": self.seed}

    def judge(self, task, prev, cur, *, history=None, state=None) -> JudgeResult:
        truth = self._oracle.judge(task, prev, cur, state=state).verdict
        task_text = getattr(task, "text", task)
        h = hashlib.blake2b(repr((self.seed, task_text, state)).encode(), digest_size=8)
        u = int.from_bytes(h.digest(), "big") / 2.0**64
        p = self.false_failure_rate if truth is Verdict.SUCCESS else self.false_success_rate
        verdict = truth
        if u < p:
            verdict = Verdict.FAILURE if truth is Verdict.SUCCESS else Verdict.SUCCESS
            self.flips += 1
        return JudgeResult(verdict, reply=f"Status: {verdict.value}")
