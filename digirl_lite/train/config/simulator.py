"""The simulated phone's own fields (``env`` "sim"): train phrasings, drift, surprises, dialog
layout and infrastructure faults.

What the simulator offers (phrasing sets, layouts, surprise and fault names) comes from the env
factory (:func:`digirl_lite.envs.setup.sim_options`): the config does not import the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from digirl_lite.errors import ConfigError

__all__ = ["SimulatorConfig", "sim_only"]


@dataclass
class SimulatorConfig:
    """The simulated phone the run practises and is evaluated on."""

    phrasing_share: float = 0.0
    """Share of the train tasks (pile and online phase) written with the train phrasings
    instead of AitW's one, fixed by ``seed`` (both worlds); 0: the list as written."""
    train_phrasings: str = "base"
    """The train phrasing set ``phrasing_share`` and ``sft_phrasing_share`` write with:
    "base" (12 templates; General's own) or "wide" (34, Web Shopping only); no held-out one."""
    day: int = 1
    """The phone's drift day when the run starts (1: the layout the demonstrations and the
    pile were recorded on; days 2..14 redesign one part after another)."""
    days_per_iteration: float = 0.0
    """Days that pass per online iteration (0: no drift): after ``k`` iterations the phone is
    on day ``day + floor(k * days_per_iteration)``."""
    sim_surprises: dict[str, float] = field(default_factory=dict)
    """Surprise probabilities that differ from the simulator's defaults, by name (pile,
    online phase, evaluations), e.g. ``{"sponsored": 0.3}``."""
    sim_layout: str = "older"
    """The live phone's dialogs: "older" (the layout the demonstrations saw) or "current"
    (today's: buttons elsewhere)."""
    sim_faults: dict[str, float] = field(default_factory=dict)
    """Infrastructure faults by name (all off by default), e.g. ``{"crash": 0.01}`` or
    ``{"latency_median_s": 0.25, "latency_sigma": 0.8}``."""


def sim_only(cfg: Any, name: str, allowed: tuple[str, ...]) -> None:
    """Field ``name`` of ``cfg`` holds one of ``allowed`` (its first: the default), and
    anything else only for the simulated phone; else a ConfigError naming the field."""
    value = getattr(cfg, name)
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    if value != allowed[0] and cfg.env != "sim":
        raise ConfigError(f"{name}: the simulated phone's (env='sim'), not "
                          f"env={cfg.env!r}'s")


def check(cfg: Any) -> None:
    """The simulator's fields of ``cfg`` (a :class:`~digirl_lite.train.config.DigiRLConfig`),
    against what the simulator offers."""
    from digirl_lite.envs.setup import sim_options

    sim = sim_options()
    if cfg.day < 1 or not 0 <= cfg.days_per_iteration < float("inf"):
        raise ValueError(f"day must be >= 1 and days_per_iteration >= 0, got day="
                         f"{cfg.day}, days_per_iteration={cfg.days_per_iteration}")
    _check_phrasings(cfg, sim.phrasing_sets)
    if cfg.sim_surprises:
        if cfg.env != "sim":
            raise ConfigError(f"sim_surprises: the simulated phone's (env='sim'), not "
                              f"env={cfg.env!r}'s")
        for k, v in cfg.sim_surprises.items():
            if k not in sim.surprises:
                raise ConfigError(f"sim_surprises: unknown surprise {k!r} (the simulator "
                                  f"has {', '.join(sim.surprises)})")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ConfigError(f"sim_surprises.{k}: a probability in [0, 1], got {v!r}")
    sim_only(cfg, "sim_layout", sim.layouts)
    if cfg.sim_faults:
        if cfg.env != "sim":
            raise ConfigError(f"sim_faults: the simulated phone's (env='sim'), not "
                              f"env={cfg.env!r}'s")
        for k in cfg.sim_faults:
            if k not in sim.faults:
                raise ConfigError(f"sim_faults: unknown fault {k!r} (the simulator has "
                                  f"{', '.join(sim.faults)})")
        try:
            sim.check_faults(cfg.sim_faults)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"sim_faults: {e}") from None
    if cfg.env != "sim" and (cfg.day != 1 or cfg.days_per_iteration):
        raise ConfigError(f"{'day' if cfg.day != 1 else 'days_per_iteration'}: drift "
                          "is the simulated phone's (env='sim'); real phones "
                          f"(env={cfg.env!r}) change on their own")


def _check_phrasings(cfg: Any, phrasing_sets: tuple[str, ...]) -> None:
    """``phrasing_share``, ``sft_phrasing_share`` and ``train_phrasings``."""
    for name in ("sft_phrasing_share", "phrasing_share"):
        if not 0 <= getattr(cfg, name) <= 1:
            raise ValueError(f"{name} must be a share in [0, 1], got {getattr(cfg, name)}")
    if cfg.world == "general" and cfg.train_phrasings != "base" and \
            (cfg.phrasing_share or cfg.sft_phrasing_share):
        raise ConfigError(f"train_phrasings: General has one train phrasing set, 'base'; "
                          f"got {cfg.train_phrasings!r}")
    if cfg.train_phrasings not in phrasing_sets:
        raise ConfigError(f"train_phrasings must be one of "
                          f"{', '.join(phrasing_sets)}, got {cfg.train_phrasings!r}")
    if cfg.train_phrasings != "base" and not (cfg.phrasing_share or cfg.sft_phrasing_share):
        raise ConfigError(f"train_phrasings {cfg.train_phrasings!r} changes nothing "
                          "while phrasing_share and sft_phrasing_share are 0: set one")
    if cfg.phrasing_share and cfg.env != "sim":
        raise ConfigError("phrasing_share: rephrasing train tasks is the simulated "
                          f"phone's (env='sim'), not env={cfg.env!r}'s")
