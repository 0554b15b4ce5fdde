"""Recording a set of scripted agents' episodes on one environment: what a world's pile and
demonstrations are made of (the simulator's: :mod:`digirl_lite.envs.sim.demos`), with the
counts its logs and notes report (:class:`PileStats`). No world is imported here: the
environment, its tasks and the agents are given.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from digirl_lite.data.records import ScreenTable, Source, Trajectory
from digirl_lite.envs.base import Env
from digirl_lite.rollout.episode import run_episode

__all__ = ["PileStats", "episode_seed", "record_episodes"]


@dataclass
class PileStats:
    """What a generated set holds (for logs and the issue notes)."""

    trajectories: int = 0
    steps: int = 0
    distinct_screens: int = 0
    success_rate: float = 0.0
    endings: dict[str, int] = field(default_factory=dict)
    surprises_seen: dict[str, int] = field(default_factory=dict)
    failures_after_surprise: int = 0
    failures_after_slip_only: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def episode_seed(seed: int, i: int) -> int:
    """The environment seed of episode ``i`` of a set recorded with ``seed``."""
    return (seed * 1_000_003 + i) % 2**31


def record_episodes(
    env: Env, tasks: Sequence[Any], n: int, seed: int, make_agent: Callable[[int], Any], *,
    kind: str, name: str, source: Source,
) -> tuple[list[Trajectory], ScreenTable, PileStats]:
    """``n`` episodes on ``env``, episode ``i`` by ``make_agent(i)`` on a task drawn from
    ``tasks`` (seeded by ``seed``), with id ``{kind}-{name}-s{seed}-{i:05d}`` and environment
    seed :func:`episode_seed`; the trajectories, their screens and what they hold. The
    surprises counted are those the environment reports in ``info["surprises"]``; the
    environment is left open."""
    rng = np.random.default_rng(seed)
    task_idx = rng.integers(0, len(tasks), size=n)
    screens = ScreenTable()
    trajs: list[Trajectory] = []
    stats = PileStats()
    seen: Counter[str] = Counter()
    for i, ti in enumerate(task_idx):
        agent = make_agent(i)
        events: list[str] = []
        es = episode_seed(seed, i)
        t = run_episode(
            env, agent, screens, traj_id=f"{kind}-{name}-s{seed}-{i:05d}",
            task=tasks[int(ti)], seed=es, source=source,
            seeds={"pile": seed, "episode": es},
            on_step=lambda info, ev=events: ev.extend(info.get("surprises", [])),
        )
        trajs.append(t)
        seen.update(events)
        if not t.is_success:
            if any(e in ("popup", "voice") for e in events):
                stats.failures_after_surprise += 1
            elif getattr(agent, "slip_steps", None):
                stats.failures_after_slip_only += 1
    stats.trajectories = len(trajs)
    stats.steps = sum(len(t) for t in trajs)
    stats.distinct_screens = len(screens)
    stats.success_rate = float(np.mean([t.is_success for t in trajs])) if trajs else 0.0
    stats.endings = dict(Counter(t.ending.value for t in trajs))
    stats.surprises_seen = dict(seen)
    return trajs, screens, stats
