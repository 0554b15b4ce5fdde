"""The oracle judges' old home: they live in :mod:`digirl_lite.judge.oracle` (they read a
state that checks its own task, :meth:`~digirl_lite.envs.sim.state.PhoneState.task_succeeded`,
and import no environment); re-exported here."""

from digirl_lite.judge.oracle import EnvJudge, NoisyOracleJudge, OracleJudge

__all__ = ["OracleJudge", "EnvJudge", "NoisyOracleJudge"]
