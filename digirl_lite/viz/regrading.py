"""Re-grade stored trajectories with another judge and compare the verdicts.

A judge is asked about every step again: the task, the stored screenshots before and after
the action (the judge's view, shrunk as recorded) and the history of action strings. Judges
that read the simulator's state (the oracle and the noisy oracle) also get it: the episode is
replayed in :class:`~digirl_lite.envs.sim.SimPhoneEnv` from its stored seed, action by
action, and every replayed screen is checked against the stored one, so a replay that
diverged (another drift day, other surprises) raises instead of grading the wrong screen.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from digirl_lite.data.records import Verdict

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.data.records import ScreenTable, Trajectory
    from digirl_lite.judge.base import Judge, JudgeResult

__all__ = ["ReplayMismatch", "replay_states", "regrade", "VerdictComparison",
           "compare_verdicts"]


class ReplayMismatch(RuntimeError):
    """The replayed episode showed another screen than the stored one."""


class _NeverDone:
    """The replay's judge: never success, so the replay runs every stored step (the stored
    episode ended where its own judge said so)."""

    def reset(self) -> None:
        pass

    def judge(self, task, prev, cur, *, history=None, state=None):
        from digirl_lite.judge.base import JudgeResult

        return JudgeResult(Verdict.FAILURE)


def _episode_seed(trajectory: Trajectory) -> int | None:
    # fleets store {"env": seed}; the pile generator {"pile": .., "episode": seed}
    s = trajectory.seeds
    return s.get("env", s.get("episode"))


def replay_states(trajectory: Trajectory, **env_kwargs: Any) -> list[Any]:
    """The simulator states s_0 .. s_T of a stored simulated trajectory.

    Args:
        trajectory: a trajectory recorded on :class:`SimPhoneEnv` (its ``seeds`` hold the
            episode seed).
        **env_kwargs: the environment's settings if not the defaults (``day``,
            ``surprises``), as the run used them; the horizon is the trajectory's.

    Raises:
        ReplayMismatch: a replayed screen differs from the stored one.
        ValueError: the trajectory has no episode seed.
    """
    from digirl_lite.envs.sim import SimPhoneEnv

    seed = _episode_seed(trajectory)
    if seed is None:
        raise ValueError(f"trajectory {trajectory.traj_id!r} stores no episode seed "
                         f"(seeds={dict(trajectory.seeds)}); it cannot be replayed")
    env = SimPhoneEnv([trajectory.task], judge=_NeverDone(), seed=seed,
                      **{"horizon": trajectory.horizon, **env_kwargs})
    try:
        obs, _ = env.reset(task=trajectory.task, seed=seed)
        states = [env.state]
        for h, step in enumerate(trajectory.steps):
            if obs.screen_id != step.screen_id:
                raise ReplayMismatch(f"{trajectory.traj_id}: step {h} was taken on screen "
                                     f"{step.screen_id}, the replay shows {obs.screen_id}")
            obs, *_ = env.step(step.action_text)
            states.append(env.state)
        last = trajectory.steps[-1].next_screen_id if trajectory.steps else None
        if last is not None and obs.screen_id != last:
            raise ReplayMismatch(f"{trajectory.traj_id}: the last screen was {last}, the "
                                 f"replay shows {obs.screen_id}")
    finally:
        env.close()
    return states


def _needs_state(judge: Any) -> bool:
    from digirl_lite.envs.sim.oracle import NoisyOracleJudge, OracleJudge

    inner = getattr(judge, "inner", judge)  # a GuardedJudge wraps the judge it guards
    return isinstance(inner, (OracleJudge, NoisyOracleJudge))


def regrade(trajectories: Sequence[Trajectory], screens: ScreenTable, judge: Judge | dict,
            *, replay: bool | None = None, **env_kwargs: Any) -> dict[str, list[JudgeResult]]:
    """Ask ``judge`` about every step of ``trajectories`` again.

    Args:
        trajectories: stored trajectories.
        screens: their screens (with images).
        judge: a judge, or a config for :func:`digirl_lite.envs.judges.make_judge`.
        replay: replay the simulator to give the judge its state (default: when the judge
            is an oracle, which needs it).
        **env_kwargs: environment settings for the replay (see :func:`replay_states`).

    Returns:
        One :class:`JudgeResult` per step, by trajectory id. A judge that raises gives an
        UNJUDGED result that carries the error, as the environments do.
    """
    from digirl_lite.envs.judges import make_judge
    from digirl_lite.judge.base import JudgeResult

    if isinstance(judge, dict):
        judge = make_judge(judge)
    if replay is None:
        replay = _needs_state(judge)
    out: dict[str, list[JudgeResult]] = {}
    for t in trajectories:
        states = replay_states(t, **env_kwargs) if replay else [None] * (len(t.steps) + 1)
        judge.reset()
        results, history = [], []
        for h, s in enumerate(t.steps):
            history.append(s.action_text)
            try:
                r = judge.judge(t.task, screens.image(s.screen_id), screens.image(s.next_screen_id),
                                history=list(history), state=states[h + 1])
            except Exception as e:  # a judge failure is unjudged, never a 0
                r = JudgeResult(Verdict.UNJUDGED, skipped=f"judge raised {type(e).__name__}: {e}")
            results.append(r)
        out[t.traj_id] = results
    return out


@dataclass
class VerdictComparison:
    """Stored verdicts against new ones.

    Attributes:
        steps: (stored, new) verdict pairs -> count, over every step.
        trajectories: (stored success, new success) -> count; a trajectory is a new success
            when any of its steps is judged success.
        disagreements: (traj_id, step, stored, new) for every step where they differ.
    """

    steps: Counter = field(default_factory=Counter)
    trajectories: Counter = field(default_factory=Counter)
    disagreements: list[tuple[str, int, str, str]] = field(default_factory=list)

    @property
    def step_agreement(self) -> float:
        n = sum(self.steps.values())
        return sum(v for (a, b), v in self.steps.items() if a == b) / n if n else float("nan")

    @property
    def trajectory_agreement(self) -> float:
        n = sum(self.trajectories.values())
        return (sum(v for (a, b), v in self.trajectories.items() if a == b) / n
                if n else float("nan"))

    def table(self) -> list[dict[str, Any]]:
        """Rows (stored, new, steps) of the step confusion table."""
        return [{"stored": a, "new": b, "steps": n} for (a, b), n in sorted(self.steps.items())]


def compare_verdicts(trajectories: Sequence[Trajectory],
                     regraded: dict[str, list[JudgeResult]]) -> VerdictComparison:
    """Compare each step's stored verdict (``"none"`` where no judge ran) with the new one."""
    cmp = VerdictComparison()
    for t in trajectories:
        new = regraded[t.traj_id]
        if len(new) != len(t.steps):
            raise ValueError(f"{t.traj_id}: {len(t.steps)} steps, {len(new)} new verdicts")
        for h, (s, r) in enumerate(zip(t.steps, new)):
            a = s.verdict.value if s.verdict is not None else "none"
            b = r.verdict.value
            cmp.steps[(a, b)] += 1
            if a != b:
                cmp.disagreements.append((t.traj_id, h, a, b))
        cmp.trajectories[(t.is_success, any(r.verdict is Verdict.SUCCESS for r in new))] += 1
    return cmp
