"""Collecting trajectories: one episode (:func:`run_episode`) or many on a fleet of phones.

Fleets: :class:`SyncFleet` (lockstep, the reference code's batch mode), :class:`AsyncFleet`
(spec/DARWIN.md section A.1: per-phone workers, inference on whatever is ready, completed
trajectories on demand), :class:`RayFleet` (the asynchronous fleet with phones in Ray actors;
the ``ray`` extra). :func:`make_fleet` builds one by name. Fleet names load on use.
"""

from __future__ import annotations

from digirl_lite._lazy import lazy_exports
from digirl_lite.rollout.episode import RECORD_SIZE, Agent, SampledAction, run_episode

_NAMES = {
    "SyncFleet": "fleet", "LocalFleet": "fleet", "ProcessFleet": "fleet",
    "make_fleet": "factory", "FLEETS": "factory", "Episode": "fleet", "FleetStats": "fleet",
    "BatchAgent": "fleet", "ScriptedBatchAgent": "fleet", "JudgeUnavailable": "fleet",
    "AsyncFleet": "async_fleet", "RayFleet": "ray_fleet",
    "DeviceError": "devices", "training_trajectories": "faults",
}

__all__ = ["Agent", "SampledAction", "run_episode", "RECORD_SIZE", *_NAMES]
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
