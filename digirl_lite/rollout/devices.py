"""Devices: one environment behind the calls a fleet makes, wherever the environment lives.

A fleet drives each phone through a :class:`Device`: ``reset`` / ``step`` / ``restart`` /
``close``. Where the environment runs is the device's business: :class:`LocalDevice` keeps
it in this process, :class:`ProcessDevice` in a spawned worker process, and the Ray fleet in
a Ray actor (:mod:`digirl_lite.rollout.ray_fleet`). Whatever goes wrong below the
environment interface (a dead worker, a hung call, an environment that raises) surfaces as
:class:`DeviceError`, which every fleet turns into an infrastructure truncation, never an
agent failure; ``restart`` then gives the slot a fresh environment.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from PIL import Image

from digirl_lite.envs.base import Observation
from digirl_lite.rollout.episode import RECORD_SIZE

__all__ = ["Device", "DeviceError", "LocalDevice", "ProcessDevice", "is_task_fault",
           "reset_env", "shrink_obs"]


class DeviceError(RuntimeError):
    """The device, its worker or its environment failed (not the agent's doing).

    ``task_fault``: the device answered, but the task's setup phase failed
    (:class:`~digirl_lite.envs.lifecycle.PhaseFailed`): the task goes back to the queue, and
    the device does not count it toward its quarantine (issue 29)."""

    def __init__(self, message: str, task_fault: bool = False) -> None:
        super().__init__(message)
        self.task_fault = task_fault


def is_task_fault(e: BaseException) -> bool:
    """Whether ``e`` (or the error it carries from a Ray actor) is a failed setup phase."""
    from digirl_lite.envs.lifecycle import PhaseFailed

    return isinstance(e, PhaseFailed) or isinstance(getattr(e, "cause", None), PhaseFailed)


class Device(Protocol):
    slot: int

    def reset(self, task: Any, seed: int | None,
              options: dict[str, Any] | None = None) -> tuple[Observation, int]:
        """Start an episode (``options``: the environment's reset options); returns
        (observation, step budget H)."""

    def step(self, action_text: str) -> tuple[Observation, float, bool, bool, dict]:
        """One environment step (the :class:`~digirl_lite.envs.base.Env` return value)."""

    def restart(self) -> str:
        """Hard reset: a fresh environment (and worker); returns what was restarted."""

    def close(self) -> None: ...


def shrink_obs(obs: Observation, size: tuple[int, int] | None) -> Observation:
    """``obs`` with its screenshot shrunk to ``size`` (what travels between processes)."""
    if size is None or obs.screenshot.size == size:
        return obs
    return replace(obs, screenshot=obs.screenshot.resize(size, Image.BILINEAR))


def reset_env(env: Any, task: Any, seed: int | None, options: dict[str, Any] | None):
    """``env.reset``, passing ``options`` only when there are some: environments without
    reset options (the Android phone's) keep their plain ``reset(task, seed)``."""
    if options:
        return env.reset(task=task, seed=seed, options=options)
    return env.reset(task=task, seed=seed)


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:500]


class LocalDevice:
    """An environment in this process; ``restart`` builds a new one with ``make_env(slot)``."""

    def __init__(self, make_env: Callable[[int], Any], slot: int) -> None:
        self.make_env, self.slot = make_env, slot
        self.env = make_env(slot)

    def reset(self, task, seed, options=None):
        try:
            obs, _ = reset_env(self.env, task, seed, options)
        except Exception as e:
            raise DeviceError(f"environment {self.slot} raised on reset: {_describe(e)}",
                              task_fault=is_task_fault(e)) from e
        return obs, self.env.horizon

    def step(self, action_text):
        try:
            return self.env.step(action_text)
        except Exception as e:  # an environment bug: recorded, rebuilt, collection goes on
            raise DeviceError(f"environment {self.slot} raised {_describe(e)}") from e

    def restart(self) -> str:
        try:
            self.env.close()
        except Exception:  # the old environment is being thrown away anyway
            pass
        self.env = self.make_env(self.slot)
        return "environment"

    def close(self) -> None:
        self.env.close()


def _worker(conn, make_env, slot: int, size) -> None:  # pragma: no cover - runs in a child
    env = make_env(slot)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        try:
            if msg[0] == "reset":
                obs, _ = reset_env(env, msg[1], msg[2], msg[3])
                conn.send(("ok", (shrink_obs(obs, size), env.horizon)))
            elif msg[0] == "step":
                obs, r, term, trunc, info = env.step(msg[1])
                conn.send(("ok", (shrink_obs(obs, size), r, term, trunc, info)))
            elif msg[0] == "close":
                env.close()
                conn.send(("ok", None))
                break
        except Exception as e:
            conn.send(("error", (f"{_describe(e)}\n{traceback.format_exc(limit=3)}",
                                 is_task_fault(e))))


class ProcessDevice:
    """An environment in its own spawned process, spoken to over a pipe.

    Screenshots come back already shrunk to ``record_size``. A call that gets no answer in
    ``timeout_s`` (hung worker), a worker that dies, or an environment that raises is a
    :class:`DeviceError`; ``restart`` kills this device's own worker (by its handle, never by
    name) and spawns a new one.

    Args:
        make_env: a picklable callable ``slot -> env`` (e.g. ``functools.partial``).
        slot: this device's number (passed to ``make_env``).
        record_size: screenshot size sent back (None: full size).
        timeout_s: how long one reset or step may take.
    """

    def __init__(self, make_env: Callable[[int], Any], slot: int,
                 record_size: tuple[int, int] | None = RECORD_SIZE,
                 timeout_s: float = 120.0, ctx: Any = None) -> None:
        self.make_env, self.slot = make_env, slot
        self.record_size, self.timeout_s = record_size, timeout_s
        self._ctx = ctx or mp.get_context("spawn")
        self.proc: Any = None
        self.conn: Any = None
        self._start()

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        p = self._ctx.Process(target=_worker, args=(child, self.make_env, self.slot,
                                                    self.record_size), daemon=True)
        p.start()
        child.close()
        self.proc, self.conn = p, parent

    def _call(self, *msg):
        try:
            self.conn.send(msg)
            if not self.conn.poll(self.timeout_s):
                raise DeviceError(f"worker {self.slot} did not answer in {self.timeout_s} s")
            status, payload = self.conn.recv()
        except (EOFError, OSError) as e:
            raise DeviceError(f"worker {self.slot} is gone ({type(e).__name__})") from e
        if status != "ok":
            text, task_fault = payload
            raise DeviceError(f"worker {self.slot} failed: {text}"[:500], task_fault=task_fault)
        return payload

    def reset(self, task, seed, options=None):
        return self._call("reset", task, seed, options)

    def step(self, action_text):
        return self._call("step", action_text)

    def restart(self) -> str:
        p = self.proc
        if p is not None and p.is_alive():
            p.kill()  # our own child, by its handle
        if p is not None:
            p.join(timeout=5)
        self._start()
        return "worker"

    def close(self) -> None:
        try:
            self.conn.send(("close",))
            self.conn.poll(5) and self.conn.recv()
        except (OSError, EOFError):
            pass
        if self.proc.is_alive():
            self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
