"""Build a fleet by name (:func:`make_fleet`): the lockstep, asynchronous and Ray fleets.

This module sits above the fleets it chooses from, so :mod:`.fleet` (the shared recording
and fault keeping) never imports the asynchronous or Ray fleets that build on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from digirl_lite.rollout.fleet import SyncFleet

__all__ = ["make_fleet", "FLEETS"]

FLEETS = ("sync", "local", "process", "async", "ray")
"""Names :func:`make_fleet` accepts ("local" and "process" are the sync fleet's backends)."""


def make_fleet(name: str, make_env: Callable[[int], Any], n_envs: int = 16,
               **options: Any) -> Any:
    """Build a fleet by name: ``"sync"`` / ``"local"`` (lockstep, in this process),
    ``"process"`` (lockstep, a worker process per phone), ``"async"`` (per-phone workers,
    inference on whatever is ready; ``backend="local"`` or ``"process"``), ``"ray"``
    (asynchronous, phones in Ray actors; needs the ``ray`` extra). ``options`` go to the
    fleet's constructor."""
    if name in ("sync", "local"):
        return SyncFleet(make_env, n_envs, **{"backend": "local", **options})
    if name == "process":
        return SyncFleet(make_env, n_envs, **{**options, "backend": "process"})
    if name == "async":
        from digirl_lite.rollout.async_fleet import AsyncFleet

        return AsyncFleet(make_env, n_envs, **options)
    if name == "ray":
        from digirl_lite.rollout.ray_fleet import RayFleet

        return RayFleet(make_env, n_envs, **options)
    raise ValueError(f"unknown fleet {name!r}; choose one of {FLEETS}")
