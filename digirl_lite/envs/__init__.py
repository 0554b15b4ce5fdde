"""Environments behind one interface (:class:`Env`): the simulated phone and Android.

``SimPhoneEnv`` and the judge factory (:func:`make_judge`, :func:`check_judge`, in
:mod:`.judges`) are imported on first use, so ``import digirl_lite.envs`` stays light.
"""

from digirl_lite.envs.base import TRUNCATION_BUDGET, TRUNCATION_INFRA, Env, Observation

__all__ = ["Env", "Observation", "TRUNCATION_BUDGET", "TRUNCATION_INFRA", "SimPhoneEnv",
           "make_judge", "check_judge"]


def __getattr__(name: str):
    if name == "SimPhoneEnv":
        from digirl_lite.envs.sim.env import SimPhoneEnv

        return SimPhoneEnv
    if name in ("make_judge", "check_judge"):
        from digirl_lite.envs import judges

        return getattr(judges, name)
    raise AttributeError(f"module 'digirl_lite.envs' has no attribute {name!r}")
