"""What a fleet hands its callers: the batch agent it asks, the episodes and counts it
returns, and the errors that stop a collection (:mod:`.fleet`, :mod:`.async_fleet`,
:mod:`.ray_fleet`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from digirl_lite.data.records import Trajectory
from digirl_lite.envs.base import Observation

__all__ = ["BatchAgent", "ScriptedBatchAgent", "Episode", "FleetStats", "JudgeUnavailable",
           "NoDevicesLeft"]


class BatchAgent(Protocol):
    def act_batch(self, slots: Sequence[int], observations: Sequence[Observation]) -> list[str]:
        """One action string per observation; ``slots`` name the environments."""


class ScriptedBatchAgent:
    """Per-environment scripted agents (expert, copier) behind the batch interface."""

    def __init__(self, make_agent: Callable[[int], Any]) -> None:
        self.make_agent = make_agent
        self._agents: dict[int, Any] = {}

    def act_batch(self, slots, observations):
        out = []
        for slot, obs in zip(slots, observations):
            if slot not in self._agents:
                self._agents[slot] = self.make_agent(slot)
            out.append(self._agents[slot].act(obs))
        return out


@dataclass
class Episode:
    """A finished episode: the trajectory and the ground-truth states it visited (sim).

    ``reached_first_milestone``: the environment's answer (``info`` of the last step)
    whether the episode ever reached the task's first milestone; None where it cannot tell
    (the failure kinds then do without it, :func:`digirl_lite.train.evaluate.failure_kind`).
    """

    trajectory: Trajectory
    states: list[Any]
    task: Any
    reached_first_milestone: bool | None = None
    recoveries: tuple[str, ...] | None = None
    """The ways back the episode took (a pop-up closed, voice input left, a BACK from a
    wrong page), where the environment reports them (the simulator); None elsewhere."""
    failure_cause: str | None = None
    """Why it failed, where the environment can tell (the simulator's
    :data:`~digirl_lite.envs.sim.world.FAILURE_CAUSES`); None for a success or elsewhere."""
    trees: list[Any] | None = None
    """The UI tree the agent saw before each step and after the last (``obs.ui_tree``; None
    where the environment reads none): what evidence of an episode is built from, as on a
    real phone, never :attr:`states` (issue 48)."""


@dataclass
class FleetStats:
    """What a fleet has collected and survived since it was built.

    Attributes:
        episodes: finished episodes returned (infrastructure truncations included; an
            attempt whose task went back to the queue counts in ``requeued`` instead).
        steps: environment steps recorded.
        infra_truncations: episodes ended by the infrastructure, by cause: ``"device"``
            (the environment reported it: crash, blank screens) or ``"worker"`` (a device
            error: dead or hung worker, an environment that raised); attempts whose task
            went back to the queue (``requeued``) included, as are their ``steps``.
        device_resets: resets of a device after ``max_consecutive_faults`` faults in a row.
        worker_restarts: restarts after a device error (worker process, Ray actor or
            environment, whichever failed).
        discarded_unfinished: episodes still running when an asynchronous collection
            stopped (never recorded).
        discarded_out_of_order: completed episodes an asynchronous collection in task
            order dropped at its stop because an episode that started before them was
            still running (keeping them would favour short episodes).
        requeued: episodes an infrastructure fault ended (never started, or cut short)
            whose task went back to the queue for another device (issue 29); they are not
            returned, the task's next attempt is. ``requeued_unjudged``: of those, the
            episodes that went back for an unjudged step (evaluations, ``retry_unjudged``).
        quarantined: devices taken out of the fleet after ``quarantine_after`` failed
            starts in a row; returned: quarantined devices that answered a probe and came
            back.
        device_events: what happened to which device and when: ``{"t": unix time,
            "slot", "device": its name (a URL where it has one), "event": "quarantined" |
            "returned", "reason"}``.
    """

    episodes: int = 0
    steps: int = 0
    infra_truncations: dict[str, int] = field(default_factory=lambda: {"device": 0,
                                                                         "worker": 0})
    device_resets: int = 0
    worker_restarts: int = 0
    discarded_unfinished: int = 0
    discarded_out_of_order: int = 0
    requeued: int = 0
    requeued_unjudged: int = 0
    quarantined: int = 0
    returned: int = 0
    device_events: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "steps": self.steps,
                "infra_truncations": dict(self.infra_truncations),
                "device_resets": self.device_resets, "worker_restarts": self.worker_restarts,
                "discarded_unfinished": self.discarded_unfinished,
                "discarded_out_of_order": self.discarded_out_of_order,
                "requeued": self.requeued, "requeued_unjudged": self.requeued_unjudged,
                "quarantined": self.quarantined,
                "returned": self.returned, "device_events": list(self.device_events)}


class JudgeUnavailable(RuntimeError):
    """``max_unjudged_steps`` steps in a row came back unjudged, or none was judged for
    ``max_unjudged_s`` seconds (:attr:`seconds`): the judge cannot answer
    (a revoked key, an API that is down). Collection stops; :attr:`episodes` holds the
    episodes that had finished (in task order), so nothing collected is lost, and
    :attr:`reason` the last step's reason."""

    def __init__(self, n: int, reason: str, seconds: float | None = None) -> None:
        quiet = f" (no verdict for {seconds:.0f} s)" if seconds is not None else ""
        super().__init__(f"{n} steps in a row were unjudged{quiet}; the last one: {reason}")
        self.n, self.reason, self.seconds = n, reason, seconds
        self.episodes: list[Episode] = []


class NoDevicesLeft(RuntimeError):
    """Every device of the fleet is quarantined (:class:`FleetStats`) while tasks are left:
    collection stops. :attr:`episodes` holds the episodes that had finished (in task
    order), so nothing collected is lost; :attr:`reason` names the devices and their last
    faults. Resuming the run when devices are back goes on from its last checkpoint."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"no device left: {reason}")
        self.reason = reason
        self.episodes: list[Episode] = []
