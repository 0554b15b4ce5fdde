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
           "LocalFleet", "ProcessFleet", "JudgeUnavailable"]

log = logging.getLogger("digirl_lite.rollout")


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
    """A finished episode: the trajectory and the ground-truth states it visited (sim)."""

    trajectory: Trajectory
    states: list[Any]
    task: Any


@dataclass
class FleetStats:
    """What a fleet has collected and survived since it was built.

    Attributes:
        episodes: finished episodes returned (infrastructure truncations included).
        steps: environment steps recorded.
        infra_truncations: episodes ended by the infrastructure, by cause: ``"device"``
            (the environment reported it: crash, blank screens) or ``"worker"`` (a device
            error: dead or hung worker, an environment that raised).
        device_resets: resets of a device after ``max_consecutive_faults`` faults in a row.
        worker_restarts: restarts after a device error (worker process, Ray actor or
            environment, whichever failed).
        discarded_unfinished: episodes still running when an asynchronous collection
            stopped (never recorded).
        discarded_out_of_order: completed episodes an asynchronous collection in task
            order dropped at its stop because an episode that started before them was
            still running (keeping them would favour short episodes).
    """

    episodes: int = 0
    steps: int = 0
    infra_truncations: dict[str, int] = field(default_factory=lambda: {"device": 0,
                                                                         "worker": 0})
    device_resets: int = 0
    worker_restarts: int = 0
    discarded_unfinished: int = 0
    discarded_out_of_order: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "steps": self.steps,
                "infra_truncations": dict(self.infra_truncations),
                "device_resets": self.device_resets, "worker_restarts": self.worker_restarts,
                "discarded_unfinished": self.discarded_unfinished,
                "discarded_out_of_order": self.discarded_out_of_order}


class JudgeUnavailable(RuntimeError):
    """``max_unjudged_steps`` steps in a row came back unjudged: the judge cannot answer
    (a revoked key, an API that is down). Collection stops; :attr:`episodes` holds the
    episodes that had finished (in task order), so nothing collected is lost, and
    :attr:`reason` the last step's reason."""

    def __init__(self, n: int, reason: str) -> None:
        super().__init__(f"{n} steps in a row were unjudged; the last one: {reason}")
        self.n, self.reason = n, reason
        self.episodes: list[Episode] = []


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
        return k, Episode(rec.trajectory, rec.states, task)

    def abort(self, slot: int, reason: str) -> tuple[int, Episode]:
        k, task, rec = self.active.pop(slot)
        return k, Episode(rec.abort(reason), rec.states, task)

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

    def __init__(self, max_consecutive_faults: int, max_unjudged_steps: int = 0) -> None:
        if max_consecutive_faults < 1 or max_unjudged_steps < 0:
            raise ValueError("max_consecutive_faults must be >= 1, max_unjudged_steps >= 0")
        self.max_consecutive_faults = max_consecutive_faults
        self.max_unjudged_steps = max_unjudged_steps
        self.unjudged_in_a_row = 0
        self.stats = FleetStats()
        self._in_a_row: dict[int, int] = {}
        self._lock = threading.Lock()

    def judged(self, info: dict[str, Any]) -> None:
        """Count one step's verdict; raise :class:`JudgeUnavailable` at the limit."""
        verdict = info.get("verdict")
        if verdict is None:  # an infrastructure step: no verdict either way
            return
        if Verdict(verdict) is not Verdict.UNJUDGED:
            self.unjudged_in_a_row = 0
            return
        self.unjudged_in_a_row += 1
        if self.max_unjudged_steps and self.unjudged_in_a_row >= self.max_unjudged_steps:
            raise JudgeUnavailable(self.unjudged_in_a_row,
                                   str(info.get("judge_skipped") or "no reason given"))

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
    error."""
    args = (task, seed, options) if options else (task, seed)
    try:
        return device.reset(*args)
    except DeviceError as e:
        restart_device(device, faults, f"reset failed ({e})")
    try:
        return device.reset(*args)
    except DeviceError as e:
        return e


def begin_episode(slot: int, recording: _Recording, faults: _FaultKeeper, k: int, task: Any,
                  outcome: tuple[Observation, int] | DeviceError) -> Episode | None:
    """Start recording episode ``k`` from a reset's outcome; None when it started, else the
    infrastructure-truncated episode (no steps) that stands for it."""
    if not isinstance(outcome, DeviceError):
        recording.begin(slot, k, task, *outcome)
        return None
    ep = recording.failed_reset(k, task, f"reset failed twice: {outcome}"[:500])
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
        parallel_steps: step the phones of a batch in threads (the batch then takes as long
            as its slowest phone, not the sum); off keeps everything on one thread.

    ``policy_version`` is recorded on every step; the learner bumps it after an update.
    """

    def __init__(self, make_env: Callable[[int], Any], n_envs: int = 16, *,
                 backend: str = "local", record_size: tuple[int, int] | None = RECORD_SIZE,
                 timeout_s: float = 120.0, max_consecutive_faults: int = 3,
                 max_unjudged_steps: int = 0, parallel_steps: bool = True) -> None:
        if n_envs < 1:
            raise ValueError(f"n_envs must be >= 1, got {n_envs}")
        self.n_envs, self.make_env = n_envs, make_env
        self.policy_version = 0
        self._faults = _FaultKeeper(max_consecutive_faults, max_unjudged_steps)
        self.devices = make_devices(make_env, n_envs, backend, record_size, timeout_s)
        self._pool = ThreadPoolExecutor(n_envs, "sync-fleet") if (
            parallel_steps and n_envs > 1) else None

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
        reset_options: dict[str, Any] | None = None,
    ) -> list[Episode]:
        """Run every task once; returns episodes in task order.

        Episode ``k`` gets trajectory id ``{id_prefix}-{k:05d}`` and env seed ``seed + k``.
        ``on_step(slot, obs)`` sees every new observation (e.g. to fill a feature cache).
        ``reset_options`` go to every reset (e.g. the simulated phone's ``{"day": d}``).
        """
        rec = _Recording(screens, id_prefix=id_prefix, source=source, iteration=iteration,
                         seed=seed, record_size=record_size, on_step=on_step,
                         reset_options=reset_options)
        queue = list(enumerate(tasks))[::-1]
        done: dict[int, Episode] = {}

        def start(slot: int) -> None:
            dev = self.devices[slot]
            while queue:
                k, task = queue.pop()
                outcome = reset_device(dev, self._faults, task, seed + k, rec.reset_options)
                failed = begin_episode(slot, rec, self._faults, k, task, outcome)
                if failed is None:
                    return
                done[k] = failed

        try:
            self._lockstep(agent, rec, start, done)
        except JudgeUnavailable as e:
            e.episodes = [done[k] for k in sorted(done)]
            raise
        return [done[k] for k in range(len(tasks))]

    def _lockstep(self, agent: BatchAgent, rec: _Recording, start: Callable[[int], None],
                  done: dict[int, Episode]) -> None:
        for slot in range(self.n_envs):
            start(slot)
        while rec.active:
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
                    done[k] = ep
                    if restart is not None:
                        restart_device(dev, self._faults, restart)
                    start(dev.slot)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
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
