"""Fleets: collect trajectories from N phones, with one batched policy call per decision.

:class:`SyncFleet` is the reference code's synchronous batch mode: all N phones step
together, the policy samples the N next actions in one batch, and a new step starts only
when the slowest phone has finished the last one. ``backend="local"`` keeps the environments
in this process, ``"process"`` gives each its own worker process (:mod:`.devices`).
:class:`LocalFleet` and :class:`ProcessFleet` are those two, under their earlier names.
The asynchronous fleet (:class:`~digirl_lite.rollout.async_fleet.AsyncFleet`) and the Ray
fleet share the recording and fault handling defined here; :func:`make_fleet` builds any
of them by name (:mod:`.factory`, which sits above every fleet).

Faults: a device error (dead worker, hung call, environment that raises) ends the episode as
an infrastructure truncation and restarts the device; a device whose episodes end in
infrastructure truncations ``max_consecutive_faults`` times in a row is reset too. Counts
are in :attr:`SyncFleet.stats` and logged. Such episodes are never agent failures:
:attr:`Trajectory.is_usable` keeps them out of the critics' labels and the actor's data
(see :func:`digirl_lite.rollout.faults.training_trajectories` for the Darwin option).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from digirl_lite.data.records import Ending, ScreenTable, Source, Trajectory, Verdict
from digirl_lite.envs.base import Observation
from digirl_lite.rollout.devices import DeviceError, LocalDevice, ProcessDevice
from digirl_lite.rollout.episode import RECORD_SIZE, EpisodeRecorder

__all__ = ["BatchAgent", "ScriptedBatchAgent", "Episode", "FleetStats", "SyncFleet",
           "LocalFleet", "ProcessFleet", "JudgeUnavailable", "NoDevicesLeft", "device_name"]

log = logging.getLogger("digirl_lite.rollout")
UNREACHABLE_AT_START = "unreachable at the start"


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


class _TaskQueue:
    """The tasks of one collection, and the attempts of those a fault sent back.

    A task whose episode an infrastructure fault ended (it never started, or was cut short)
    goes back, with the same number ``k`` (so the same trajectory id and environment seed),
    for another device, up to ``max_attempts`` attempts in all: a device does not take back
    a task that failed on it while a live device it has not failed on could. With ``retry_unjudged``
    (evaluations) an episode with an unjudged step goes back the same way: the judge, not
    the agent, left it without a verdict. With ``free_starts``, a start that failed on the
    device's account (it could not be reached; not the task's setup) uses up no attempt,
    once per device and task: a dead device that has not yet left the fleet cannot use up a
    task's attempts. ``tasks`` may be endless.
    Thread-safe; :meth:`next_for` can wait for a task (the asynchronous fleet's workers).
    """

    def __init__(self, tasks: Any, max_attempts: int, live: set[int] | None = None,
                 retry_unjudged: bool = False, free_starts: bool = False) -> None:
        self._tasks = enumerate(tasks)
        self.max_attempts = max_attempts
        self.free_starts = free_starts
        self._free_used: set[tuple[int, int]] = set()  # (task, device) starts given free
        self.retry_unjudged = retry_unjudged  # an episode with an unjudged step goes back too
        self._ahead = next(self._tasks, None)  # read one ahead: ``pending`` is always known
        self._retries: list[tuple[int, Any]] = []  # tasks sent back, in order
        self._failed_on: dict[int, set[int]] = {}  # task -> the devices it failed on
        self._attempts: dict[int, int] = {}
        self._out = 0  # handed out, not yet settled
        self.live: set[int] = set(live or ())  # slots not quarantined (change: set_live)
        self._cond = threading.Condition()
        self.closed = False  # stop handing out (the asynchronous fleet's stop)

    @property
    def _exhausted(self) -> bool:
        return self._ahead is None

    def _pick(self, slot: int) -> tuple[int, Any] | None:
        for i, (k, task) in enumerate(self._retries):
            if slot not in self._failed_on[k]:
                del self._retries[i]
                return k, task
        if self._ahead is not None:
            item, self._ahead = self._ahead, next(self._tasks, None)
            return item
        for i, (k, task) in enumerate(self._retries):
            if self.live <= self._failed_on[k] | {slot}:  # no other live device could
                del self._retries[i]  # take it: every one has failed it
                return k, task
        return None

    def set_live(self, slot: int, live: bool) -> None:
        """A device left the fleet (quarantine) or came back."""
        with self._cond:
            (self.live.add if live else self.live.discard)(slot)
            self._cond.notify_all()

    def close(self) -> None:
        """Hand out nothing more (a stop); wakes the workers that wait for a task."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def next_for(self, slot: int, wait: bool = False) -> tuple[int, Any] | None:
        """The next task for ``slot``: a retry that did not fail on it, else a new one;
        None when there is none for it (``wait``: block until one comes back or every
        task is settled)."""
        with self._cond:
            while not self.closed:
                item = self._pick(slot)
                if item is not None:
                    self._out += 1
                    self._attempts[item[0]] = self._attempts.get(item[0], 0) + 1
                    return item
                if not wait or self.finished:
                    return None
                self._cond.wait(0.5)
            return None

    def settle(self, k: int, task: Any, slot: int, infra: bool, probe: bool = False,
               unstarted: bool = False) -> bool:
        """Task ``k`` came back from ``slot``; True when it goes back to the queue (an
        infrastructure fault, or an unjudged step under ``retry_unjudged``, and attempts
        left; a failed ``probe`` of a quarantined device does not use up an attempt, nor
        does a start the device failed, ``unstarted``, once per device under
        ``free_starts``), False when this episode is its last."""
        with self._cond:
            self._out -= 1
            if infra and unstarted and not probe and self.free_starts and \
                    (k, slot) not in self._free_used:
                self._free_used.add((k, slot))
                self._attempts[k] -= 1
            if probe and infra:
                self._attempts[k] -= 1
            again = infra and self._attempts[k] < self.max_attempts
            if again:
                self._retries.append((k, task))
                self._failed_on.setdefault(k, set()).add(slot)
            self._cond.notify_all()
            return again

    @property
    def pending(self) -> bool:
        """Tasks that wait for a device (retries, or new ones not yet handed out)."""
        return bool(self._retries) or not self._exhausted

    @property
    def finished(self) -> bool:
        """Every task handed out and settled, none waiting."""
        return self._exhausted and not self._retries and self._out == 0


def device_name(device: Any) -> str:
    """How a device is named in logs: the URL of its phone where it has one (its
    environment's, or what its ``make_env`` says with ``endpoint(slot)``)."""
    endpoint = getattr(getattr(device, "make_env", None), "endpoint", None)
    if callable(endpoint) and isinstance(url := endpoint(device.slot), str):
        return f"device {device.slot} ({url})"
    env = getattr(device, "env", None)
    for obj in (device, env, getattr(env, "config", None)):
        for attr in ("endpoint", "server_url"):
            if isinstance(getattr(obj, attr, None), str):
                return f"device {device.slot} ({getattr(obj, attr)})"
    return f"device {device.slot}"


def task_text(task: Any) -> str:
    return getattr(task, "text", None) or str(task)


class _Recording:
    """The episodes of one collection call: recorders per slot, shared by every fleet.

    Only one thread (the fleet's loop) touches a recording, so the screen table needs no
    lock.
    """

    def __init__(self, screens: ScreenTable, *, id_prefix: str, source: Source,
                 iteration: int, seed: int, record_size: tuple[int, int] | None,
                 on_step: Callable[[int, Observation], None] | None,
                 reset_options: dict[str, Any] | None = None) -> None:
        self.screens, self.id_prefix, self.source = screens, id_prefix, source
        self.iteration, self.seed, self.record_size = iteration, seed, record_size
        self.on_step, self.reset_options = on_step, reset_options
        self.active: dict[int, tuple[int, Any, EpisodeRecorder]] = {}

    def traj_id(self, k: int) -> str:
        return f"{self.id_prefix}-{k:05d}"

    def begin(self, slot: int, k: int, task: Any, obs: Observation, horizon: int) -> None:
        rec = EpisodeRecorder(self.screens, self.traj_id(k), obs, source=self.source,
                              iteration=self.iteration, horizon=horizon,
                              record_size=self.record_size, seeds={"env": self.seed + k})
        self.active[slot] = (k, task, rec)
        if self.on_step is not None:
            self.on_step(slot, obs)

    def obs(self, slot: int) -> Observation:
        return self.active[slot][2].obs

    def record(self, slot: int, text: str, result: tuple, policy_s: float,
               version: int) -> tuple[int, Episode] | None:
        """Add one step; ``(k, episode)`` when it ended the episode."""
        k, task, rec = self.active[slot]
        nobs, reward, term, trunc, info = result
        if self.on_step is not None:
            self.on_step(slot, nobs)
        if not rec.record(text, nobs, reward, term, trunc, info, policy_s, version):
            return None
        del self.active[slot]
        return k, Episode(rec.trajectory, rec.states, task, rec.reached_first_milestone,
                          None if rec.recoveries is None else tuple(rec.recoveries),
                          rec.failure_cause, rec.trees)

    def abort(self, slot: int, reason: str) -> tuple[int, Episode]:
        k, task, rec = self.active.pop(slot)
        return k, Episode(rec.abort(reason), rec.states, task, trees=rec.trees)

    def failed_reset(self, k: int, task: Any, reason: str) -> Episode:
        """An episode whose device never came up: an infrastructure truncation, no steps."""
        traj = Trajectory(traj_id=self.traj_id(k), task=task_text(task), steps=(),
                          final_reward=0.0, ending=Ending.INFRA, source=self.source,
                          iteration=self.iteration, seeds={"env": self.seed + k},
                          truncation_reason=reason)
        return Episode(traj, [], task)


class _FaultKeeper:
    """Counts faults per device and says when one that keeps failing needs a reset.

    Thread-safe: asynchronous workers report restarts from their own threads. The caller
    performs the restart (on the device's own thread where it has one).
    """

    def __init__(self, max_consecutive_faults: int, max_unjudged_steps: int = 0,
                 quarantine_after: int = 3, quarantine_probe_s: float = 30.0,
                 max_unjudged_s: float = 0.0) -> None:
        if max_consecutive_faults < 1 or max_unjudged_steps < 0 or max_unjudged_s < 0:
            raise ValueError("max_consecutive_faults must be >= 1, max_unjudged_steps and "
                             "max_unjudged_s >= 0")
        if quarantine_after < 0 or quarantine_probe_s < 0:
            raise ValueError("quarantine_after and quarantine_probe_s must be >= 0")
        self.max_unjudged_s = max_unjudged_s
        self.last_verdict = time.monotonic()  # the clock of max_unjudged_s (see judged)
        self.max_consecutive_faults = max_consecutive_faults
        self.max_unjudged_steps = max_unjudged_steps
        self.quarantine_after, self.quarantine_probe_s = quarantine_after, quarantine_probe_s
        self.unjudged_in_a_row = 0
        self.stats = FleetStats()
        self._in_a_row: dict[int, int] = {}
        self._failed_starts: dict[int, int] = {}
        self.last_fault: dict[int, str] = {}
        self._lock = threading.Lock()

    def start_failed(self, slot: int, reason: str) -> bool:
        """A device could not start an episode (its reset failed, after a restart); True
        when that has now happened ``quarantine_after`` times in a row (0: never)."""
        with self._lock:
            n = self._failed_starts[slot] = self._failed_starts.get(slot, 0) + 1
            self.last_fault[slot] = reason
            return bool(self.quarantine_after) and n >= self.quarantine_after

    def quarantine_at_start(self, devices: Sequence[Any],
                            slots: Sequence[int]) -> list[int]:
        """Record ``slots`` (of ``devices``) as quarantined from the start: unreachable
        before the fleet was built. Returns them."""
        for slot in slots:
            self.device_event(devices[slot], "quarantined", UNREACHABLE_AT_START)
        return list(slots)

    def started(self, slot: int) -> None:
        with self._lock:
            self._failed_starts[slot] = 0

    def device_event(self, device: Any, event: str, reason: str = "") -> None:
        """Record (and log, one line) a device leaving the fleet or coming back."""
        name = device_name(device)
        with self._lock:
            if event == "quarantined":
                self.stats.quarantined += 1
                self._failed_starts[device.slot] = 0
            else:
                self.stats.returned += 1
            self.stats.device_events.append({"t": round(time.time(), 3), "slot": device.slot,
                                             "device": name, "event": event,
                                             "reason": reason[:300]})
        if event == "quarantined":
            why = reason if reason == UNREACHABLE_AT_START else (
                f"after {self.quarantine_after} failed starts in a row ({reason[:200]})")
            log.warning("%s left the fleet %s; probing it every %g s", name, why,
                        self.quarantine_probe_s)
        else:
            log.warning("%s answered again and rejoined the fleet", name)

    def no_devices_left(self, devices: Sequence[Any]) -> NoDevicesLeft:
        """The error for a fleet whose ``devices`` are all quarantined: each named, with its
        last fault."""
        return NoDevicesLeft("; ".join(
            f"{device_name(d)}: {self.last_fault.get(d.slot, '')}"[:200] for d in devices))

    def judged(self, info: dict[str, Any]) -> None:
        """Count one step's verdict; raise :class:`JudgeUnavailable` at the limit."""
        verdict = info.get("verdict")
        if verdict is None:  # an infrastructure step: no verdict either way
            return
        if Verdict(verdict) is not Verdict.UNJUDGED:
            self.unjudged_in_a_row = 0
            self.last_verdict = time.monotonic()
            return
        now = time.monotonic()
        if self.unjudged_in_a_row == 0:  # the clock starts when the judge began failing:
            # this step's judging (its tries and backoff), not the wait before it
            judge_s = float((info.get("timings") or {}).get("judge_s") or 0.0)
            self.last_verdict = max(self.last_verdict, now - judge_s)
        self.unjudged_in_a_row += 1
        reason = str(info.get("judge_skipped") or "no reason given")
        if self.max_unjudged_steps and self.unjudged_in_a_row >= self.max_unjudged_steps:
            raise JudgeUnavailable(self.unjudged_in_a_row, reason)
        quiet = now - self.last_verdict
        if self.max_unjudged_s and quiet >= self.max_unjudged_s:
            raise JudgeUnavailable(self.unjudged_in_a_row, reason, seconds=quiet)

    def collecting(self) -> None:
        """A collection starts: the clock of ``max_unjudged_s`` starts with it."""
        self.last_verdict = time.monotonic()

    def requeued(self, slot: int, k: int, reason: str, unjudged: bool = False) -> None:
        with self._lock:
            self.stats.episodes -= 1
            self.stats.requeued += 1
            self.stats.requeued_unjudged += unjudged
        log.info("device %d: task %d goes back to the queue (%s)", slot, k, reason[:200])

    def restarted(self, slot: int, reason: str, what: str) -> None:
        with self._lock:
            self.stats.worker_restarts += 1
        log.warning("device %d: %s; restarted its %s", slot, reason, what)

    def finished(self, slot: int, episode: Episode, cause: str | None) -> bool:
        """Count a finished episode (``cause``: "worker" for a device error, "device" for a
        fault the environment reported, None otherwise); True when the device has now
        failed ``max_consecutive_faults`` times in a row and needs a reset."""
        with self._lock:
            self.stats.episodes += 1
            self.stats.steps += len(episode.trajectory)
            if not episode.trajectory.is_infra_truncated:
                self._in_a_row[slot] = 0
                return False
            self.stats.infra_truncations[cause or "device"] += 1
            if cause == "worker":  # the device is restarted anyway
                self._in_a_row[slot] = 0
                return False
            n = self._in_a_row[slot] = self._in_a_row.get(slot, 0) + 1
            if n < self.max_consecutive_faults:
                return False
            self._in_a_row[slot] = 0
            self.stats.device_resets += 1
        log.warning("device %d: %d infrastructure truncations in a row; resetting it", slot, n)
        return True


def restart_device(device: Any, faults: _FaultKeeper, reason: str) -> None:
    """Restart ``device`` after a device error (counted) or a run of faults."""
    try:
        what = device.restart()
    except Exception as e:  # the next reset on this device reports it again
        log.error("device %d: restart failed: %s", device.slot, e)
        return
    if reason:
        faults.restarted(device.slot, reason, what)


def reset_device(device: Any, faults: _FaultKeeper, task: Any, seed: int,
                 options: dict[str, Any] | None = None
                 ) -> tuple[Observation, int] | DeviceError:
    """Reset ``device`` (with the environment's reset ``options``, if any); after a device
    error, restart it and try once more. Returns (observation, horizon), or the second
    error. A failed setup phase (:attr:`DeviceError.task_fault`: the device answered) is
    returned at once, the device left as it is."""
    outcome = _reset_once(device, task, seed, options)
    if not isinstance(outcome, DeviceError) or outcome.task_fault:
        return outcome
    restart_device(device, faults, f"reset failed ({outcome})")
    return _reset_once(device, task, seed, options)


def probe_reset(device: Any, faults: _FaultKeeper, task: Any, seed: int,
                options: dict[str, Any] | None = None
                ) -> tuple[Observation, int] | DeviceError:
    """A quarantined device's probe: a restart, then one reset (no second try)."""
    restart_device(device, faults, "")
    return _reset_once(device, task, seed, options)


def _reset_once(device: Any, task: Any, seed: int, options: dict[str, Any] | None
                ) -> tuple[Observation, int] | DeviceError:
    try:  # options only where there are some (devices without reset options)
        return device.reset(*((task, seed, options) if options else (task, seed)))
    except DeviceError as e:
        return e


BENCH_RETRY_S = 1.0
"""How soon a device that failed a start (and has not yet left the fleet) tries the next one,
beside the synchronous fleet's lockstep."""


def settle_episode(queue: _TaskQueue, faults: _FaultKeeper, slot: int, k: int,
                   episode: Episode, probe: bool = False, unstarted: bool = False) -> bool:
    """Task ``k``'s episode on ``slot`` is over: True when an infrastructure fault ended it
    and its task went back to the queue (counted in ``requeued``), False when it is the
    task's episode to return. ``unstarted``: the device failed to start it (not the task's
    setup)."""
    t = episode.trajectory
    unjudged = queue.retry_unjudged and not t.is_infra_truncated and t.num_unjudged > 0
    if queue.settle(k, episode.task, slot, t.is_infra_truncated or unjudged, probe,
                    unstarted):
        faults.requeued(slot, k, f"{t.num_unjudged} unjudged step(s)" if unjudged
                        else t.truncation_reason or "", unjudged)
        return True
    return False


def begin_episode(slot: int, recording: _Recording, faults: _FaultKeeper, k: int, task: Any,
                  outcome: tuple[Observation, int] | DeviceError) -> Episode | None:
    """Start recording episode ``k`` from a reset's outcome; None when it started, else the
    infrastructure-truncated episode (no steps) that stands for it (counted with
    :meth:`_FaultKeeper.start_failed` by the caller)."""
    if not isinstance(outcome, DeviceError):
        faults.started(slot)
        recording.begin(slot, k, task, *outcome)
        return None
    why = "the task's setup failed" if outcome.task_fault else "reset failed twice"
    ep = recording.failed_reset(k, task, f"{why}: {outcome}"[:500])
    faults.finished(slot, ep, "worker")
    return ep


def record_result(slot: int, recording: _Recording, faults: _FaultKeeper, text: str,
                  result: Any, policy_s: float,
                  version: int) -> tuple[int, Episode, str | None] | None:
    """One step's outcome (a step tuple or a :class:`DeviceError`) into the recording.

    Returns None while the episode goes on, else ``(k, episode, restart)`` where
    ``restart`` is the reason the device must now be restarted (None: it need not be).
    """
    if isinstance(result, DeviceError):
        k, ep = recording.abort(slot, str(result))
        faults.finished(slot, ep, "worker")
        return k, ep, str(result)
    out = recording.record(slot, text, result, policy_s, version)
    faults.judged(result[4])
    if out is None:
        return None
    k, ep = out
    reset = faults.finished(slot, ep, "device" if ep.trajectory.is_infra_truncated else None)
    return k, ep, ("" if reset else None)


class _DeviceFleet:
    """What every fleet has: devices, fault counts, a context manager that closes them."""

    devices: list[Any]
    _faults: _FaultKeeper

    @property
    def stats(self) -> FleetStats:
        return self._faults.stats

    def close(self) -> None:
        self._close_devices()

    def _close_devices(self) -> None:
        for d in self.devices:
            try:
                d.close()
            except Exception as e:  # closing the rest matters more
                log.warning("device %d: close failed: %s", d.slot, e)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SyncFleet(_DeviceFleet):
    """Lockstep collection: every phone steps, then one batched policy call for all.

    Args:
        make_env: callable ``slot -> env`` (picklable for ``backend="process"``).
        n_envs: number of phones.
        backend: ``"local"`` (environments in this process) or ``"process"`` (one spawned
            worker process each).
        record_size: screenshot size workers send back (process backend).
        timeout_s: per-call limit for process workers (a hung worker is restarted).
        max_consecutive_faults: infrastructure truncations in a row before a device is reset.
        max_unjudged_steps: stop collecting (:class:`JudgeUnavailable`) after this many
            unjudged steps in a row, across devices (0: never).
        max_unjudged_s: stop the same way when no step was judged for this many seconds
            (0: never), whichever comes first.
        max_task_attempts: attempts of a task that infrastructure faults end (it never
            started, or was cut short): each goes back to the queue, with the same id and
            seed, for another device (issue 29; 1: none).
        quarantine_after: a device whose starts fail this many times in a row leaves the
            fleet (one log line naming it, :attr:`FleetStats.device_events`); 0: never.
            With no device left, :class:`NoDevicesLeft`.
        quarantine_probe_s: how often a quarantined device is probed (a restart, then a
            start on the next task); it rejoins when it answers.
        quarantined: slots that start quarantined (endpoints unreachable when the run
            started, :attr:`~digirl_lite.envs.setup.Phones.down`).
        parallel_steps: step the phones of a batch in threads (the batch then takes as long
            as its slowest phone, not the sum); off keeps everything on one thread.

    ``policy_version`` is recorded on every step; the learner bumps it after an update.
    """

    def __init__(self, make_env: Callable[[int], Any], n_envs: int = 16, *,
                 backend: str = "local", record_size: tuple[int, int] | None = RECORD_SIZE,
                 timeout_s: float = 120.0, max_consecutive_faults: int = 3,
                 max_unjudged_steps: int = 0, parallel_steps: bool = True,
                 max_task_attempts: int = 3, quarantine_after: int = 3,
                 quarantine_probe_s: float = 30.0, max_unjudged_s: float = 0.0,
                 quarantined: Sequence[int] = ()) -> None:
        if n_envs < 1:
            raise ValueError(f"n_envs must be >= 1, got {n_envs}")
        if max_task_attempts < 1:
            raise ValueError(f"max_task_attempts must be >= 1, got {max_task_attempts}")
        self.n_envs, self.make_env = n_envs, make_env
        self.policy_version = 0
        self.max_task_attempts = max_task_attempts
        self._faults = _FaultKeeper(max_consecutive_faults, max_unjudged_steps,
                                    quarantine_after, quarantine_probe_s, max_unjudged_s)
        self.devices = make_devices(make_env, n_envs, backend, record_size, timeout_s)
        self._quarantined: dict[int, float] = {  # slot -> when to probe it next
            s: time.monotonic() for s in self._faults.quarantine_at_start(
                self.devices, quarantined)}
        self._benched: set[int] = set()  # failed a start, not quarantined (see _bench)
        self._stale_probes: dict[int, Any] = {}  # slot -> a stopped collection's probe
        self._pool = ThreadPoolExecutor(n_envs, "sync-fleet") if (
            parallel_steps and n_envs > 1) else None
        self._probe_pool: ThreadPoolExecutor | None = None

    def _step(self, device: Any, text: str):
        try:
            return device.step(text)
        except DeviceError as e:
            return e

    def collect(
        self, agent: BatchAgent, tasks: Sequence[Any], screens: ScreenTable, *,
        id_prefix: str, source: Source = Source.ONLINE, iteration: int = -1,
        seed: int = 0, record_size: tuple[int, int] | None = RECORD_SIZE,
        on_step: Callable[[int, Observation], None] | None = None,
        reset_options: dict[str, Any] | None = None, retry_unjudged: bool = False,
    ) -> list[Episode]:
        """Run every task once; returns episodes in task order.

        Episode ``k`` gets trajectory id ``{id_prefix}-{k:05d}`` and env seed ``seed + k``.
        ``on_step(slot, obs)`` sees every new observation (e.g. to fill a feature cache).
        ``reset_options`` go to every reset (e.g. the simulated phone's ``{"day": d}``).
        ``retry_unjudged``: an episode with an unjudged step is run again, as one an
        infrastructure fault ended (within ``max_task_attempts``; evaluations use it).
        """
        rec = _Recording(screens, id_prefix=id_prefix, source=source, iteration=iteration,
                         seed=seed, record_size=record_size, on_step=on_step,
                         reset_options=reset_options)
        tasks = list(tasks)
        self._faults.collecting()
        queue = _TaskQueue(tasks, self.max_task_attempts,
                           live={d.slot for d in self.devices} - set(self._quarantined),
                           retry_unjudged=retry_unjudged, free_starts=True)
        done: dict[int, Episode] = {}

        def settle(slot: int, k: int, ep: Episode, probe: bool = False,
                   unstarted: bool = False) -> None:
            if not settle_episode(queue, self._faults, slot, k, ep, probe, unstarted):
                done[k] = ep

        def start(slot: int) -> None:
            dev = self.devices[slot]
            while (item := queue.next_for(slot)) is not None:
                k, task = item
                outcome = reset_device(dev, self._faults, task, seed + k, rec.reset_options)
                failed = begin_episode(slot, rec, self._faults, k, task, outcome)
                if failed is None:
                    return
                settle(slot, k, failed, unstarted=not outcome.task_fault)
                if outcome.task_fault:  # the task's setup failed, not the device
                    continue
                if self._faults.start_failed(slot, str(outcome)):
                    self._quarantine(dev, queue, str(outcome))
                else:  # its next starts run beside the lockstep, not in it
                    self._bench(dev, queue)
                return

        # probes of quarantined devices run in threads of their own, so a device that hangs
        # does not hold up the others' lockstep; what they find is recorded here
        probes: dict[int, tuple[int, Any, Any]] = {}  # slot -> (k, task, future)

        def probe(now: bool = False) -> None:
            """Start the probes that are due (``now``: every quarantined device's, then wait
            for them); record the probes that have finished: a device that started its
            episode rejoins, one that did not gives the task back (its attempt too)."""
            for slot, due in sorted(self._quarantined.items()):
                if slot in probes or not (now or time.monotonic() >= due):
                    continue
                self._quarantined[slot] = time.monotonic() + (
                    BENCH_RETRY_S if slot in self._benched else self._faults.quarantine_probe_s)
                if slot in self._stale_probes and not self._stale_probes[slot].done():
                    continue  # a probe of a stopped collection still runs on this device
                self._stale_probes.pop(slot, None)
                if (item := queue.next_for(slot)) is None:
                    continue
                k, task = item
                probes[slot] = (k, task, self._probes().submit(
                    probe_reset, self.devices[slot], self._faults, task, seed + k,
                    rec.reset_options))
            for slot, (k, task, fut) in list(probes.items()):
                if not (now or fut.done()):
                    continue
                outcome = fut.result()
                del probes[slot]
                failed = begin_episode(slot, rec, self._faults, k, task, outcome)
                dev = self.devices[slot]
                if slot in self._benched:  # a device that failed a start, not yet out
                    if failed is None:
                        self._benched.discard(slot)
                        self._quarantined.pop(slot, None)
                        queue.set_live(slot, True)
                        continue
                    settle(slot, k, failed, unstarted=not outcome.task_fault)
                    if not outcome.task_fault and self._faults.start_failed(slot,
                                                                            str(outcome)):
                        self._benched.discard(slot)
                        self._quarantine(dev, queue, str(outcome))
                    else:
                        self._quarantined[slot] = time.monotonic() + BENCH_RETRY_S
                elif failed is None:
                    self._rejoin(dev, queue)
                else:
                    settle(slot, k, failed, probe=True)

        try:
            self._lockstep(agent, rec, start, settle, probe, probes, queue)
        except (JudgeUnavailable, NoDevicesLeft) as e:
            for slot, (_, _, fut) in probes.items():  # their tasks are not recorded; one
                if not fut.cancel():  # still running keeps its device from a second probe
                    self._stale_probes[slot] = fut
            e.episodes = [done[k] for k in sorted(done)]
            raise
        return [done[k] for k in range(len(tasks))]

    def _probes(self) -> ThreadPoolExecutor:
        if self._probe_pool is None:
            self._probe_pool = ThreadPoolExecutor(self.n_envs, "sync-fleet-probe")
        return self._probe_pool

    def _bench(self, dev: Any, queue: _TaskQueue) -> None:
        """A device whose start failed, short of ``quarantine_after`` failures in a row:
        out of the lockstep (a dead device's reconnects would hold up every phone's batch),
        its next starts run as probes in threads of their own, each failure counted towards
        the quarantine; a start that works brings it back without a line."""
        self._benched.add(dev.slot)
        self._quarantined[dev.slot] = time.monotonic()
        queue.set_live(dev.slot, False)

    def _quarantine(self, dev: Any, queue: _TaskQueue, reason: str) -> None:
        self._quarantined[dev.slot] = time.monotonic() + self._faults.quarantine_probe_s
        queue.set_live(dev.slot, False)
        self._faults.device_event(dev, "quarantined", reason)

    def _rejoin(self, dev: Any, queue: _TaskQueue) -> None:
        self._quarantined.pop(dev.slot, None)
        queue.set_live(dev.slot, True)
        self._faults.device_event(dev, "returned")

    def _lockstep(self, agent: BatchAgent, rec: _Recording, start: Callable[[int], None],
                  settle: Callable[..., None], probe: Callable[..., None], probes: dict,
                  queue: _TaskQueue) -> None:
        for slot in sorted(queue.live):
            start(slot)
        while True:
            probe()
            if queue.pending:  # a task a fault sent back, for a device that has none
                for slot in sorted(queue.live - set(rec.active)):
                    start(slot)
            if not rec.active:
                if probes:  # nothing to step: wait for the probes in flight
                    probe(now=True)
                    continue
                if not queue.pending:
                    return
                if not queue.live:
                    probe(now=True)
                    if not rec.active and not self._benched:
                        raise self._faults.no_devices_left(
                            [self.devices[s] for s in sorted(self._quarantined)])
                continue
            slots = sorted(rec.active)
            t0 = time.perf_counter()
            texts = agent.act_batch(slots, [rec.obs(s) for s in slots])
            policy_s = (time.perf_counter() - t0) / max(1, len(slots))
            version = self.policy_version
            devs = [self.devices[s] for s in slots]
            if self._pool is not None and len(slots) > 1:
                results = list(self._pool.map(self._step, devs, texts))
            else:
                results = [self._step(d, t) for d, t in zip(devs, texts)]
            for dev, text, res in zip(devs, texts, results):
                out = record_result(dev.slot, rec, self._faults, text, res, policy_s, version)
                if out is not None:
                    k, ep, restart = out
                    settle(dev.slot, k, ep)
                    if restart is not None:
                        restart_device(dev, self._faults, restart)
                    start(dev.slot)

    def close(self) -> None:
        for pool in (self._pool, self._probe_pool):
            if pool is not None:
                pool.shutdown(wait=True)
        self._close_devices()


def make_devices(make_env: Callable[[int], Any], n_envs: int, backend: str,
                 record_size: tuple[int, int] | None, timeout_s: float) -> list[Any]:
    """``n_envs`` devices of ``backend`` ("local" or "process")."""
    if backend == "local":
        return [LocalDevice(make_env, i) for i in range(n_envs)]
    if backend == "process":
        return [ProcessDevice(make_env, i, record_size, timeout_s) for i in range(n_envs)]
    raise ValueError(f"backend must be 'local' or 'process', got {backend!r}")


class LocalFleet(SyncFleet):
    """:class:`SyncFleet` with the environments in this process (the simulated phone)."""

    def __init__(self, make_env: Callable[[int], Any], n_envs: int = 16, **options: Any) -> None:
        super().__init__(make_env, n_envs, backend="local", **options)

    @property
    def envs(self) -> list[Any]:
        return [d.env for d in self.devices]


class ProcessFleet(SyncFleet):
    """:class:`SyncFleet` with one worker process per environment.

    A worker that dies (or whose environment raises) ends its episode as an infrastructure
    truncation and is restarted (:attr:`restarts`).
    """

    def __init__(self, make_env: Callable[[int], Any], n_envs: int = 4,
                 record_size: tuple[int, int] | None = RECORD_SIZE, timeout_s: float = 120.0,
                 **options: Any) -> None:
        super().__init__(make_env, n_envs, backend="process", record_size=record_size,
                         timeout_s=timeout_s, **options)

    @property
    def restarts(self) -> int:
        return self.stats.worker_restarts
