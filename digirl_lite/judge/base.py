"""The judge interface (spec/DIGIRL.md section 4).

A judge looks at a task, the previous and the current screenshot (and, if it wants, the
history) and returns a :class:`JudgeResult`: success, failure, or *unjudged* (no call was
possible, or the reply could not be read). An unjudged step is never a silent reward of 0:
trajectories that carry one are marked and, by default, kept out of training.

Judges hold per-device state (the reference code's change and seen-recently guards), so
each environment owns its own judge object; :meth:`Judge.reset` starts a new episode.
The oracles are in :mod:`digirl_lite.judge.oracle`; a judge from a config:
:func:`digirl_lite.envs.judges.make_judge`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from digirl_lite.data.records import Verdict

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

__all__ = ["JudgeResult", "Judge"]


@dataclass(frozen=True)
class JudgeResult:
    """One verdict and what it cost.

    Attributes:
        verdict: success / failure / unjudged.
        reply: the judge's reply text (None for judges that do not write one).
        skipped: why no call was made (a guard fired), else None.
        calls: API calls made (retries included).
        tokens: tokens billed, where the backend reports them.
        latency_s: wall-clock seconds spent.
    """

    verdict: Verdict
    reply: str | None = None
    skipped: str | None = None
    calls: int = 0
    tokens: int | None = None
    latency_s: float = 0.0

    @property
    def reward(self) -> float:
        """1 for success, else 0. Check ``verdict`` for UNJUDGED before using it as a label."""
        return 1.0 if self.verdict is Verdict.SUCCESS else 0.0


@runtime_checkable
class Judge(Protocol):
    """What an environment calls after every step."""

    def judge(
        self, task: str, prev: Image.Image | None, cur: Image.Image, *,
        history: list[str] | None = None, state: Any = None,
    ) -> JudgeResult: ...

    def reset(self) -> None: ...

