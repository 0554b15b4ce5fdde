"""Environments behind one interface (:class:`Env`): the simulated phone and Android.

``SimPhoneEnv`` is imported on first use, so ``import digirl_lite.envs`` stays light.
"""

from digirl_lite.envs.base import TRUNCATION_BUDGET, TRUNCATION_INFRA, Env, Observation

__all__ = ["Env", "Observation", "TRUNCATION_BUDGET", "TRUNCATION_INFRA", "SimPhoneEnv"]


def __getattr__(name: str):
    if name == "SimPhoneEnv":
        from digirl_lite.envs.sim.env import SimPhoneEnv

        return SimPhoneEnv
    raise AttributeError(f"module 'digirl_lite.envs' has no attribute {name!r}")
