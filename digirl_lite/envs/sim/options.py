"""What a run's config may name of the simulated phone, as the simulator declares it.

The env factory hands it to the config (:func:`digirl_lite.envs.setup.sim_options`), so the
config checks its simulator fields (``train_phrasings``, ``sim_layout``, ``sim_surprises``,
``sim_faults``) without importing the simulator itself.
"""

from __future__ import annotations

from dataclasses import fields

from digirl_lite.envs.base import SimOptions
from digirl_lite.envs.sim.env import Faults
from digirl_lite.envs.sim.phrasings import TRAIN_PHRASING_SETS
from digirl_lite.envs.sim.state import LAYOUTS, Surprises

__all__ = ["options"]


def _check_faults(faults: dict[str, float]) -> None:
    Faults(**faults)  # TypeError / ValueError on a value the simulator refuses


def options() -> SimOptions:
    """The simulator's phrasing sets, dialog layouts, surprises and faults."""
    return SimOptions(phrasing_sets=tuple(TRAIN_PHRASING_SETS), layouts=LAYOUTS,
                      surprises=tuple(f.name for f in fields(Surprises)),
                      faults=tuple(f.name for f in fields(Faults)),
                      check_faults=_check_faults)
