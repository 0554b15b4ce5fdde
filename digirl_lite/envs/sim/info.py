"""The simulated phone's :class:`~digirl_lite.envs.base.WorldInfo`: what a trainer needs of it
(drift days, its settings in the pile's cache key, its screen features' width), handed out by
the env factory (:func:`digirl_lite.envs.setup.world_info`)."""

from __future__ import annotations

from typing import Any

from digirl_lite.envs.base import WorldInfo

__all__ = ["world_info"]


def world_info(cfg: Any) -> WorldInfo:
    """The simulator's :class:`WorldInfo` for a run's config: drift days (``{"day": d}``),
    the pile key's simulator entries (``day``, ``sim_surprises``, ``sim_faults``,
    ``sim_layout``, ``phrasing_share``, ``train_phrasings``; each only when it is not its
    default, so older keys stay as they were) and the sim encoder's width."""
    from digirl_lite.vision.sim_encoder import SIM_FEATURE_DIM

    c = cfg
    key: tuple[Any, ...] = () if c.day == 1 else (("day", c.day),)  # day 1 keys as before
    key += (("surprises", sorted(c.sim_surprises.items())),) if c.sim_surprises else ()
    key += (("faults", sorted(c.sim_faults.items())),) if c.sim_faults else ()
    key += (("layout", c.sim_layout),) if c.sim_layout != "older" else ()
    key += (("phrasing", c.phrasing_share),) if c.phrasing_share else ()
    key += ((("phrasings", c.train_phrasings),)
            if c.phrasing_share and c.train_phrasings != "base" else ())
    return WorldInfo(env="sim", pile_key=key, feature_dim=SIM_FEATURE_DIM, drift=True)
