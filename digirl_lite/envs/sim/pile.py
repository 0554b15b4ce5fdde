"""The stored pile and the demonstrations, regenerated deterministically from a seed.

* Demonstrations: the scripted expert on *clean* screens (no surprises), the data the
  starting policy copies (the AutoUI role: a copier of people, who rarely met pop-ups in
  their recordings).
* The pile: attempts of the :class:`Copier` (until the trainer's SFT policy replaces it) on
  the world with its surprises, scored by the oracle judge. Sizes as in the paper:
  Web Shopping 528 trajectories at H = 20, General 608 at H = 10 (spec section 7).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from digirl_lite.data.records import ScreenTable, Source, Trajectory
from digirl_lite.envs.sim.agents import DEFAULT_SLIP_RATE, Copier, ScriptedExpert
from digirl_lite.envs.sim.env import SimPhoneEnv
from digirl_lite.envs.sim.world import Surprises
from digirl_lite.rollout.episode import run_episode

__all__ = ["PILE_SIZES", "PileStats", "generate_pile", "generate_demos"]

PILE_SIZES = {"webshop": 528, "general": 608}
"""Off-to-on pile sizes of the paper (spec section 7)."""


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


def _episode_seed(seed: int, i: int) -> int:
    return (seed * 1_000_003 + i) % 2**31


def _run(
    kind: str, world: str, n: int, seed: int, make_agent, surprises: Surprises | None,
    day: int, source: Source,
) -> tuple[list[Trajectory], ScreenTable, PileStats]:
    env = SimPhoneEnv(world, seed=seed, day=day, surprises=surprises)
    rng = np.random.default_rng(seed)
    task_idx = rng.integers(0, len(env.tasks), size=n)
    screens = ScreenTable()
    trajs: list[Trajectory] = []
    stats = PileStats()
    seen: Counter[str] = Counter()
    for i, ti in enumerate(task_idx):
        agent = make_agent(i)
        events: list[str] = []
        es = _episode_seed(seed, i)
        t = run_episode(
            env, agent, screens, traj_id=f"{kind}-{world}-s{seed}-{i:05d}",
            task=env.tasks[int(ti)], seed=es, source=source,
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
    env.close()
    stats.trajectories = len(trajs)
    stats.steps = sum(len(t) for t in trajs)
    stats.distinct_screens = len(screens)
    stats.success_rate = float(np.mean([t.is_success for t in trajs])) if trajs else 0.0
    stats.endings = dict(Counter(t.ending.value for t in trajs))
    stats.surprises_seen = dict(seen)
    return trajs, screens, stats


def generate_pile(
    world: str = "webshop", n: int | None = None, seed: int = 0,
    slip_rate: float = DEFAULT_SLIP_RATE, day: int = 1, surprises: Surprises | None = None,
) -> tuple[list[Trajectory], ScreenTable, PileStats]:
    """The copier's attempts on ``world``'s train tasks (default surprises), oracle-scored."""
    n = PILE_SIZES[world] if n is None else n
    return _run("pile", world, n, seed,
                lambda i: Copier(slip_rate=slip_rate, seed=_episode_seed(seed + 7, i)),
                surprises, day, Source.OFFLINE)


def generate_demos(
    world: str = "webshop", n: int = 400, seed: int = 0, day: int = 1,
    surprise_rate: float = 0.0,
) -> tuple[list[Trajectory], ScreenTable, PileStats]:
    """The expert's demonstrations on ``world``'s train tasks: clean (no surprises) by
    default; ``surprise_rate`` scales the default surprise probabilities (0.1: a tenth of
    them), so a few demonstrations show how the expert closes a pop-up or voice input."""
    return _run("demo", world, n, seed, lambda i: ScriptedExpert(),
                Surprises().scaled(surprise_rate), day, Source.OFFLINE)
