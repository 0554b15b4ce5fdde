"""The run folder's persistence and the resume bookkeeping: the folder's lock, the run's
trajectory store, the random states, and the checkpoints (:meth:`RunFolder.save_checkpoint`,
:meth:`RunFolder.load_checkpoint`). A checkpoint follows every phase of :data:`RUN_PHASES`,
every online iteration and every evaluation; :meth:`RunFolder._once` runs a phase unless a
resumed run had done it, so the loop (:meth:`~digirl_lite.train.trainer.Trainer.run`) reads
as the algorithm and resume lives here.

A mixin of :class:`~digirl_lite.train.trainer.Trainer`.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from digirl_lite import distributed as dist
from digirl_lite.data.records import ScreenTable, Source, Trajectory
from digirl_lite.data.replay import ReplayBuffer
from digirl_lite.data.store import TrajectoryStore
from digirl_lite.errors import ConfigError, FolderBusyError
from digirl_lite.paths import atomic_write_text, fsync_dir, fsync_tree, lock_run_folder
from digirl_lite.redaction import redact
from digirl_lite.train.collection import FLEET_FILE
from digirl_lite.train.config import DigiRLConfig, effective_fields

__all__ = ["RUN_PHASES", "RunFolder"]

RUN_PHASES = ("starting_policy", "eval:copier", "pile", "offline", "eval:offline")
"""The phases before the online iterations, in order; a checkpoint is saved after each, so a
run killed anywhere resumes at the phase it was in (``--resume``)."""


class RunFolder:
    """The run folder: lock, store, checkpoints, resume (mixed into
    :class:`~digirl_lite.train.trainer.Trainer`)."""

    def _lock_folder(self) -> None:
        """Hold ``out/run.lock`` (process 0; every process of a group learns the answer and
        raises :class:`FolderBusyError` alike, so none goes on to wait for the others)."""
        busy = None
        if self.is_main and self._folder_lock is None:
            try:
                self._folder_lock = lock_run_folder(self.out)
            except FolderBusyError as e:
                busy = str(e)
        if self.world_size > 1:
            busy = dist.broadcast_object(busy)
        if busy is not None:
            raise FolderBusyError(busy)

    def _release_folder(self) -> None:
        if self._folder_lock is not None:
            self._folder_lock.release()
            self._folder_lock = None

    @staticmethod
    def _seed_everything(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    def _store(self) -> TrajectoryStore:
        return TrajectoryStore.create(self.out / "store", self.img_dim, exist_ok=True)

    def _store_append(self, trajs: Sequence[Trajectory]) -> None:
        """Append to the run's store (process 0) what it does not hold yet: a phase redone
        after a crash never stores a trajectory twice."""
        new = [t for t in trajs if t.traj_id not in self._stored_ids]
        if new and self.is_main:
            self._store().append(new, self.screens)
        self._stored_ids.update(t.traj_id for t in new)

    def _random_state(self) -> dict[str, Any]:
        """This process's random generators (JSON), for the checkpoint."""
        kind, keys, pos, gauss, cached = np.random.get_state()
        return {"numpy": self.rng.bit_generator.state, "python": random.getstate(),
                "np_global": [kind, keys.tolist(), pos, gauss, cached]}

    def _set_random_state(self, st: dict[str, Any], torch_state: torch.Tensor | None) -> None:
        self.rng.bit_generator.state = st["numpy"]
        version, internal, gauss = st["python"]
        random.setstate((version, tuple(internal), gauss))
        kind, keys, pos, has_gauss, cached = st["np_global"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
        if torch_state is not None:
            torch.set_rng_state(torch_state)

    def save_checkpoint(self) -> Path:
        """Policy, critics, optimisers, buffer ids, every process's random state, counters,
        the phase done and the config, in a new folder ``ckpt-NNNNN``: written aside,
        fsynced, renamed into place; only then does ``latest`` (atomic, fsynced) name it,
        and the checkpoints before the previous one are removed. A kill at any moment leaves
        ``latest`` naming a complete checkpoint. Under ``accelerate launch`` every process
        takes part (random states, a check that the weights agree); process 0 writes."""
        rngs = dist.all_gather(self._random_state())
        torch_rngs = dist.all_gather(torch.get_rng_state())
        digests = None
        if self.world_size > 1:
            digests = dist.all_gather(dist.weights_digest(self.policy.model, *self._critics()))
            if len(set(digests)) > 1:
                raise RuntimeError(f"the processes' weights differ ({digests}): the learner "
                                   "is no longer data parallel; not saving")
        self._ckpt_seq += 1
        root = self.out / "checkpoints"
        name = f"ckpt-{self._ckpt_seq:05d}"
        if not self.is_main:
            return root / name
        root.mkdir(exist_ok=True)
        for stale in root.glob(".tmp-*"):  # a save killed half way
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-{name}-"))
        self.policy.save(tmp / "policy")
        torch.save({**self._critic_state(), "actor_opt": self.actor_opt.state_dict(),
                    "learner": self.learner.state_dict(), "torch_rng": torch_rngs},
                   tmp / "state.pt")
        state = {"phase": self.phase, "iteration": self.iteration,
                 "online_trajectories": self.online_trajectories,
                 "config": self._config_json(), "processes": self.world_size,
                 "weights_digests": digests,
                 "buffer": self.buffer.state_dict(), "rngs": rngs,
                 "curve": self.curve, "summary": redact(self.summary), "timings": self.timings}
        (tmp / "state.json").write_text(json.dumps(state, default=float))
        if self.claw is not None:  # the experience bank (``claw``)
            self.claw.save(tmp)
        self._save_fleet_stats()
        fsync_tree(tmp)
        final = root / name
        os.rename(tmp, final)
        fsync_dir(root)
        previous = (root / "latest").read_text().strip() if (root / "latest").is_file() else ""
        atomic_write_text(root / "latest", name)
        fsync_dir(root)
        if self.claw is not None:  # claw/ follows the checkpoint that is now the latest
            self.claw.publish()
        for old in root.iterdir():  # keep this one and the one before
            if old.is_dir() and old.name not in (name, previous) and not old.name.startswith("."):
                shutil.rmtree(old, ignore_errors=True)
        return final

    def _critic_state(self) -> dict[str, Any]:
        """The learner's critics and their optimiser, as the checkpoint's ``state.pt`` keys
        (``step_critic``, ``instr_critic``, ``critic_opt``; none for a learner without)."""
        return {key: module.state_dict() for key, module in
                (("step_critic", self.step_critic), ("instr_critic", self.instr_critic),
                 ("critic_opt", self.critic_opt)) if module is not None}

    def _config_json(self) -> dict[str, Any]:
        """The config as saved with a checkpoint: JSON values, credentials redacted
        (:func:`~digirl_lite.redaction.redact`). Resume compares it with the saved one, both
        redacted, so a run never needs a secret from disk: it comes from the live config."""
        return redact(json.loads(json.dumps(self.cfg.as_dict(), default=str)))

    def load_checkpoint(self, allow_config_change: bool = False) -> bool:
        """Restore the newest checkpoint; False when there is none. A checkpoint saved
        under another config is refused (:class:`ConfigError` naming the fields that
        differ) unless ``allow_config_change``."""

        from digirl_lite.data.store import load_trajectories
        from digirl_lite.policy.factory import load_kwargs, load_policy

        root = self.out / "checkpoints"
        latest = root / "latest"
        if not latest.is_file():
            return False
        d = root / latest.read_text().strip()
        state = json.loads((d / "state.json").read_text())
        # redacted as _config_json (a checkpoint written before redaction holds secrets)
        saved = redact(state.get("config", state["summary"].get("config", {})))
        now = self._config_json()
        # a field added since the run was saved, left at its default, changes nothing
        defaults = json.loads(json.dumps(DigiRLConfig().as_dict(), default=str))
        saved = {**{k: v for k, v in defaults.items() if k not in saved}, **saved}
        # compared as the run uses them: a moved default (None: the algorithm's own) that
        # gives the same value, or a field the algorithm does not read, changes nothing
        saved, now = effective_fields(saved), effective_fields(now)
        changed = {k: (saved.get(k, "<unset>"), now.get(k, "<unset>"))
                   for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)}
        if "algorithm" in changed:  # another learner's weights and optimiser state
            raise ConfigError(f"{self.out} was run with algorithm={changed['algorithm'][0]!r}"
                              f", not {changed['algorithm'][1]!r}: a run cannot change its "
                              "algorithm on resume; start another run folder")
        if changed and not allow_config_change:
            lines = "\n  ".join(f"{k}: {a!r} in the run, {b!r} now" for k, (a, b)
                                in changed.items())
            ran_on = state.get("processes", state["summary"].get("processes", 1))
            hint = (f" (it ran on {ran_on} processes, this is {self.world_size}: the recipes' "
                    f"--processes {ran_on} gives each its share)" if ran_on != self.world_size
                    else "")
            raise ConfigError(
                f"{self.out} was run with another configuration:\n  {lines}\nresume with "
                f"the same settings{hint}, or pass --allow-config-change "
                "(allow_config_change=True) to go on under the new ones")
        self.policy = load_policy(d / "policy", **load_kwargs(self.cfg)
                                  ).to(self.accelerator.device)
        tensors = torch.load(d / "state.pt", map_location="cpu", weights_only=True)
        # a checkpoint saved before the learners owned their critics holds both for every
        # algorithm: those the learner has none of are left
        for key, module in (("step_critic", self.step_critic),
                            ("instr_critic", self.instr_critic),
                            ("critic_opt", self.critic_opt)):
            if module is not None:
                module.load_state_dict(tensors[key])
        self.actor_opt = self._actor_optimizer()
        self.actor_opt.load_state_dict(tensors["actor_opt"])
        self.learner.load_state_dict(tensors.get("learner", {}))
        if self.claw is not None:
            self.claw.load(d)  # a checkpoint from before its first cycle holds none
        rngs, torch_rngs = state.get("rngs"), tensors["torch_rng"]
        if isinstance(torch_rngs, torch.Tensor):  # checkpoints of one process, before rngs
            torch_rngs = [torch_rngs]
        if rngs is not None and len(rngs) == self.world_size:
            self._set_random_state(rngs[self.rank], torch_rngs[self.rank])
        elif rngs is None and self.world_size == 1:
            self.rng.bit_generator.state = state["rng"]
            torch.set_rng_state(torch_rngs[0])
        else:  # another number of processes: fresh draws, reproducible from here
            self._seed_everything(self.cfg.seed + 7919 * self.rank + 104_729 * state["iteration"])
            self.say(f"checkpoint {d.name} was saved by {len(torch_rngs)} processes, this run "
                     f"has {self.world_size}: random draws start afresh")
        store = self.out / "store"
        trajs, screens = (load_trajectories(store) if (store / "digirl_store.json").is_file()
                          else ([], ScreenTable(self.img_dim)))
        self.screens.merge(screens)
        self.buffer = ReplayBuffer.from_state_dict(state["buffer"], trajs)
        self.iteration = state["iteration"]
        self.phase = state.get("phase", "eval:offline")  # before phases: a full prelude
        self.online_trajectories = state["online_trajectories"]
        self.curve = [tuple(x) for x in state["curve"]]
        self.summary = state["summary"]
        fleet = self.out / FLEET_FILE
        self._fleet_before = json.loads(fleet.read_text()) if fleet.is_file() else {}
        if changed:
            self.summary["config"] = redact(self.cfg.as_dict())
            self.log(stage="resume", config_changed={k: list(v) for k, v in changed.items()})
        self.timings = state["timings"]
        self._stored = trajs
        self._stored_ids = {t.traj_id for t in trajs}
        seqs = [int(m.group(1)) for p in root.iterdir()
                if (m := re.fullmatch(r"ckpt-(\d+)", p.name))]
        self._ckpt_seq = max(seqs, default=0)
        return True

    def _done(self, phase: str) -> bool:
        order = (*RUN_PHASES, "online")
        return bool(self.phase) and order.index(self.phase) >= order.index(phase)

    def _finish(self, phase: str) -> None:
        self.phase = phase
        self.save_checkpoint()

    def _once(self, phase: str, step: Callable[..., Any], *args: Any,
              say: str | None = None) -> Any:
        """``step(*args)`` (its result) unless the run had done ``phase`` (of
        :data:`RUN_PHASES`) before it was resumed (None then); a checkpoint follows it.
        ``say``: the line said when the phase runs."""
        if self._done(phase):
            return None
        if say is not None:
            self.say(say)
        out = step(*args)
        self._finish(phase)
        return out

    def _resume_or_start(self, resume: bool, allow_config_change: bool) -> None:
        """With ``resume``, restore the newest checkpoint (:meth:`load_checkpoint`); without
        one, or without ``resume``, start the run: a folder that holds a run is refused
        unless resumed."""
        if resume and self.load_checkpoint(allow_config_change):
            self.log(stage="resume", phase=self.phase, iteration=self.iteration)
        else:
            if (self.out / "checkpoints" / "latest").is_file() or (self.out / "store").exists():
                raise FileExistsError(f"{self.out} holds a run; pass resume=True (--resume) "
                                      "or another output folder")
            if resume:
                self.say(f"nothing to resume in {self.out}: starting the run")

    def _stored_online(self, k: int) -> list[Trajectory]:
        """What online iteration ``k`` had collected and stored before the run was killed
        (read back from the store on resume): it is not collected again."""
        return [t for t in self._stored if t.iteration == k and t.source is Source.ONLINE]
