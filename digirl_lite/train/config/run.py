"""The run: its task set, seed, algorithm, judge, budget and where it runs.

Where a default departs from the paper, ``docs/config.md`` says why and what it measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from digirl_lite.learners import learner_class

__all__ = ["RunConfig", "WORLDS"]

WORLDS = ("general", "webshop")
"""The simulated worlds (AitW's General and Web Shopping subsets): ``DigiRLConfig.world``."""


@dataclass
class RunConfig:
    """What the run is: task set, seed, algorithm, judge, budget, device."""

    world: str = "webshop"
    """Simulated task set: "webshop" (H = 20) or "general" (H = 10)."""
    seed: int = 0
    """Seeds everything: task draws, environments, sampling, initialisation."""
    algorithm: str = "digirl"
    """The learner (:mod:`digirl_lite.learners`): "digirl" (the paper), "filtered_bc",
    "awr", "ppo" or "grpo"; docs/learners.md."""
    judge: dict[str, Any] = field(default_factory=lambda: {"judge": "oracle"})
    """Judge config (digirl_lite.envs.judges.make_judge); default: the simulator's oracle."""
    device: str = "cpu"
    """Where the learner runs, through Accelerate: "cpu", "auto" (a GPU when there is one),
    or "cuda". Under ``accelerate launch`` each process takes its own device."""
    tensorboard: bool = False
    """Also write the metrics as TensorBoard scalars to ``OUT/tensorboard`` (``tensorboard``
    extra)."""
    task_file: str | None = None
    """Train task list (one instruction per line); None: the shipped list of ``world``."""
    test_task_file: str | None = None
    """Held-out task list; None: the shipped test list of ``world``."""
    horizon: int | None = None
    """Steps per episode; None: the world's (Web Shopping 20, General 10)."""
    pile_size: int = 528
    """Off-to-on pile (paper: Web Shopping 528, General 608): the starting policy's own
    attempts on train tasks, scored by the judge."""
    offline_critic_updates: int = 200
    """Critic updates on the pile (each critic), before the actor."""
    offline_actor_updates: int = 200
    """Actor updates on the pile's successful trajectories (spec: offline uses them all)."""
    iterations: int = 30
    """Online iterations (paper: 60 iterations = 960 trajectories)."""
    rollouts_per_iteration: int = 16
    """Trajectories collected per iteration (paper: 16), at ``temperature``."""
    capacity: int = 5000
    """Replay buffer size in trajectories (paper: 5,000)."""
    max_unjudged_steps: int = 50
    """Stop the run (with a checkpoint) after this many unjudged steps in a row: a judge that
    cannot answer makes unusable data at full cost. 0: never stop."""
    max_unjudged_s: float = 120.0
    """Stop the run the same way when no step was judged for this many seconds of a
    collection (whichever limit comes first). 0: no time limit."""


def check(cfg: Any) -> None:
    """The run's fields of ``cfg`` (a :class:`~digirl_lite.train.config.DigiRLConfig`)."""
    if cfg.world not in WORLDS:
        raise ValueError(f"world must be 'webshop' or 'general', got {cfg.world!r}")
    learner_class(cfg.algorithm)  # ConfigError: the known algorithms
    if cfg.device not in ("cpu", "auto", "cuda") and not cfg.device.startswith("cuda:"):
        raise ValueError(f"device must be 'cpu', 'auto' or 'cuda', got {cfg.device!r}")
    for f in ("rollouts_per_iteration", "capacity"):
        if getattr(cfg, f) <= 0:
            raise ValueError(f"{f} must be positive")
    if cfg.max_unjudged_steps < 0:
        raise ValueError("max_unjudged_steps must be >= 0 (0: never stop)")
    if cfg.max_unjudged_s < 0:
        raise ValueError("max_unjudged_s must be >= 0 (0: no time limit)")
