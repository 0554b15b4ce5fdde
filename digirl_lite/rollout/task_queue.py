"""The task queue of one collection: which device runs which task, and the attempts of the
tasks an infrastructure fault sent back (issue 29). Shared by every fleet."""

from __future__ import annotations

import threading
from typing import Any


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
