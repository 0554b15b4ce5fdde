"""The asynchronous fleet with its phones in Ray actors (one machine or a cluster).

Each actor (:class:`DeviceHost`) owns ``devices_per_actor`` environments (simulated phones,
or Android emulators on the machine it was placed on); the fleet's loop is
:class:`~digirl_lite.rollout.async_fleet.AsyncFleet`'s, with every device call a Ray call.
The reference code ran its workers through SSH heredocs and ``scp``; here Ray places and
restarts them.

* Inference: central by default (the learner's process batches whatever is ready), or in
  the actors (``worker_agent``): then :meth:`RayFleet.set_weights` puts the weights into
  the object store once and every actor reads them from there.
* A dead actor (a crashed process, a lost node) ends its episodes as infrastructure
  truncations (never agent failures) and is replaced by a new actor on the next restart.
* ``ray.init(num_cpus=2)`` on this machine by default; ``address=`` joins a running cluster.
  Needs the ``ray`` extra: ``pip install 'digirl-lite[ray]'``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from digirl_lite.rollout.async_fleet import AsyncFleet
from digirl_lite.rollout.bookkeeping import log
from digirl_lite.rollout.devices import DeviceError, is_task_fault, reset_env, shrink_obs
from digirl_lite.rollout.episode import RECORD_SIZE

__all__ = ["RayFleet", "DeviceHost", "import_ray"]


def import_ray():
    """``import ray``, or an error that names the extra to install."""
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("RayFleet needs Ray: pip install 'digirl-lite[ray]'") from e
    return ray


class DeviceHost:
    """What runs inside one Ray actor: the environments of some slots.

    Args:
        make_env: ``slot -> env`` (shipped to the actor by Ray's pickling).
        slots: the slots this actor owns.
        record_size: screenshots are shrunk to this before they travel.
        worker_agent: ``slot -> agent`` with ``act(obs) -> str`` (and optionally
            ``load_weights(weights)``), for inference in the actor; None: central inference.
        weights: the latest weights (passed by Ray from the object store), with ``version``.
    """

    def __init__(self, make_env: Callable[[int], Any], slots: list[int],
                 record_size: tuple[int, int] | None,
                 worker_agent: Callable[[int], Any] | None = None,
                 weights: Any = None, version: int = 0) -> None:
        self.make_env, self.record_size = make_env, record_size
        self.envs = {s: make_env(s) for s in slots}
        self.agents = {s: worker_agent(s) for s in slots} if worker_agent else {}
        self._obs: dict[int, Any] = {}
        self.version = version
        if weights is not None:
            self.set_weights(weights, version)

    def pid(self) -> int:
        return os.getpid()

    def reset(self, slot: int, task: Any, seed: int | None,
              options: dict[str, Any] | None = None):
        env = self.envs[slot]
        obs, _ = reset_env(env, task, seed, options)
        self._obs[slot] = obs
        return shrink_obs(obs, self.record_size), env.horizon

    def step(self, slot: int, text: str):
        obs, reward, term, trunc, info = self.envs[slot].step(text)
        self._obs[slot] = obs
        return shrink_obs(obs, self.record_size), reward, term, trunc, info

    def act_and_step(self, slot: int):
        t0 = time.perf_counter()
        text = self.agents[slot].act(self._obs[slot])
        policy_s = time.perf_counter() - t0
        return text, self.version, policy_s, self.step(slot, text)

    def restart_env(self, slot: int) -> None:
        try:
            self.envs[slot].close()
        except Exception:  # being replaced anyway
            pass
        self.envs[slot] = self.make_env(slot)
        self._obs.pop(slot, None)

    def set_weights(self, weights: Any, version: int) -> int:
        for agent in self.agents.values():
            if hasattr(agent, "load_weights"):
                agent.load_weights(weights)
        self.version = version
        return version

    def close(self) -> None:
        for env in self.envs.values():
            env.close()


class _Hosts:
    """The fleet's actors, and their replacement when one dies (thread-safe)."""

    def __init__(self, ray, make_env, n_envs: int, per_actor: int, record_size,
                 worker_agent, actor_options: dict[str, Any]) -> None:
        self.ray, self.make_env, self.record_size = ray, make_env, record_size
        self.worker_agent = worker_agent
        self.cls = ray.remote(DeviceHost).options(
            max_concurrency=per_actor, **{"num_cpus": 0, **actor_options})
        self.per_actor = per_actor
        self.groups = [list(range(i, min(i + per_actor, n_envs)))
                       for i in range(0, n_envs, per_actor)]
        self.weights_ref: Any = None
        self.version = 0
        self.lock = threading.Lock()
        self.actors = [self._new(g) for g in self.groups]

    def _new(self, slots: list[int]):
        return self.cls.remote(self.make_env, slots, self.record_size, self.worker_agent,
                               self.weights_ref, self.version)

    def of(self, slot: int) -> tuple[int, Any]:
        with self.lock:
            return slot // self.per_actor, self.actors[slot // self.per_actor]

    def replace(self, index: int, dead: Any) -> bool:
        """Replace actor ``index`` if it is still ``dead`` (False: someone already did)."""
        with self.lock:
            if self.actors[index] is not dead:
                return False
            try:
                self.ray.kill(dead, no_restart=True)
            except Exception:  # already gone
                pass
            self.actors[index] = self._new(self.groups[index])
            return True


class RayDevice:
    """One slot of a :class:`DeviceHost` actor, behind the fleet's device calls."""

    def __init__(self, hosts: _Hosts, slot: int, timeout_s: float) -> None:
        self.hosts, self.slot, self.timeout_s = hosts, slot, timeout_s

    def _call(self, method: str, *args: Any):
        ray = self.hosts.ray
        _, actor = self.hosts.of(self.slot)
        try:
            return ray.get(getattr(actor, method).remote(self.slot, *args),
                           timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            raise DeviceError(f"Ray actor of device {self.slot} did not answer in "
                              f"{self.timeout_s} s") from e
        except ray.exceptions.RayActorError as e:
            raise DeviceError(f"Ray actor of device {self.slot} died: "
                              f"{type(e).__name__}") from e
        except ray.exceptions.RayTaskError as e:  # the environment raised, in the actor
            raise DeviceError(f"device {self.slot} raised in its Ray actor: "
                              f"{str(e).splitlines()[0]}"[:500],
                              task_fault=is_task_fault(e)) from e

    def reset(self, task, seed, options=None):
        return self._call("reset", task, seed, options)

    def step(self, action_text):
        return self._call("step", action_text)

    def act_and_step(self):
        return self._call("act_and_step")

    def restart(self) -> str:
        ray = self.hosts.ray
        index, actor = self.hosts.of(self.slot)
        try:  # alive: only this slot's environment is rebuilt
            ray.get(actor.restart_env.remote(self.slot), timeout=min(self.timeout_s, 60))
            return "environment"
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        self.hosts.replace(index, actor)
        return "Ray actor"

    def close(self) -> None:  # the fleet kills the actors
        pass


class RayFleet(AsyncFleet):
    """:class:`AsyncFleet` whose phones live in Ray actors.

    Args:
        make_env: ``slot -> env``, picklable by Ray (runs in the actors).
        n_envs: number of phones.
        address: a running Ray cluster to join (``"auto"``, ``"ray://host:10001"``);
            None starts a local one with ``num_cpus`` CPUs (unless Ray is already running).
        num_cpus: CPUs of the local cluster (2: this project's laptop budget).
        devices_per_actor: phones per actor (an actor is one process).
        worker_agent: ``slot -> agent`` for inference inside the actors (then call
            ``collect(None, ...)``); see :meth:`set_weights`.
        actor_options: extra ``.options()`` for the actors (e.g. ``{"resources":
            {"android": 1}}`` to place them on machines with emulators).
        timeout_s: per-call limit; a hung actor counts as dead.
        **options: :class:`AsyncFleet` options (``min_batch``, ``batch_wait_s``,
            ``max_consecutive_faults``).
    """

    def __init__(self, make_env: Callable[[int], Any], n_envs: int = 16, *,
                 address: str | None = None, num_cpus: int | None = 2,
                 devices_per_actor: int = 1, worker_agent: Callable[[int], Any] | None = None,
                 actor_options: dict[str, Any] | None = None,
                 record_size: tuple[int, int] | None = RECORD_SIZE, timeout_s: float = 120.0,
                 **options: Any) -> None:
        if devices_per_actor < 1:
            raise ValueError("devices_per_actor must be >= 1")
        if address is None and "ray" not in sys.modules:
            # Ray's local cluster would listen on the machine's network address; keep it on
            # the loopback (Ray reads this when it is imported; an explicit setting wins)
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        ray = import_ray()
        self._owns_ray = False
        if not ray.is_initialized():
            if address is not None:
                ray.init(address=address, logging_level="WARNING")
            else:
                ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level="WARNING")
                self._owns_ray = True
        self._hosts = _Hosts(ray, make_env, n_envs, devices_per_actor, record_size,
                             worker_agent, actor_options or {})
        devices = [RayDevice(self._hosts, i, timeout_s) for i in range(n_envs)]
        super().__init__(make_env, n_envs, devices=devices, **options)

    @property
    def actors(self) -> list[Any]:
        return list(self._hosts.actors)

    def set_weights(self, weights: Any, version: int | None = None) -> int:
        """Ship ``weights`` to every actor through the object store (one copy, read by all);
        steps taken from then on carry ``version`` (default: the current one + 1)."""
        ray = self._hosts.ray
        with self.updating_policy(version):
            ref = ray.put(weights)
        v = self.policy_version
        with self._hosts.lock:
            self._hosts.weights_ref, self._hosts.version = ref, v
            actors = list(self._hosts.actors)
        for actor in actors:
            try:
                ray.get(actor.set_weights.remote(ref, v), timeout=300)
            except ray.exceptions.RayActorError:
                log.warning("a Ray actor died before it got weights version %d; its "
                            "replacement starts with them", v)
        return v

    def close(self) -> None:
        super().close()
        ray = self._hosts.ray
        for actor in self._hosts.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
