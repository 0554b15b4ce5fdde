"""digirl_lite: DigiRL (Bai, Zhou et al., NeurIPS 2024) for phone-using agents, on a laptop.

Importing the package is light: submodules load on first use (``digirl_lite.filters``,
``digirl_lite.actions``, ``digirl_lite.data``, ...), and torch, transformers and datasets are
imported only by the parts that need them.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = ("actions", "critics", "data", "envs", "filters", "judge", "policy", "prompts",
               "report", "rollout", "train", "vision", "viz")

__all__ = ["__version__", "GYM_IDS", *_SUBMODULES]

GYM_IDS = {"digirl_lite/SimPhone-v0": "webshop", "digirl_lite/SimPhoneGeneral-v0": "general"}
"""The simulated phone's Gymnasium ids and their worlds
(:class:`digirl_lite.envs.sim.gym.SimPhoneGymEnv`), registered on import."""


def _register_gymnasium() -> None:
    """``gymnasium.make("digirl_lite/SimPhone-v0")`` after ``import digirl_lite``: only the
    registry is imported here (gymnasium is light); the environment loads on ``make``."""
    try:
        from gymnasium.envs.registration import register, registry
    except ImportError:  # pragma: no cover - gymnasium is a base dependency
        return
    for env_id, world in GYM_IDS.items():
        if env_id not in registry:
            register(id=env_id, entry_point="digirl_lite.envs.sim.gym:SimPhoneGymEnv",
                     kwargs={"world": world})


_register_gymnasium()


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"digirl_lite.{name}")
    raise AttributeError(f"module 'digirl_lite' has no attribute {name!r}")
