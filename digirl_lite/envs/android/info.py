"""Android's :class:`~digirl_lite.envs.base.WorldInfo`, handed out by the env factory
(:func:`digirl_lite.envs.setup.world_info`): real phones change on their own (no drift days),
their pile is keyed by the devices' section, and their screenshots have no width of their own
(the image encoder's default)."""

from __future__ import annotations

from typing import Any

from digirl_lite.envs.base import WorldInfo

__all__ = ["world_info"]


def world_info(cfg: Any) -> WorldInfo:
    """Android's :class:`WorldInfo` for a run's config: the pile key holds ``env`` and the
    ``android`` section (the devices or emulators it ran on)."""
    return WorldInfo(env=cfg.env, pile_key=(cfg.env, cfg.android), feature_dim=None,
                     drift=False)
