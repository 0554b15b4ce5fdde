"""The built-in simulated phone: launcher, Chrome, Google, six shops, surprises and drift.
Its oracle judges live in :mod:`digirl_lite.judge.oracle` (re-exported here)."""

from digirl_lite.envs.sim.agents import Copier, ScriptedExpert, expert_action
from digirl_lite.envs.sim.env import Faults, SimEnvFactory, SimPhoneEnv
from digirl_lite.envs.sim.tasks import (
    SimPhase,
    Task,
    UnsupportedTaskError,
    load_tasks,
    parse_task,
    task_with_phases,
)
from digirl_lite.envs.sim.world import PhoneState, Surprises
from digirl_lite.judge.oracle import EnvJudge, NoisyOracleJudge, OracleJudge

__all__ = [
    "Copier", "ScriptedExpert", "expert_action", "Faults", "SimEnvFactory", "SimPhoneEnv", "Task",
    "UnsupportedTaskError", "load_tasks", "parse_task", "SimPhase", "task_with_phases",
    "PhoneState", "Surprises",
    "OracleJudge", "EnvJudge", "NoisyOracleJudge",
]
