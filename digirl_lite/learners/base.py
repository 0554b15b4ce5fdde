"""What every learner is: the interface between the Trainer's loop and an update rule."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch

    from digirl_lite.data.records import Trajectory

__all__ = ["Learner"]


class Learner:
    """One algorithm's updates, on a run's state.

    What it needs from the run (``run``: the :class:`~digirl_lite.train.Trainer`): its
    ``cfg``, ``policy`` and ``actor_opt`` (the actor's optimiser, built from
    :meth:`actor_param_groups`), ``screens`` (the trajectories' screens, with features),
    ``buffer`` (the replay buffer), ``rng`` (minibatch draws), ``text`` and the two critics
    (DigiRL's), ``accelerator``, ``out`` and ``is_main``, and ``_iter`` (a progress bar) and
    ``_timed`` (a timed phase: ``critics``, ``filter``, ``actor`` of an iteration's
    ``time_split``). The run's attributes are read at each use: a resumed run replaces its
    policy, optimiser and random stream.

    What it does: :meth:`offline` on the pile (the offline phase) and :meth:`update` on an
    online iteration's data; each returns the fields metrics.jsonl logs for the phase
    (``actor_loss`` among them).
    """

    name = ""
    on_policy = False
    """Whether :meth:`update` trains on the iteration's own trajectories (PPO, GRPO) rather
    than on the replay buffer."""
    offline_work = "critics and actor"
    """What :meth:`offline` trains, for the run's one line about the offline phase."""

    def __init__(self, run) -> None:
        self.run = run

    @property
    def cfg(self) -> Any:
        """The run's :class:`~digirl_lite.train.config.DigiRLConfig` (not imported here: the
        learners sit below the Trainer, tests/test_layers.py)."""
        return self.run.cfg

    @property
    def policy(self):
        return self.run.policy

    @property
    def rng(self) -> np.random.Generator:
        return self.run.rng

    def actor_param_groups(self) -> list[dict[str, Any]]:
        """The actor optimiser's parameter groups (at the run's actor learning rate unless a
        group says)."""
        return [{"params": list(self.policy.parameters())}]

    def make_actor_optimizer(self) -> torch.optim.Optimizer:
        """AdamW over :meth:`actor_param_groups` at ``cfg.actor_learning_rate`` (``actor_lr``,
        or the algorithm's own)."""
        import torch

        return torch.optim.AdamW(self.actor_param_groups(), lr=self.cfg.actor_learning_rate)

    def offline(self, pile: Sequence[Trajectory]) -> dict[str, Any]:
        """The offline phase on ``pile`` (the buffer's training split of it)."""
        raise NotImplementedError

    def update(self, collected: Sequence[Trajectory]) -> dict[str, Any]:
        """An online iteration's update: ``collected`` is what it collected (already in the
        buffer)."""
        raise NotImplementedError
