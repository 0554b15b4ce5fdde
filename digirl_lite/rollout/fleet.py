"""Fleets: collect trajectories from N environments, one batched policy call per step.

The reference code's synchronous batch mode: all N phones step together, the policy samples
the N next actions in one batch, and the collection returns when every task of the batch is
done. :class:`LocalFleet` keeps the environments in this process; :class:`ProcessFleet`
gives each its own worker process (a crashed worker is restarted and its episode recorded
as an infrastructure truncation, never as an agent failure). Both share one loop, so an
asynchronous or a Ray fleet plugs in by implementing ``_reset`` / ``_step_many``.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from PIL import Image

from digirl_lite.data.records import ScreenTable, Source, Trajectory
from digirl_lite.envs.base import Observation
from digirl_lite.rollout.episode import RECORD_SIZE, EpisodeRecorder

__all__ = ["BatchAgent", "ScriptedBatchAgent", "Episode", "LocalFleet", "ProcessFleet"]


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


class _Fleet:
    n_envs: int

    def _reset(self, slot: int, task: Any, seed: int | None) -> Observation: ...

    def _step_many(self, actions: list[tuple[int, str]]) -> list[Any]: ...

    def collect(
        self, agent: BatchAgent, tasks: Sequence[Any], screens: ScreenTable, *,
        id_prefix: str, source: Source = Source.ONLINE, iteration: int = -1,
        seed: int = 0, record_size: tuple[int, int] | None = RECORD_SIZE,
        on_step: Callable[[int, Observation], None] | None = None,
    ) -> list[Episode]:
        """Run every task once; returns episodes in task order.

        Episode ``k`` gets trajectory id ``{id_prefix}-{k:05d}`` and env seed ``seed + k``.
        ``on_step(slot, obs)`` sees every new observation (e.g. to fill a feature cache).
        """
        queue = list(enumerate(tasks))[::-1]
        recorders: dict[int, tuple[int, EpisodeRecorder]] = {}
        done: dict[int, Episode] = {}

        def start(slot: int) -> None:
            k, task = queue.pop()
            obs = self._reset(slot, task, seed + k)
            rec = EpisodeRecorder(screens, f"{id_prefix}-{k:05d}", obs, source=source,
                                  iteration=iteration, horizon=getattr(obs, "horizon", None)
                                  or self._horizon(slot), record_size=record_size,
                                  seeds={"env": seed + k})
            recorders[slot] = (k, rec)
            if on_step is not None:
                on_step(slot, obs)

        for slot in range(min(self.n_envs, len(queue))):
            start(slot)
        while recorders:
            slots = sorted(recorders)
            t0 = time.perf_counter()
            texts = agent.act_batch(slots, [recorders[s][1].obs for s in slots])
            policy_s = (time.perf_counter() - t0) / max(1, len(slots))
            results = self._step_many(list(zip(slots, texts)))
            for slot, text, res in zip(slots, texts, results):
                k, rec = recorders[slot]
                if isinstance(res, _Crash):
                    done[k] = Episode(rec.abort(res.reason), rec.states, tasks[k])
                    over = True
                else:
                    nobs, reward, term, trunc, info = res
                    if on_step is not None:
                        on_step(slot, nobs)
                    over = rec.record(text, nobs, reward, term, trunc, info, policy_s)
                    if over:
                        done[k] = Episode(rec.trajectory, rec.states, tasks[k])
                if over:
                    del recorders[slot]
                    if queue:
                        start(slot)
        return [done[k] for k in range(len(tasks))]

    def _horizon(self, slot: int) -> int:
        return 20


@dataclass
class _Crash:
    reason: str


class LocalFleet(_Fleet):
    """N environments in this process (cheap environments such as the simulated phone)."""

    def __init__(self, make_env: Callable[[int], Any], n_envs: int = 16) -> None:
        self.n_envs = n_envs
        self.make_env = make_env
        self.envs = [make_env(i) for i in range(n_envs)]

    def _reset(self, slot, task, seed):
        obs, _ = self.envs[slot].reset(task=task, seed=seed)
        return obs

    def _horizon(self, slot):
        return self.envs[slot].horizon

    def _step_many(self, actions):
        out = []
        for slot, text in actions:
            try:
                out.append(self.envs[slot].step(text))
            except Exception as e:  # an environment bug: record, rebuild, go on
                out.append(_Crash(f"environment {slot} raised {type(e).__name__}: {e}"))
                self.envs[slot] = self.make_env(slot)
        return out

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _shrink_obs(obs: Observation, size: tuple[int, int] | None) -> Observation:
    if size is None or obs.screenshot.size == size:
        return obs
    return replace(obs, screenshot=obs.screenshot.resize(size, Image.BILINEAR))


def _worker(conn, make_env, slot: int, size) -> None:  # pragma: no cover - runs in a child
    env = make_env(slot)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        try:
            if msg[0] == "reset":
                obs, _ = env.reset(task=msg[1], seed=msg[2])
                conn.send(("ok", _shrink_obs(obs, size), env.horizon))
            elif msg[0] == "step":
                obs, r, term, trunc, info = env.step(msg[1])
                conn.send(("ok", (_shrink_obs(obs, size), r, term, trunc, info)))
            elif msg[0] == "close":
                env.close()
                conn.send(("ok", None))
                break
        except Exception as e:
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))


class ProcessFleet(_Fleet):
    """One worker process per environment; the N steps of a batch run in parallel.

    Screenshots travel back already shrunk to ``record_size``. A worker that dies (or whose
    environment raises) ends its episode as an infrastructure truncation and is restarted.

    Args:
        make_env: a picklable callable ``slot -> env`` (e.g. ``functools.partial``).
        n_envs: number of workers.
        record_size: screenshot size sent back.
        timeout_s: how long to wait for one step before the worker counts as hung.
    """

    def __init__(self, make_env: Callable[[int], Any], n_envs: int = 4,
                 record_size: tuple[int, int] | None = RECORD_SIZE,
                 timeout_s: float = 120.0) -> None:
        self.n_envs = n_envs
        self.make_env = make_env
        self.record_size = record_size
        self.timeout_s = timeout_s
        self._ctx = mp.get_context("spawn")
        self._procs: list[Any] = [None] * n_envs
        self._conns: list[Any] = [None] * n_envs
        self._horizons = [20] * n_envs
        self.restarts = 0
        for i in range(n_envs):
            self._start(i)

    def _start(self, slot: int) -> None:
        parent, child = self._ctx.Pipe()
        p = self._ctx.Process(target=_worker, args=(child, self.make_env, slot,
                                                    self.record_size), daemon=True)
        p.start()
        child.close()
        self._procs[slot], self._conns[slot] = p, parent

    def _restart(self, slot: int) -> None:
        p = self._procs[slot]
        if p is not None and p.is_alive():
            p.kill()  # our own child, by its handle
        if p is not None:
            p.join(timeout=5)
        self.restarts += 1
        self._start(slot)

    def _recv(self, slot: int):
        conn = self._conns[slot]
        if not conn.poll(self.timeout_s):
            raise TimeoutError(f"worker {slot} did not answer in {self.timeout_s} s")
        status, payload, *rest = conn.recv()
        if status != "ok":
            raise RuntimeError(f"worker {slot}: {payload}")
        return (payload, *rest)

    def _reset(self, slot, task, seed):
        for attempt in range(2):
            try:
                self._conns[slot].send(("reset", task, seed))
                obs, horizon = self._recv(slot)
                self._horizons[slot] = horizon
                return obs
            except (EOFError, OSError, TimeoutError, RuntimeError):
                if attempt:
                    raise
                self._restart(slot)

    def _horizon(self, slot):
        return self._horizons[slot]

    def _step_many(self, actions):
        sent = []
        for slot, text in actions:
            try:
                self._conns[slot].send(("step", text))
                sent.append((slot, None))
            except (OSError, EOFError, BrokenPipeError) as e:
                sent.append((slot, _Crash(f"worker {slot} is gone ({type(e).__name__})")))
        out = []
        for slot, failed in sent:
            if failed is not None:
                self._restart(slot)
                out.append(failed)
                continue
            try:
                out.append(self._recv(slot)[0])
            except (EOFError, OSError, TimeoutError, RuntimeError) as e:
                out.append(_Crash(f"worker {slot} failed: {e}"[:500]))
                self._restart(slot)
        return out

    def close(self) -> None:
        for p, conn in zip(self._procs, self._conns):
            try:
                conn.send(("close",))
                conn.poll(5) and conn.recv()
            except (OSError, EOFError):
                pass
            if p.is_alive():
                p.join(timeout=5)
            if p.is_alive():
                p.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
