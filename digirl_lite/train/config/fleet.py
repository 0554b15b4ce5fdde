"""The phones and the fleet that drives them: simulated or Android, lockstep or
asynchronous, and what the fleet does with devices that fail.

Where a default is this project's choice, ``docs/config.md`` says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from digirl_lite.errors import ConfigError

__all__ = ["FleetConfig", "LEARNER_MODES", "ASYNC_FLEETS"]

LEARNER_MODES = ("sync", "async")
"""``DigiRLConfig.learner``: how collection and updates take turns (the algorithms, the
``algorithm`` field, are :mod:`digirl_lite.learners`' registry)."""
ASYNC_FLEETS = ("async", "ray")  # the fleets with start / take (rollout.async_fleet)


@dataclass
class FleetConfig:
    """The phones (``env``, ``android``), the fleet, and how collection meets the updates."""

    n_envs: int = 16
    """Phones in the fleet (one batched policy call per step)."""
    fleet: str = "local"
    """"local"/"sync" (lockstep, in this process), "process" (lockstep, a worker process
    each), "async" or "ray" (asynchronous): digirl_lite.rollout.make_fleet."""
    fleet_options: dict[str, Any] = field(default_factory=dict)
    """Passed to the fleet's constructor (e.g. ``{"address": "ray://head:10001"}``)."""
    learner: str = "sync"
    """"sync" (the paper's loop: collect, then update) or "async" (the fleet collects while
    the learner updates; needs fleet "async" or "ray"; spec/DARWIN.md A.1)."""
    max_staleness: int = 2
    """``learner`` "async": drop a trajectory sampled with weights more than this many
    policy versions behind the learner's (``async_dropped`` in metrics.jsonl)."""
    take_order: str = "start"
    """``learner`` "async": "start" (the next trajectories in the order their episodes
    started) or "completion" (the first to complete, Darwin's A.1)."""
    env: str = "sim"
    """"sim" (the built-in simulated phone, in this process) or "android" (devices over
    Appium: emulators, a lab's phones, a device farm, or served simulated phones)."""
    android: dict[str, Any] = field(default_factory=dict)
    """For ``env="android"``: ``"devices"`` or ``"emulators"``, with ``options``, ``reset``,
    ``setup``, ``teardown``, ``hard_reset`` (:mod:`digirl_lite.envs.setup`; docs/config.md)."""
    hard_reset_every: int | None = None
    """A hard reset to the saved phone every this many episodes, Darwin's minimal reset
    between (0: never); None: the phone's own (simulator 1, Android 0)."""
    ui_tree: bool = False
    """Read the phone's UI tree at every reset and step into ``info["ui_tree"]`` (on a
    device one more round trip a step)."""
    max_task_attempts: int = 3
    """Attempts a task gets when infrastructure faults end them, each on another device with
    the same trajectory id and seed (1: no second attempt)."""
    quarantine_after: int = 3
    """A device whose starts fail this many times in a row leaves the fleet (the run stops
    when none is left). 0: never."""
    quarantine_probe_s: float = 30.0
    """How often a quarantined device is probed (a restart, then a start); it rejoins the
    fleet when it answers."""


def check(cfg: Any) -> None:
    """The phones' and the fleet's fields of ``cfg`` (a
    :class:`~digirl_lite.train.config.DigiRLConfig`)."""
    from digirl_lite.rollout.factory import FLEETS

    if cfg.fleet not in FLEETS:
        raise ValueError(f"fleet must be one of {FLEETS}, got {cfg.fleet!r}")
    _check_learner(cfg)
    if cfg.env not in ("sim", "android"):
        raise ValueError(f"env must be 'sim' or 'android', got {cfg.env!r}")
    if cfg.n_envs <= 0:
        raise ValueError("n_envs must be positive")
    if cfg.max_task_attempts < 1:
        raise ValueError(f"max_task_attempts must be >= 1, got {cfg.max_task_attempts}")
    if cfg.quarantine_after < 0 or cfg.quarantine_probe_s < 0:
        raise ValueError("quarantine_after and quarantine_probe_s must be >= 0")
    _check_hard_reset(cfg)


def _check_learner(cfg: Any) -> None:
    """``learner`` and its asynchronous fields against the fleet and drift."""
    if cfg.learner not in LEARNER_MODES:
        raise ConfigError(f"learner must be one of {LEARNER_MODES}, got {cfg.learner!r}")
    if cfg.max_staleness < 0:
        raise ConfigError(f"max_staleness must be >= 0, got {cfg.max_staleness}")
    from digirl_lite.rollout.async_fleet import TAKE_ORDERS

    if cfg.take_order not in TAKE_ORDERS:
        raise ConfigError(f"take_order must be one of {TAKE_ORDERS}, "
                          f"got {cfg.take_order!r}")
    if cfg.learner == "sync":
        for name in ("max_staleness", "take_order"):
            if getattr(cfg, name) != getattr(FleetConfig, name):
                raise ConfigError(f"{name}={getattr(cfg, name)!r} has no effect with "
                                  "learner='sync' (every iteration trains on its own "
                                  "fresh trajectories): set learner='async' or leave it")
        return
    if cfg.fleet not in ASYNC_FLEETS:
        raise ConfigError(f"learner='async' needs a fleet that collects in the background "
                          f"(fleet one of {ASYNC_FLEETS}), got fleet={cfg.fleet!r}")
    if cfg.days_per_iteration:
        raise ConfigError("learner='async' with days_per_iteration: the drift day is "
                          "set per iteration, and the asynchronous stream has no "
                          "iterations; use learner 'sync' for drift runs")


def _check_hard_reset(cfg: Any) -> None:
    """``hard_reset_every`` against the phones: a ConfigError naming it before any work."""
    k = cfg.hard_reset_every
    if k is None:
        return
    if k < 0:
        raise ConfigError(f"hard_reset_every must be >= 0 (0: never), got {k}")
    if cfg.env != "android" or not k:
        return
    a = cfg.android if isinstance(cfg.android, dict) else {}
    reset = a.get("reset", "snapshot" if "emulators" in a else "home")
    if reset != "home":
        raise ConfigError(f"hard_reset_every={k}: android.reset {reset!r} resets every "
                          "episode in full; the periodic hard reset goes with 'home'")
    if "devices" in a and not a.get("hard_reset"):
        raise ConfigError(f"hard_reset_every={k}: android.hard_reset is not set (the "
                          "commands of a hard reset on running devices, e.g. a "
                          "'mobile: shell' pm clear)")
    if "emulators" in a and cfg.fleet in ("process", "ray"):
        raise ConfigError(f"hard_reset_every={k}: emulators hard-reset by a snapshot "
                          f"load from this process, which fleet={cfg.fleet!r} workers "
                          "cannot reach; use fleet 'sync' or 'async'")
