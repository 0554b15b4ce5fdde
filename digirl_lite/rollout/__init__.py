"""Collecting trajectories: one episode now; fleets (sync, async, Ray) in later issues."""

from digirl_lite.rollout.episode import RECORD_SIZE, Agent, run_episode

__all__ = ["Agent", "run_episode", "RECORD_SIZE"]
