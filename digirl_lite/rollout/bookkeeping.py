"""Recording and fault bookkeeping shared by every fleet (:mod:`.fleet`, :mod:`.async_fleet`,
:mod:`.ray_fleet`): the episodes of one collection, the faults per device (resets, restarts,
quarantine, the judge's silence), and the steps every fleet takes on a device's reset or step
outcome.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from digirl_lite.data.records import Ending, ScreenTable, Source, Trajectory, Verdict
from digirl_lite.envs.base import Observation
from digirl_lite.rollout.devices import DeviceError, LocalDevice, ProcessDevice
from digirl_lite.rollout.episode import EpisodeRecorder
from digirl_lite.rollout.fleet_types import Episode, FleetStats, JudgeUnavailable, NoDevicesLeft
from digirl_lite.rollout.task_queue import _TaskQueue

__all__ = ["device_name", "task_text", "restart_device", "reset_device", "probe_reset",
           "settle_episode", "begin_episode", "record_result", "make_devices"]

log = logging.getLogger("digirl_lite.rollout")
UNREACHABLE_AT_START = "unreachable at the start"


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


def make_devices(make_env: Callable[[int], Any], n_envs: int, backend: str,
                 record_size: tuple[int, int] | None, timeout_s: float) -> list[Any]:
    """``n_envs`` devices of ``backend`` ("local" or "process")."""
    if backend == "local":
        return [LocalDevice(make_env, i) for i in range(n_envs)]
    if backend == "process":
        return [ProcessDevice(make_env, i, record_size, timeout_s) for i in range(n_envs)]
    raise ValueError(f"backend must be 'local' or 'process', got {backend!r}")
