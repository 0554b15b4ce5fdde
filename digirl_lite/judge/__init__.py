"""Judges: the interface, the simulator's oracle (VLM judges arrive with the judge issue)."""

from digirl_lite.judge.base import Judge, JudgeResult, OracleJudge

__all__ = ["Judge", "JudgeResult", "OracleJudge"]
