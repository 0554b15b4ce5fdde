"""Before the offline phase: the starting policy (the AutoUI role; the simulator's SFT
copier is built in :mod:`digirl_lite.train.starting`) and the pile, the starting policy's
own attempts on training tasks scored by the judge, cached across runs by
:meth:`StartingPolicyAndPile.pile_key`.

A mixin of :class:`~digirl_lite.train.trainer.Trainer`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from digirl_lite import distributed as dist
from digirl_lite.data.records import ScreenTable, Source, Trajectory
from digirl_lite.data.store import TrajectoryStore
from digirl_lite.envs.base import WorldInfo
from digirl_lite.paths import content_key, fsync_tree

__all__ = ["StartingPolicyAndPile", "pile_key"]


def pile_key(cfg: Any, info: WorldInfo) -> str:
    """The cache key of the pile of ``cfg``'s run on the world ``info`` describes
    (:func:`digirl_lite.envs.setup.world_info`): every setting that changes what it holds.
    The world's entries (``info.pile_key``) come after the starting policy's and before the
    copy path's; a simulator key is what it was when the trainer wrote its entries itself
    (tests/train/test_pile_key.py), so cached piles and results keep their names."""
    from digirl_lite.train.starting import sft_key

    c = cfg
    policy_id = (sft_key(c) if c.starting_policy in ("sft", "shipped")
                 else str(Path(c.starting_policy).expanduser().resolve()))
    if c.policy == "vlm" and c.starting_policy == "shipped":  # the base model as it is
        policy_id = ("vlm", str(Path(c.policy_path).expanduser().resolve()), c.lora,
                     c.vlm_image_size, c.vlm_dtype)
    run: tuple[Any, ...] = (("copy_typed_text", True),) if c.copy_typed_text else ()
    run += ((("span_extractor", c.typed_span_extractor),)
            if c.typed_span_extractor != "none" else ())
    run += ((("span_phrasings", c.typed_span_phrasings),)
            if c.typed_span_phrasings is not None else ())
    run += (("span_once", True),) if c.typed_span_once else ()
    return content_key("pile-v3", c.world, c.seed, c.pile_size, c.judge, c.temperature,
                       c.constrained_decoding, c.max_new_tokens, c.horizon, c.task_file,
                       policy_id, *info.pile_key, *run)


class StartingPolicyAndPile:
    """The starting policy and its pile (mixed into
    :class:`~digirl_lite.train.trainer.Trainer`)."""

    def sft_key(self) -> str:
        """What the simulator's SFT starting policy depends on (a cached or shipped one
        must match); see :mod:`digirl_lite.train.starting`."""
        from digirl_lite.train.starting import sft_key

        return sft_key(self.cfg)

    def build_starting_policy(self) -> None:
        """The starting policy: ``cfg.starting_policy`` "sft" / "shipped" (the simulator's,
        :func:`digirl_lite.train.starting.starting_policy`), or the directory loaded when
        the Trainer was built."""
        c = self.cfg
        if c.policy == "vlm" and c.starting_policy == "shipped":
            self.say(f"starting policy: the model at policy_path {c.policy_path} as it is "
                     "(no VLM ships with digirl_lite; starting_policy 'sft' fine-tunes it on "
                     "the expert's demonstrations first)")
            self.log(stage="sft", loaded=str(Path(c.policy_path).expanduser()), sft=False)
        elif c.starting_policy in ("sft", "shipped"):
            from digirl_lite.train.starting import starting_policy

            if c.policy == "vlm":  # not two copies of a VLM's weights at once
                self.policy = self.actor_opt = None
            self.policy, seconds = starting_policy(
                c, features=self.features, cache_dir=self.cache_dir,
                device=self.accelerator.device, process_index=self.accelerator.process_index,
                accelerator=self.accelerator, log=self.log, bar=self._bar,
                is_main=self.is_main)
            if seconds is not None:
                self.timings["sft"] = seconds
        else:
            self.log(stage="sft", loaded=str(Path(c.starting_policy).expanduser()))
        if c.goal_unseen_words == "features":
            from digirl_lite.envs.setup import train_goal_words

            self.policy.read_unseen_words_through_features(train_goal_words(c))
        else:
            from digirl_lite.policy.factory import check_goal_words

            check_goal_words(self.policy, c, "the starting policy")
        self.policy.to(self.accelerator.device)
        self._fresh_value_bias()
        dist.broadcast_parameters(self.policy.model)  # one policy on every process
        self.actor_opt = self._actor_optimizer()

    def _fresh_value_bias(self) -> None:
        """A value head that starts fresh gets ``value_bias`` (A.6's 0.1 by default)."""
        if self.policy.value_head_fresh:
            with torch.no_grad():
                self.policy.value_head.linear.bias.fill_(self.cfg.value_bias)

    def save_starting_policy(self, directory: str | Path) -> Path:
        """Save the policy with the SFT key it was built under (``sft.json``)."""
        from digirl_lite.train.starting import save_starting_policy

        return save_starting_policy(self.policy, self.cfg, directory)

    def train_sft(self):
        """The simulator's SFT starting policy from fresh preset weights
        (:func:`digirl_lite.train.starting.train_sft`)."""
        from digirl_lite.train.starting import train_sft

        t0 = time.perf_counter()
        policy = train_sft(self.cfg, self.features, device=self.accelerator.device,
                           process_index=self.accelerator.process_index,
                           accelerator=self.accelerator, log=self.log, bar=self._bar)
        self.timings["sft"] = time.perf_counter() - t0
        return policy

    def pile_key(self) -> str:
        """The cache key of the pile: every setting that changes what it holds
        (:func:`pile_key`)."""
        return pile_key(self.cfg, self.world_info)

    def build_pile(self) -> list[Trajectory]:
        """The starting policy's own attempts on train tasks, scored by the judge (cached).
        A pile already in the run's store (stored before a crash) is read back, not
        collected again."""
        from digirl_lite.data.store import load_trajectories

        c = self.cfg
        stored = [t for t in self._stored if t.source is Source.OFFLINE]
        if stored:
            self.log(stage="pile", from_store=str(self.out / "store"),
                     trajectories=len(stored))
            return stored
        key = self.pile_key()
        cached = self.cache_dir / f"pile-{key}" if self.cache_dir else None
        # every process takes the same road (process 0 decides)
        if dist.broadcast_object(cached is not None and (cached / "digirl_store.json").is_file()):
            trajs, screens = load_trajectories(cached)
            self.screens.merge(screens)
            self.log(stage="pile", cached=str(cached), trajectories=len(trajs))
            return trajs
        tasks = self._train_tasks()
        idx = np.random.default_rng(c.seed + 1).integers(0, len(tasks), c.pile_size)
        self.say(f"pile: {c.pile_size} attempts of the starting policy on "
                 f"{self.phones.n * self.world_size} phones")
        episodes = self.timed("pile", lambda: self._collect(
            "pile", self.agent(), [tasks[i] for i in idx], self.screens,
            id_prefix=f"pile-s{c.seed}", source=Source.OFFLINE, iteration=-1,
            seed=c.seed * 1_000_003 + 7))
        self.features.fill(self.screens)
        trajs = [e.trajectory for e in episodes]
        if cached is not None and self.is_main:  # written aside, then renamed into place
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=cached.parent, prefix=f".tmp-{cached.name}-"))
            sub = ScreenTable(self.screens.feature_dim)
            for sid, img, feats in self._screen_rows(trajs, self.screens):
                sub.add(img, feats, screen_id=sid)
            TrajectoryStore.create(tmp / "pile", sub.feature_dim).append(trajs, sub)
            fsync_tree(tmp)
            try:
                os.rename(tmp / "pile", cached)
            except OSError:  # another run cached the same pile meanwhile
                pass
            shutil.rmtree(tmp, ignore_errors=True)
        self.log(stage="pile", trajectories=len(trajs),
                 success_rate=round(float(np.mean([t.is_success for t in trajs])), 4))
        return trajs
