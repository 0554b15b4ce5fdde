"""What the learner does with infrastructure truncations (spec/DARWIN.md section A.3, A.6).

By default they are kept out of the critics' labels and the actor's data: an episode cut by
a crashed phone says nothing about the agent (:attr:`Trajectory.is_usable`). Darwin found
that its PPO learned faster when such episodes were treated as terminal with value 0; for
DigiRL's Monte-Carlo labels that means "a failure from here on", which the option below
gives, without changing how the episode is stored or counted (it stays INFRA there).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from digirl_lite.data.records import Ending, Trajectory

__all__ = ["INFRA_POLICIES", "training_trajectories"]

INFRA_POLICIES = ("exclude", "terminal")


def training_trajectories(trajectories: Iterable[Trajectory],
                          infra: str = "exclude") -> list[Trajectory]:
    """The trajectories fit for training.

    Args:
        trajectories: as collected.
        infra: ``"exclude"`` (default) drops infrastructure truncations; ``"terminal"``
            keeps those with steps as episodes that ended there with reward 0 and value 0
            (a copy marked ``Ending.BUDGET`` without ``truncation_reason``, its last step
            ``done``, so the critics accept it). Use the copies for training only; store and
            report the originals.

    Trajectories with unjudged steps are dropped either way (a missing verdict is not a 0).
    """
    if infra not in INFRA_POLICIES:
        raise ValueError(f"infra must be one of {INFRA_POLICIES}, got {infra!r}")
    out = []
    for t in trajectories:
        if t.is_usable:
            out.append(t)
        elif infra == "terminal" and t.is_infra_truncated and t.steps and not t.num_unjudged:
            last = replace(t.steps[-1], done=True)
            out.append(replace(t, steps=t.steps[:-1] + (last,), ending=Ending.BUDGET,
                               final_reward=0.0, truncation_reason=None).with_mc_returns())
    return out
