"""Darwin's on-policy learners' section of the config, PPO and GRPO (spec/DARWIN.md A.5, A.6):
it lives with its learners, :class:`digirl_lite.learners.ppo.OnPolicyConfig`; imported here
for the code that reads it from its old place."""

from __future__ import annotations

from digirl_lite.learners.ppo import OnPolicyConfig

__all__ = ["OnPolicyConfig"]
