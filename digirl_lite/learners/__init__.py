"""The learners: what each algorithm does with the pile (the offline phase) and with an online
iteration's data, one file each, behind :class:`~digirl_lite.learners.base.Learner`.

The :class:`~digirl_lite.train.Trainer` is the loop (starting policy, pile, offline phase,
online iterations, evaluations, checkpoints); its learner is the update:

- :mod:`~digirl_lite.learners.digirl`: DigiRL's filtered imitation (both critics, Eq. 4.4's
  instruction filter, Eq. 4.3's step filter, Eq. 4.2's maximum likelihood);
- :mod:`~digirl_lite.learners.filtered_bc`: the paper's baseline (every success, no critics);
- :mod:`~digirl_lite.learners.awr`: Eq. 4.1's ablation (every step, weighted);
- :mod:`~digirl_lite.learners.ppo`: Darwin's token-level PPO with GAE and a value head;
- :mod:`~digirl_lite.learners.grpo`: GRPO (group-standardised rewards, no value head).

A new learner is one new file: a :class:`Learner` subclass, named in :data:`LEARNERS`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.learners.base import Learner

__all__ = ["LEARNERS", "make_learner"]

LEARNERS = {"digirl": "digirl_lite.learners.digirl:DigiRL",
            "filtered_bc": "digirl_lite.learners.filtered_bc:FilteredBC",
            "awr": "digirl_lite.learners.awr:AWR",
            "ppo": "digirl_lite.learners.ppo:PPO",
            "grpo": "digirl_lite.learners.grpo:GRPO"}
"""``algorithm`` -> ``module:class`` of its learner."""


def make_learner(run) -> Learner:
    """The learner of ``run.cfg.algorithm`` for the run ``run`` (a Trainer)."""
    try:
        module, name = LEARNERS[run.cfg.algorithm].split(":")
    except KeyError:
        raise ValueError(f"algorithm {run.cfg.algorithm!r} has no learner; known: "
                         f"{sorted(LEARNERS)}") from None
    return getattr(import_module(module), name)(run)
