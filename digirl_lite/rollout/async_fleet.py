"""Asynchronous collection (spec/DARWIN.md section A.1): no phone waits for another.

Each device has a worker thread that resets its phone, waits for an action, steps, and pushes
the finished step to one central queue. The fleet's loop takes whatever is in the queue,
records it, and runs one batched policy call on every phone that is ready at that moment
(``min_batch`` / ``batch_wait_s`` trade a little waiting for bigger batches). A slow phone
delays only its own episode; the number of phones is decoupled from the batch size.

Two ways to use it:

* ``collect(agent, tasks, screens, ...)``: every task once, episodes in task order (the
  synchronous fleet's interface, so the trainer can swap fleets by name).
* ``start(agent, tasks, screens, ...)`` then ``take(k)`` as often as the learner wants: ``take``
  returns ``k`` *completed* trajectories once they are in and carries the rest over; active
  episodes keep running meanwhile (no bootstrapping from a truncated middle). Which ``k``: with
  ``order="completion"`` (Darwin's, A.1) the first to complete, which favours short episodes (and
  in a simulated shop successes are shorter than failures); with ``order="start"`` the ``k`` that
  started first, waiting for the oldest, so what the learner sees does not depend on how long an
  episode took. Wrap weight updates in ``with fleet.updating_policy():`` so no batch is sampled
  from half-updated weights; each step records the ``policy_version`` that wrote it, so staleness
  is measurable. ``stop()`` discards the episodes still running and returns the completed ones no
  ``take`` returned.

Devices run where :mod:`.devices` puts them: ``backend="local"`` (threads over in-process
environments: for phones whose steps wait on a device, not on this CPU) or ``"process"``.
The Ray fleet (:mod:`.ray_fleet`) reuses this loop with devices in Ray actors.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from digirl_lite.data.records import ScreenTable, Source
from digirl_lite.envs.base import Observation
from digirl_lite.rollout.bookkeeping import (
    _DeviceFleet,
    _FaultKeeper,
    _Recording,
    begin_episode,
    log,
    make_devices,
    probe_reset,
    record_result,
    reset_device,
    restart_device,
    settle_episode,
)
from digirl_lite.rollout.devices import DeviceError
from digirl_lite.rollout.episode import RECORD_SIZE
from digirl_lite.rollout.fleet_types import BatchAgent, Episode, JudgeUnavailable, NoDevicesLeft
from digirl_lite.rollout.task_queue import _TaskQueue

__all__ = ["AsyncFleet", "TAKE_ORDERS"]

_STOP = object()
TAKE_ORDERS = ("completion", "start")


class AsyncFleet(_DeviceFleet):
    """Per-device workers, a central inference queue, completed trajectories on demand.

    Args:
        make_env: callable ``slot -> env`` (picklable for ``backend="process"``).
        n_envs: number of phones (workers).
        backend: ``"local"`` or ``"process"`` (see :mod:`.devices`).
        min_batch: the policy runs once this many phones are ready, or after
            ``batch_wait_s``, or when no other phone is busy.
        batch_wait_s: longest wait for ``min_batch`` phones (0: batch whatever is ready).
        record_size: screenshot size workers send back (process backend).
        timeout_s: per-call limit for process workers.
        max_consecutive_faults: infrastructure truncations in a row before a device is reset.
        max_unjudged_steps: stop collecting (:class:`~.fleet.JudgeUnavailable`, with the
            finished episodes) after this many unjudged steps in a row (0: never).
        max_unjudged_s, max_task_attempts, quarantine_after, quarantine_probe_s,
            quarantined: as :class:`~.fleet.SyncFleet`
            (a task a fault ended goes back to the queue; a device whose starts fail
            ``quarantine_after`` times in a row leaves the fleet and its worker probes it
            every ``quarantine_probe_s``; no device left: :class:`~.fleet.NoDevicesLeft`).
    """

    def __init__(self, make_env: Callable[[int], Any], n_envs: int = 16, *,
                 backend: str = "local", min_batch: int = 1, batch_wait_s: float = 0.0,
                 record_size: tuple[int, int] | None = RECORD_SIZE, timeout_s: float = 120.0,
                 max_consecutive_faults: int = 3, max_unjudged_steps: int = 0,
                 devices: list[Any] | None = None, max_task_attempts: int = 3,
                 quarantine_after: int = 3, quarantine_probe_s: float = 30.0,
                 max_unjudged_s: float = 0.0, quarantined: Sequence[int] = ()) -> None:
        if n_envs < 1 or min_batch < 1 or batch_wait_s < 0 or max_task_attempts < 1:
            raise ValueError("n_envs, min_batch and max_task_attempts must be >= 1, "
                             "batch_wait_s >= 0")
        self.n_envs, self.make_env = n_envs, make_env
        self.min_batch, self.batch_wait_s = min_batch, batch_wait_s
        self.max_task_attempts = max_task_attempts
        self.policy_version = 0
        self._faults = _FaultKeeper(max_consecutive_faults, max_unjudged_steps,
                                    quarantine_after, quarantine_probe_s, max_unjudged_s)
        self.devices = devices if devices is not None else make_devices(
            make_env, n_envs, backend, record_size, timeout_s)
        self._quarantined: set[int] = set(self._faults.quarantine_at_start(self.devices,
                                                                           quarantined))
        self._policy_lock = threading.Lock()
        self._loop: threading.Thread | None = None
        self._order, self._next_k = "completion", 0

    # -- the learner's side -------------------------------------------------------------
    @contextlib.contextmanager
    def updating_policy(self, version: int | None = None):
        """Hold inference while the weights change; afterwards steps carry ``version``
        (default: the current version + 1)."""
        with self._policy_lock:
            yield
            self.policy_version = self.policy_version + 1 if version is None else version

    def collect(
        self, agent: BatchAgent | None, tasks: Sequence[Any], screens: ScreenTable, *,
        id_prefix: str, source: Source = Source.ONLINE, iteration: int = -1,
        seed: int = 0, record_size: tuple[int, int] | None = RECORD_SIZE,
        on_step: Callable[[int, Observation], None] | None = None,
        reset_options: dict[str, Any] | None = None, retry_unjudged: bool = False,
    ) -> list[Episode]:
        """Run every task once; returns episodes in task order (as :class:`SyncFleet`)."""
        self.start(agent, tasks, screens, id_prefix=id_prefix, source=source,
                   iteration=iteration, seed=seed, record_size=record_size, on_step=on_step,
                   reset_options=reset_options, retry_unjudged=retry_unjudged)
        try:
            self._finished.wait()
            self._raise_if_failed()
            done = dict(self._take_all())
        finally:
            self.stop()
        return [done[k] for k in range(len(tasks))]

    def start(
        self, agent: BatchAgent | None, tasks: Iterable[Any], screens: ScreenTable, *,
        id_prefix: str, source: Source = Source.ONLINE, iteration: int = -1,
        seed: int = 0, record_size: tuple[int, int] | None = RECORD_SIZE,
        on_step: Callable[[int, Observation], None] | None = None,
        reset_options: dict[str, Any] | None = None, order: str = "completion",
        retry_unjudged: bool = False,
    ) -> None:
        """Start collecting in the background; ``tasks`` may be endless (an iterator).

        Task ``k`` (in ``tasks`` order) gets trajectory id ``{id_prefix}-{k:05d}`` and env
        seed ``seed + k``; ``reset_options`` go to every reset. ``agent=None``: the devices
        choose their actions themselves (devices with ``act_and_step``, e.g. the Ray fleet's
        ``worker_agent``). ``order``: which completed episodes :meth:`take` and :meth:`stop`
        hand out, ``"completion"`` (the first to complete) or ``"start"`` (task order: a take
        waits for the oldest running episode; a stop keeps only the completed episodes that
        started before the oldest one still running). ``retry_unjudged``: as
        :meth:`SyncFleet.collect`.
        """
        if self._loop is not None:
            raise RuntimeError("this fleet is already collecting: stop() first")
        if order not in TAKE_ORDERS:
            raise ValueError(f"order must be one of {TAKE_ORDERS}, got {order!r}")
        self._order, self._next_k = order, 0
        self._agent = agent
        self._rec = _Recording(screens, id_prefix=id_prefix, source=source,
                               iteration=iteration, seed=seed, record_size=record_size,
                               on_step=on_step, reset_options=reset_options)
        self._faults.collecting()
        self._queue = _TaskQueue(tasks, self.max_task_attempts,
                                 live={d.slot for d in self.devices} - self._quarantined,
                                 retry_unjudged=retry_unjudged, free_starts=True)
        # with no device live, every quarantined one is probed at once (not after its
        # interval), and the collection gives up only when each such probe has failed
        self._probe_now = threading.Event()
        self._probed_while_empty: set[int] = set()
        if not self._queue.live:
            self._probe_now.set()
        self._events: queue.Queue = queue.Queue()
        self._boxes = [queue.Queue() for _ in self.devices]
        self._completed: deque[tuple[int, Episode]] = deque()
        self._cond = threading.Condition()
        self._finished = threading.Event()
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._workers = [threading.Thread(target=self._work, args=(d,), daemon=True,
                                          name=f"fleet-device-{d.slot}") for d in self.devices]
        self._loop = threading.Thread(target=self._run, daemon=True, name="fleet-loop")
        for w in self._workers:
            w.start()
        self._loop.start()

    def take(self, k: int = 16, timeout_s: float | None = None) -> list[Episode]:
        """``k`` completed episodes, once they are in (fewer only when the tasks ran out):
        the first ``k`` to complete, or with ``start(order="start")`` the next ``k`` in task
        order; completed ones not returned are carried over to the next call.

        Raises:
            TimeoutError: the ``k`` were not in after ``timeout_s``.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._ready(k) < k and not self._finished.is_set() \
                    and self._error is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{self._ready(k)} of {k} trajectories "
                                       f"completed in {timeout_s} s")
                self._cond.wait(left if left is not None else 1.0)
            self._raise_if_failed()
            if self._order == "completion":
                n = min(k, len(self._completed))
                return [self._completed.popleft()[1] for _ in range(n)]
            done = dict(self._completed)
            if self._finished.is_set():  # the tasks ran out: every started one is in
                ks = sorted(done)[:k]
            else:
                ks = list(range(self._next_k, self._next_k + k))
            self._completed = deque((i, e) for i, e in self._completed if i not in ks)
            self._next_k = max(ks, default=self._next_k - 1) + 1
            return [done[i] for i in ks]

    def _ready(self, k: int) -> int:
        """How many of the episodes the next ``take(k)`` would return are in."""
        if self._order == "completion":
            return len(self._completed)
        done = {i for i, _ in self._completed}
        n = 0
        while n < k and self._next_k + n in done:
            n += 1
        return n

    def stop(self) -> list[Episode]:
        """Stop collecting; episodes still running are discarded (never recorded). Returns
        the completed episodes no ``take`` had returned yet (oldest first), for the caller
        to carry over; with ``order="start"`` only those that started before the oldest
        episode that did not complete (the others count in
        ``stats.discarded_out_of_order``)."""
        if self._loop is None:
            return []
        self._stopping.set()
        self._queue.close()
        for box in self._boxes:
            box.put(_STOP)
        self._loop.join()
        for w in self._workers:
            w.join()
        discarded = len(self._rec.active)
        self.stats.discarded_unfinished += discarded
        if discarded:
            log.info("async fleet stopped: %d unfinished episodes discarded", discarded)
        self._rec.active.clear()
        self._loop = None
        if self._order == "completion":
            return [e for _, e in self._take_all()]
        # task order: keep what started before the oldest episode that did not complete;
        # what completed after it would favour short episodes
        done, kept = dict(self._take_all()), []
        while self._next_k in done:
            kept.append(done.pop(self._next_k))
            self._next_k += 1
        self.stats.discarded_out_of_order += len(done)
        return kept

    def close(self) -> None:
        self.stop()
        self._close_devices()

    # -- workers: one thread per device; every call to a device happens here -----------
    def _wait_probe(self) -> bool:
        """A quarantined device's worker waits ``quarantine_probe_s`` before probing it (no
        wait while no device is live); False when collection stops or every task is settled
        meanwhile."""
        due = time.monotonic() + self._faults.quarantine_probe_s
        while time.monotonic() < due and not self._probe_now.is_set():
            if self._stopping.is_set() or self._queue.finished:
                return False
            time.sleep(min(0.2, max(0.0, due - time.monotonic())))
        return not (self._stopping.is_set() or self._queue.finished)

    def _work(self, device: Any) -> None:
        box = self._boxes[device.slot]
        probe = device.slot in self._quarantined
        while not (probe and not self._wait_probe()):
            item = self._queue.next_for(device.slot, wait=True)
            if item is None:
                break
            k, task = item
            if probe:  # a quarantined device: a fresh start, one reset, no second try
                outcome = probe_reset(device, self._faults, task, self._rec.seed + k,
                                      self._rec.reset_options)
            else:
                outcome = reset_device(device, self._faults, task, self._rec.seed + k,
                                       self._rec.reset_options)
            self._events.put(("reset", device.slot, (k, task, outcome, probe)))
            while True:
                msg = box.get()
                if msg is _STOP:
                    return
                if msg[0] == "over":
                    _, restart, probe = msg
                    if restart is not None:  # a device error or a run of faults
                        restart_device(device, self._faults, restart)
                    break
                if msg[0] == "act":
                    _, text, version, policy_s = msg
                    try:
                        result = device.step(text)
                    except DeviceError as e:
                        result = e
                else:  # "go": the device acts itself, with weights it was sent
                    try:
                        text, version, policy_s, result = device.act_and_step()
                    except DeviceError as e:
                        text, version, policy_s, result = "", -1, 0.0, e
                self._events.put(("step", device.slot, (text, version, policy_s, result)))
        self._events.put(("idle", device.slot, None))

    def _settle(self, slot: int, k: int, episode: Episode, probe: bool = False,
                unstarted: bool = False) -> None:
        """A finished episode: its task back to the queue, or the episode completed."""
        if not settle_episode(self._queue, self._faults, slot, k, episode, probe, unstarted):
            self._complete(k, episode)

    def _started(self, slot: int, k: int, task: Any, outcome: Any, probe: bool) -> bool:
        """A reset's outcome, in the loop; True when the device is (still) quarantined."""
        dev = self.devices[slot]
        failed = begin_episode(slot, self._rec, self._faults, k, task, outcome)
        if failed is None:
            if probe:
                self._quarantined.discard(slot)
                self._queue.set_live(slot, True)
                self._probe_now.clear()
                self._probed_while_empty.clear()
                self._faults.device_event(dev, "returned")
            return False
        self._settle(slot, k, failed, probe, unstarted=not outcome.task_fault)
        if probe:
            if self._probe_now.is_set():
                self._probed_while_empty.add(slot)
            return True
        if not outcome.task_fault and self._faults.start_failed(slot, str(outcome)):
            self._quarantined.add(slot)
            self._queue.set_live(slot, False)
            self._faults.device_event(dev, "quarantined", str(outcome))
            if not self._queue.live:  # the last one: probe every quarantined device now
                self._probed_while_empty.clear()
                self._probe_now.set()
            return True
        return False

    # -- the loop: recording and batched inference (never calls a device) ---------------
    def _run(self) -> None:
        try:
            self._loop_body()
        except BaseException as e:  # an agent bug, a judge or the devices gone: surfaces
            self._error = e         # in take()/collect()
            self._stopping.set()
            self._queue.close()  # the workers waiting for a task take none
            for box in self._boxes:
                box.put(_STOP)
        finally:
            with self._cond:
                self._finished.set()
                self._cond.notify_all()

    def _loop_body(self) -> None:
        ready: dict[int, float] = {}  # slot -> when it became ready for an action
        idle = 0
        while not self._stopping.is_set():
            if idle == len(self.devices):
                return
            try:
                events = [self._events.get(timeout=0.05 if ready else 0.2)]
            except queue.Empty:
                events = []
            with contextlib.suppress(queue.Empty):
                while True:
                    events.append(self._events.get_nowait())
            for kind, slot, payload in events:
                if kind == "idle":
                    idle += 1
                    continue
                if kind == "reset":
                    k, task, outcome, probe = payload
                    down = self._started(slot, k, task, outcome, probe)
                    if isinstance(outcome, DeviceError):  # no episode: the next task
                        self._boxes[slot].put(("over", None, down))
                        continue
                    out = None
                else:
                    text, version, policy_s, result = payload
                    out = record_result(slot, self._rec, self._faults, text, result,
                                        policy_s, version)
                if out is None and self._agent is None:
                    self._boxes[slot].put(("go",))
                elif out is None:
                    ready[slot] = time.monotonic()
                else:
                    self._settle(slot, out[0], out[1])
                    self._boxes[slot].put(("over", out[2], False))
            if not self._queue.live and not self._rec.active and self._queue.pending \
                    and self._probed_while_empty >= self._quarantined:
                raise self._faults.no_devices_left(
                    [self.devices[s] for s in sorted(self._quarantined)])
            if not ready:
                continue
            # resetting or stepping (a quarantined device waits for its probe)
            busy = len(self.devices) - idle - len(ready) - len(self._quarantined)
            if len(ready) < self.min_batch and busy > 0 \
                    and time.monotonic() - min(ready.values()) < self.batch_wait_s:
                continue
            self._act(ready)

    def _act(self, ready: dict[int, float]) -> None:
        slots = sorted(ready)
        obs = [self._rec.obs(s) for s in slots]
        with self._policy_lock:
            version = self.policy_version
            t0 = time.perf_counter()
            texts = self._agent.act_batch(slots, obs)
        policy_s = (time.perf_counter() - t0) / len(slots)
        for s, text in zip(slots, texts):
            self._boxes[s].put(("act", text, version, policy_s))
        ready.clear()

    def _complete(self, k: int, episode: Episode) -> None:
        with self._cond:
            self._completed.append((k, episode))
            self._cond.notify_all()

    def _take_all(self) -> list[tuple[int, Episode]]:
        with self._cond:
            out = list(self._completed)
            self._completed.clear()
            return out

    def _raise_if_failed(self) -> None:
        if isinstance(self._error, (JudgeUnavailable, NoDevicesLeft)):
            self._error.episodes = [e for _, e in sorted(self._take_all(), key=lambda x: x[0])]
            raise self._error
        if self._error is not None:
            raise RuntimeError("asynchronous collection failed") from self._error

