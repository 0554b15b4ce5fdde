"""Fleets: collect trajectories from N phones, with one batched policy call per decision.

:class:`SyncFleet` is the reference code's synchronous batch mode: all N phones step
together, the policy samples the N next actions in one batch, and a new step starts only
when the slowest phone has finished the last one. ``backend="local"`` keeps the environments
in this process, ``"process"`` gives each its own worker process (:mod:`.devices`).
:class:`LocalFleet` and :class:`ProcessFleet` are those two, under their earlier names.
The asynchronous fleet (:class:`~digirl_lite.rollout.async_fleet.AsyncFleet`) and the Ray
fleet share the recording and fault handling (:mod:`.bookkeeping`), the task queue
(:mod:`.task_queue`) and the episodes, counts and errors (:mod:`.fleet_types`) with it;
:func:`make_fleet` builds any of them by name (:mod:`.factory`, which sits above every
fleet). Those names are importable from here too.

Faults: a device error (dead worker, hung call, environment that raises) ends the episode as
an infrastructure truncation and restarts the device; a device whose episodes end in
infrastructure truncations ``max_consecutive_faults`` times in a row is reset too. Counts
are in :attr:`SyncFleet.stats` and logged. Such episodes are never agent failures:
:attr:`Trajectory.is_usable` keeps them out of the critics' labels and the actor's data
(see :func:`digirl_lite.rollout.faults.training_trajectories` for the Darwin option).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from digirl_lite.data.records import ScreenTable, Source
from digirl_lite.envs.base import Observation
from digirl_lite.rollout.bookkeeping import (
    _DeviceFleet,
    _FaultKeeper,
    _Recording,
    begin_episode,
    device_name,
    make_devices,
    probe_reset,
    record_result,
    reset_device,
    restart_device,
    settle_episode,
)
from digirl_lite.rollout.devices import DeviceError
from digirl_lite.rollout.episode import RECORD_SIZE
from digirl_lite.rollout.fleet_types import (
    BatchAgent,
    Episode,
    FleetStats,
    JudgeUnavailable,
    NoDevicesLeft,
    ScriptedBatchAgent,
)
from digirl_lite.rollout.task_queue import _TaskQueue

__all__ = ["BatchAgent", "ScriptedBatchAgent", "Episode", "FleetStats", "SyncFleet",
           "LocalFleet", "ProcessFleet", "JudgeUnavailable", "NoDevicesLeft", "device_name"]

BENCH_RETRY_S = 1.0
"""How soon a device that failed a start (and has not yet left the fleet) tries the next one,
beside the synchronous fleet's lockstep."""


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
