"""DigiRL's loop (spec/DIGIRL.md section 7), top-down: starting policy, pile, offline phase,
online iterations, evaluation, checkpoints.

    trainer = Trainer(sim_webshop(), out_dir="runs/webshop")
    trainer.run()

Offline: instruction critic, step critic, then the actor on the pile's successful
trajectories. Online, each iteration: collect K trajectories at temperature 1.0; add them to
the buffer; train both critics on the raw buffer; keep the top 10% of trajectories by
Eq. 4.4; keep their steps with Eq. 4.3 > 1/H; MLE updates of the actor on the kept steps.
Filtered BC replaces the two filters by "successful trajectories, every step".

With ``learner="async"`` (issue 17, spec/DARWIN.md A.1) the collection never waits for the
learner: the fleet runs on an endless stream of training tasks, each iteration takes the
oldest completed trajectories, drops the stale ones, updates exactly as above and publishes
its weights to the phones (:meth:`Trainer.online_iteration`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import random
import re
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from digirl_lite import distributed as dist
from digirl_lite.data.records import ScreenTable, Source, Trajectory, screen_id_of_image
from digirl_lite.data.replay import ReplayBuffer
from digirl_lite.data.store import TrajectoryStore
from digirl_lite.envs.base import Observation
from digirl_lite.errors import ConfigError, FolderBusyError
from digirl_lite.learners import learner_class, learner_names
from digirl_lite.paths import (
    FileLock,
    atomic_write_text,
    content_key,
    fsync_dir,
    fsync_tree,
    lock_run_folder,
    user_cache_dir,
)
from digirl_lite.policy.updates import (
    mle_update,
    steps_to_batch,
    text_mle_update,
)
from digirl_lite.redaction import redact
from digirl_lite.rollout.episode import SampledAction
from digirl_lite.rollout.fleet import JudgeUnavailable, NoDevicesLeft
from digirl_lite.train.config import DigiRLConfig, effective_fields
from digirl_lite.train.evaluate import evaluate, recovery_stats, split_rate, stage_rates

__all__ = ["PolicyBatchAgent", "Trainer", "RunStopped", "mle_update", "steps_to_batch",
           "text_mle_update", "ITERATION_PHASES", "RUN_PHASES", "SPLIT_STAGES", "USER_CACHE"]

RUN_PHASES = ("starting_policy", "eval:copier", "pile", "offline", "eval:offline")
"""The phases before the online iterations, in order; a checkpoint is saved after each, so a
run killed anywhere resumes at the phase it was in (``--resume``)."""

SPLIT_STAGES = ("copier", "offline", "online")
"""The stages evaluated on the held-out splits too (``eval_splits``): the stage ends, not
the learning curve's ``online-k`` points."""

USER_CACHE = "user-cache"
"""``Trainer(cache_dir=USER_CACHE)`` (the default): :func:`digirl_lite.paths.user_cache_dir`."""

ITERATION_PHASES = ("collect", "inference", "store", "critics", "filter", "actor", "checkpoint")
"""Where an online iteration's time goes (``time_split`` in metrics.jsonl): ``collect`` is
the fleet's wall time, of which ``inference`` is the policy's (features + sampling) and
``environments`` the rest."""


class PolicyBatchAgent:
    """The policy behind the fleet's batch interface: features by screen content (cached),
    one sampling call for every phone of the batch.

    ``copy_once`` (with ``copy_text``; ``typed_span_once``): the agent keeps, per phone slot,
    the texts its episode has typed (from the actions it sampled; a new episode starts where
    an observation's ``step`` is 0 or its task changes), and the copy mask does not type one
    again while another span is left (:mod:`digirl_lite.policy.copying`)."""

    def __init__(self, policy, features, screens: ScreenTable, temperature: float = 1.0,
                 max_new_tokens: int = 64, constrained: bool = False,
                 copy_text: Any = False, copy_once: bool = False) -> None:
        if copy_once and not copy_text:
            raise ValueError("copy_once needs copy_text (the copy mask applies it)")
        self.policy, self.features, self.screens = policy, features, screens
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.constrained, self.copy_text = constrained, copy_text
        self.copy_once = bool(copy_once)
        self._typed: dict[Any, tuple[str, list[str]]] = {}  # slot -> (task, texts typed)
        self.seconds = 0.0  # time spent in act_batch (features + sampling): "inference"
        self.calls = 0

    def typed_before(self, slots: Sequence[Any],
                     observations: Sequence[Observation]) -> list[list[str]]:
        """Each slot's texts typed so far in its current episode (reset at a new one)."""
        out = []
        for slot, o in zip(slots, observations):
            task, texts = self._typed.get(slot, (None, []))
            if o.step == 0 or task != o.task:
                texts = []
                self._typed[slot] = (o.task, texts)
            out.append(list(texts))
        return out

    def _record_typed(self, slots: Sequence[Any], texts: Sequence[str]) -> None:
        from digirl_lite.actions import ActionType, parse_action

        for slot, text in zip(slots, texts):
            a = parse_action(text)
            if a.action_type == ActionType.TYPE and slot in self._typed:
                self._typed[slot][1].append(a.typed_text)

    def features_of(self, screen_ids: Sequence[str]) -> np.ndarray:
        # a screen whose features are cached is not read again (it may be on disk by now)
        imgs = [None if i in self.features else self.screens.image(i) for i in screen_ids]
        f = self.features.get(imgs, list(screen_ids))
        for sid, row in zip(screen_ids, f):
            if not self.screens.has_features(sid):
                self.screens.add(features=row, screen_id=sid)
        return f

    def act_batch(self, slots, observations: Sequence[Observation]) -> list[str]:
        t0 = time.perf_counter()
        if self.policy.screen_input == "images":  # a VLM reads the screenshot itself
            inputs = [o.screenshot for o in observations]
        else:
            inputs = self.features_of([o.screen_id or screen_id_of_image(o.screenshot)
                                       for o in observations])
        kw: dict[str, Any] = {"copy_text": self.copy_text} if self.copy_text else {}
        if self.copy_once:
            kw["typed"] = self.typed_before(slots, observations)
        drawn = self.policy.sample([o.prompt for o in observations], inputs,
                                   temperature=self.temperature,
                                   max_new_tokens=self.max_new_tokens,
                                   constrained=self.constrained, **kw)
        if self.copy_once:
            self._record_typed(slots, [d.text for d in drawn])
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        # strings that carry their tokens and log-probabilities onto the steps (issue 17)
        return [SampledAction(d.text, d.token_ids, d.log_probs) for d in drawn]


FLEET_FILE = "fleet.json"


def merge_fleet_stats(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two :meth:`FleetStats.as_dict` records as one: counts added (per cause for
    ``infra_truncations``), ``device_events`` one after the other."""
    out = dict(a)
    for k, v in b.items():
        if k not in out:
            out[k] = v
        elif isinstance(v, dict):
            out[k] = {c: out[k].get(c, 0) + v.get(c, 0) for c in {**out[k], **v}}
        elif isinstance(v, list):
            out[k] = list(out[k]) + list(v)
        else:
            out[k] = out[k] + v
    return out


class RunStopped(RuntimeError):
    """The run stopped on purpose (its judge could not answer, or no device was left): what
    the stopped phase had finished is kept in ``stopped/``; ``--resume`` redoes that phase
    from the last checkpoint (saved at its start) once the cause is fixed."""


class _StageFleet:
    """The Trainer's fleet as :func:`evaluate` sees it: ``collect`` through
    :meth:`Trainer._collect`, so evaluations count and stop on unjudged steps too."""

    def __init__(self, trainer: Trainer, stage: str) -> None:
        self.trainer, self.stage = trainer, stage

    def collect(self, agent, tasks, screens, **kw):
        return self.trainer._collect(self.stage, agent, tasks, screens,
                                     fleet=self.trainer.eval_fleet(), **kw)


class Trainer:
    """One run: owns the policy, the critics its learner asks for, their optimisers, the
    buffer, the store. Its learner (:mod:`digirl_lite.learners`, by ``algorithm``) reads it
    through :class:`digirl_lite.learners.base.Run`: ``cfg``, ``policy``, ``actor_opt``,
    ``screens``, ``buffer``, ``rng``, ``text``, the critics, ``accelerator``, :meth:`timed`,
    :meth:`iterate` and :meth:`sampling_masks`. ``world_size`` is the number of processes
    (``cfg.world`` is the task set).

    Args:
        cfg: the run's configuration.
        out_dir: holds ``metrics.jsonl``, ``summary.json``, ``learning_curve.png``,
            ``store/`` (every trajectory collected) and ``checkpoints/``.
        cache_dir: where the starting policy and the pile are kept across runs (they are
            deterministic in the config); the default is the user's cache folder
            (``$DIGIRL_LITE_CACHE``, else ``~/.cache/digirl_lite``); None disables caching.
        progress: progress bars (one line, on a terminal) and a line per phase.

    Under ``accelerate launch`` with N processes (gloo on CPUs, NCCL on GPUs) the run is data
    parallel: every process collects its share of each phase's tasks with its own seeds
    (online: ``rollouts_per_iteration`` trajectories each, so N times as many in all), the
    trajectories are exchanged so every process holds the same buffer, the actor and the
    critics average their gradients across processes (one set of weights everywhere, checked
    at each checkpoint), and process 0 alone writes the store, metrics and checkpoints.
    """

    def __init__(self, cfg: DigiRLConfig, out_dir: str | Path,
                 cache_dir: str | Path | None = USER_CACHE, progress: bool = True) -> None:
        from accelerate import Accelerator

        from digirl_lite.critics import EmbeddingCache, InstructionCritic, StepCritic
        from digirl_lite.envs.setup import make_phones
        from digirl_lite.vision import FeatureCache
        from digirl_lite.vision.sim_encoder import SIM_FEATURE_DIM

        cfg.check_paths()  # every field that cannot work, before anything is built
        from digirl_lite.envs.judges import probe_judge

        probe_judge(cfg.judge)  # a VLM judge that does not answer: refused in seconds
        if cfg.eval_judge is not None:
            probe_judge(cfg.eval_judge)
        self.cfg = cfg
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.cache_dir = (user_cache_dir() if cache_dir == USER_CACHE
                          else Path(cache_dir).expanduser() if cache_dir else None)
        self.progress = progress
        self._span_extractor = None  # built on first use (copy_text)
        self.accelerator = Accelerator(cpu=cfg.device == "cpu")
        self.is_main = self.accelerator.is_main_process
        self.rank, self.world_size = self.accelerator.process_index, self.accelerator.num_processes
        learner = learner_class(cfg.algorithm)
        if self.world_size > 1 and not learner.data_parallel:
            parallel = [n for n in learner_names() if learner_class(n).data_parallel]
            raise ConfigError(f"algorithm: {cfg.algorithm!r} runs in one process for now "
                              f"(this launch has {self.world_size}); use accelerate launch "
                              f"with one of {parallel}")
        if self.world_size > 1 and cfg.learner == "async":
            # one background collection per process would need its takes exchanged in step
            raise ConfigError(f"learner: 'async' runs in one process for now (this launch "
                              f"has {self.world_size}); use learner 'sync' under accelerate launch")
        # under `accelerate launch` every process collects its own trajectories
        self._seed_everything(cfg.seed + 7919 * self.rank)
        # every size follows the policy: image features, screen tables, the step critic
        # (a VLM reads screenshots: the critics' features are the encoder's own size)
        self.policy = self._initial_policy().to(self.accelerator.device)
        reads_features = self.policy.screen_input == "features"
        encoder = self._image_encoder(self.policy.img_dim if reads_features
                                      else SIM_FEATURE_DIM)
        if reads_features and int(encoder.dim) != self.policy.img_dim:
            raise ConfigError(
                f"image_encoder {cfg.image_encoder!r} gives {encoder.dim}-d features but the "
                f"policy (starting_policy {cfg.starting_policy!r}) reads "
                f"{self.policy.img_dim}-d image features: use the encoder the policy was "
                "trained with")
        self.img_dim = int(encoder.dim)  # the screen tables' and the step critic's
        self.features = FeatureCache(encoder)
        self.text = EmbeddingCache(self._text_encoder())
        d_t, d_i = self.text.encoder.dim, self.img_dim
        # the critics the learner asks for (none but DigiRL's and AWR's), where the policy
        # learns (``device``); their batches follow them. Both are initialised for every
        # learner and dropped where it asks for none: their draws keep torch's random
        # stream (which the phones' sampling reads) seed for seed what it was when every
        # run held both (tests/test_behaviour_unchanged.py)
        dev = self.accelerator.device
        step = StepCritic(d_t, d_i, hidden=cfg.critic_hidden, init_value=cfg.critic_init_value)
        instr = InstructionCritic(d_t, init_value=cfg.critic_init_value)
        self.step_critic = step.to(dev) if "step" in learner.critics else None
        self.instr_critic = instr.to(dev) if "instruction" in learner.critics else None
        self.critic_opt = None
        if self._critics():
            self.critic_opt = torch.optim.Adam(
                [p for m in self._critics() for p in m.parameters()], lr=cfg.critic_lr)
        self.learner = learner(self)  # the update rule (digirl_lite.learners)
        self.actor_opt = self._actor_optimizer()
        # one set of weights on every process (process 0's), as DDP does at wrap time
        dist.broadcast_parameters(self.policy.model, *self._critics())
        self.buffer = ReplayBuffer(cfg.capacity, seed=cfg.seed)  # the same on every process
        self.screens = ScreenTable(self.img_dim)
        # minibatches (and, on process 0, the online tasks): this process's own draws
        self.rng = np.random.default_rng(cfg.seed + 7919 * self.rank)
        self.phase = ""  # the last phase done (RUN_PHASES, then "online")
        self._ckpt_seq = 0
        self._stored: list[Trajectory] = []  # what the run's store held when resumed
        self._stored_ids: set[str] = set()  # ids in the run's store
        self.iteration = 0  # online iterations done
        self.online_trajectories = 0
        self.timings: dict[str, float] = {}
        # credentials (device URLs' user info, capabilities' keys) never reach the disk
        self.summary: dict[str, Any] = {"config": redact(cfg.as_dict()), "stages": {},
                                        "unjudged_steps": {}}
        self.curve: list[tuple[int, float]] = []
        self._fleet = None
        self._eval_fleet = None  # eval_judge's phones (None: the evaluations use fleet())
        self._fleet_before: dict[str, Any] = {}  # what the fleets of earlier attempts survived
        self._tb = None
        # learner "async": the background collection (see online_iteration)
        self._collecting = False
        self._behaviour = None  # the phones' copy of the policy, refreshed by _publish
        self._collect_screens: ScreenTable | None = None  # written by the fleet's thread
        self._collect_agent: PolicyBatchAgent | None = None
        self._carried: list[Trajectory] = []  # completed, not yet taken, when it stopped
        self._generation = 0  # collections started by this process
        # one process writes a run folder: a second (a resume while the first still runs, one
        # folder given to two runs) is refused here, before it reaches a device or writes
        self._folder_lock: FileLock | None = None
        self._lock_folder()
        try:
            # the phones last: devices are reached (emulators started) once the rest holds
            self.phones = make_phones(cfg, seed=cfg.seed + 7919 * self.rank)
            if self.phones.n != cfg.n_envs:
                print(f"[digirl_lite] {self.phones.n} devices in android "
                      f"({'devices' if 'devices' in cfg.android else 'emulators'}): the fleet "
                      f"has {self.phones.n} phones (n_envs={cfg.n_envs} applies to the "
                      "simulator)", flush=True)
            if cfg.tensorboard and self.is_main:
                try:
                    from torch.utils.tensorboard import SummaryWriter
                except ImportError as e:
                    raise ImportError("tensorboard=True needs the 'tensorboard' extra: "
                                      "pip install 'digirl-lite[tensorboard]'") from e
                self._tb = SummaryWriter(str(self.out / "tensorboard"))
        except BaseException:
            if hasattr(self, "phones"):
                self.phones.close()
            self._release_folder()
            raise

    def _critics(self) -> list[torch.nn.Module]:
        """The critics this run's learner asked for (its ``critics``)."""
        return [m for m in (self.step_critic, self.instr_critic) if m is not None]

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

    def _initial_policy(self):
        """The policy before :meth:`build_starting_policy`
        (:func:`digirl_lite.policy.factory.initial_policy`)."""
        from digirl_lite.policy.factory import initial_policy

        return initial_policy(self.cfg)

    def _image_encoder(self, dim: int):
        from digirl_lite.vision import SimScreenEncoder

        if self.cfg.image_encoder == "sim":
            return SimScreenEncoder(dim=dim, seed=0)
        from digirl_lite.vision import Blip2Features

        try:
            return Blip2Features(Path(self.cfg.image_encoder).expanduser(),
                                 device=self.accelerator.device)
        except (OSError, ValueError) as e:
            raise ConfigError(f"image_encoder {self.cfg.image_encoder!r}: {e}") from None

    def _text_encoder(self):
        """The critics' frozen text encoder (``text_encoder``), on the run's device."""
        from digirl_lite.critics import HFTextEncoder, MiniLMEncoder

        dev = self.accelerator.device
        if self.cfg.text_encoder == "minilm":
            return MiniLMEncoder(device=dev)
        try:
            return HFTextEncoder(Path(self.cfg.text_encoder).expanduser(), device=dev)
        except (OSError, ValueError) as e:
            raise ConfigError(f"text_encoder {self.cfg.text_encoder!r}: {e}") from None

    def iterate(self, n: int, desc: str):
        """``range(n)`` with a progress bar when the phase is long enough to watch (part of
        the learners' interface, :class:`digirl_lite.learners.base.Run`)."""
        if n < 20:
            yield from range(n)
            return
        with self._bar(n, desc) as bar:
            for i in range(n):
                yield i
                bar.update()

    def _bar(self, total: int, desc: str, unit: str = "it"):
        """A one-line progress bar for one phase (tqdm): only on a terminal, only on process
        0, never without ``progress`` (elsewhere :meth:`say` prints a line per phase)."""
        import sys

        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True,
                    disable=not (self.progress and self.is_main and sys.stderr.isatty()))

    def say(self, message: str) -> None:
        """One line of what the run is doing (process 0, with ``progress``)."""
        if self.progress and self.is_main:
            print(f"[digirl_lite] {message}", flush=True)

    # -- plumbing -----------------------------------------------------------------------
    @staticmethod
    def _seed_everything(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    def log(self, **record: Any) -> None:
        if not self.is_main:
            return
        record = redact({"time": round(time.time(), 3), **record})  # no credentials
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record, default=float) + "\n")
        if self._tb is not None:
            prefix = str(record.get("stage", "run")).replace(":", "/")  # eval:online
            for k, v in record.items():
                if k != "time" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(f"{prefix}/{k}", v, self.online_trajectories)
            self._tb.flush()
        if self.progress:
            keys = [k for k in record if k not in ("time",)]
            print("  ".join(f"{k}={record[k]}" for k in keys), flush=True)

    def timed(self, name: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, its seconds added to ``timings[name]`` (an iteration's ``time_split``;
        part of the learners' interface, :class:`digirl_lite.learners.base.Run`)."""
        t0 = time.perf_counter()
        out = fn()
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0
        return out

    def fleet(self):
        if self._fleet is None:
            from digirl_lite.rollout import make_fleet

            self._fleet = make_fleet(self.cfg.fleet, self.phones.make_env, self.phones.n,
                                     **self._fleet_options())
        return self._fleet

    def _fleet_options(self) -> dict[str, Any]:
        c = self.cfg
        opts = {"max_unjudged_steps": c.max_unjudged_steps,
                "max_unjudged_s": c.max_unjudged_s,
                "max_task_attempts": c.max_task_attempts,
                "quarantine_after": c.quarantine_after,
                "quarantine_probe_s": c.quarantine_probe_s, **c.fleet_options}
        if self.phones.down:  # endpoints unreachable at the start: in when they answer
            opts["quarantined"] = self.phones.down
        return opts

    def eval_fleet(self):
        """The evaluations' fleet: :meth:`fleet` itself, or with ``eval_judge`` a fleet of
        simulated phones like the run's (same seeds, tasks, surprises) judged by it."""
        if self.cfg.eval_judge is None:
            return self.fleet()
        if self._eval_fleet is None:
            from digirl_lite.envs.setup import make_phones
            from digirl_lite.rollout import make_fleet

            cfg = dataclasses.replace(self.cfg, judge=self.cfg.eval_judge, eval_judge=None)
            phones = make_phones(cfg, seed=self.cfg.seed + 7919 * self.rank, probe=False)
            self._eval_fleet = make_fleet(self.cfg.fleet, phones.make_env, phones.n,
                                          **self._fleet_options())
        return self._eval_fleet

    def _save_fleet_stats(self) -> None:
        """``fleet.json``: what the run's fleets survived so far, all attempts (process 0,
        at every checkpoint and stop; a resumed run reads it back)."""
        if self.is_main:
            atomic_write_text(self.out / FLEET_FILE, json.dumps(self._fleet_stats()))

    def _fleet_stats(self) -> dict[str, Any]:
        """What this process's fleets survived: this attempt's fleets (the run's and, with
        ``eval_judge``, the evaluations'; {} before they were built) added to what the run's
        earlier attempts had survived by their last checkpoint or stop (``fleet.json``: a
        resumed run reports its whole history; a kill loses what came after the last
        checkpoint, whose phase is redone)."""
        out = self._fleet_before
        for fleet in (self._fleet, self._eval_fleet):
            if fleet is not None:
                out = merge_fleet_stats(out, fleet.stats.as_dict())
        return redact(out)  # devices named by URL

    def close(self) -> None:
        """Stop the fleet's workers (threads, processes, Ray actors), the emulators this run
        started, and TensorBoard."""
        self._collecting = False  # close() stops the background collection too
        try:
            for name in ("_fleet", "_eval_fleet"):
                if getattr(self, name) is not None:
                    getattr(self, name).close()
                    setattr(self, name, None)
            self.phones.close()
            if self._tb is not None:
                self._tb.close()
                self._tb = None
        finally:  # and lets the run folder go
            self._release_folder()

    def agent(self, screens: ScreenTable | None = None) -> PolicyBatchAgent:
        m = self.sampling_masks()  # what an on-policy learner scores under, too
        return PolicyBatchAgent(self.policy, self.features,
                                screens if screens is not None else self.screens,
                                self.cfg.temperature, m.max_new_tokens, m.constrained,
                                m.copy_text, m.copy_once)

    def sampling_masks(self) -> Any:
        """The :class:`~digirl_lite.policy.base.Masks` this run's agent samples under (an
        on-policy learner scores the recorded tokens under the same)."""
        from digirl_lite.policy.base import Masks

        c = self.cfg
        return Masks(c.constrained_decoding, self.copy_text(), c.typed_span_once,
                     c.max_new_tokens)

    def copy_text(self) -> Any:
        """What the sampling's copy mask gets: False (none), True (any span) or the run's
        span extractor (``typed_span_extractor``; built once, cached by key)."""
        c = self.cfg
        if not c.copy_typed_text or c.typed_span_extractor == "none":
            return bool(c.copy_typed_text)
        if self._span_extractor is None:
            from digirl_lite.train.starting import span_extractor

            self._span_extractor = span_extractor(c, cache_dir=self.cache_dir, log=self.log)
        return self._span_extractor

    def _train_tasks(self):
        return self.phones.train_tasks

    def _test_tasks(self):
        return self.phones.test_tasks

    def _cache_key(self, *parts: Any) -> str:
        return content_key(*parts)

    # -- the starting policy (AutoUI role) ---------------------------------------------------
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

    # -- the stored pile ------------------------------------------------------------------
    def pile_key(self) -> str:
        """The cache key of the pile: every setting that changes what it holds."""
        c = self.cfg
        policy_id = (self.sft_key() if c.starting_policy in ("sft", "shipped")
                     else str(Path(c.starting_policy).expanduser().resolve()))
        if c.policy == "vlm" and c.starting_policy == "shipped":  # the base model as it is
            policy_id = ("vlm", str(Path(c.policy_path).expanduser().resolve()), c.lora,
                         c.vlm_image_size, c.vlm_dtype)
        devices = () if c.env == "sim" else (c.env, c.android)  # sim keys as before
        devices += () if c.day == 1 else (("day", c.day),)  # day 1 keys as before
        devices += (("surprises", sorted(c.sim_surprises.items())),) if c.sim_surprises else ()
        devices += (("faults", sorted(c.sim_faults.items())),) if c.sim_faults else ()
        devices += (("layout", c.sim_layout),) if c.sim_layout != "older" else ()
        devices += (("phrasing", c.phrasing_share),) if c.phrasing_share else ()
        devices += ((("phrasings", c.train_phrasings),)
                    if c.phrasing_share and c.train_phrasings != "base" else ())
        devices += (("copy_typed_text", True),) if c.copy_typed_text else ()
        devices += ((("span_extractor", c.typed_span_extractor),)
                    if c.typed_span_extractor != "none" else ())
        devices += ((("span_phrasings", c.typed_span_phrasings),)
                    if c.typed_span_phrasings is not None else ())
        devices += (("span_once", True),) if c.typed_span_once else ()
        return self._cache_key("pile-v3", c.world, c.seed, c.pile_size, c.judge, c.temperature,
                               c.constrained_decoding, c.max_new_tokens, c.horizon, c.task_file,
                               policy_id, *devices)

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

    def phone_day(self, iteration: int | None = None) -> int:
        """The simulated phone's drift day after ``iteration`` online iterations (None: the
        iterations done; the pile's -1: none): ``day + floor(k * days_per_iteration)``."""
        k = self.iteration if iteration is None else max(iteration, 0)
        return self.cfg.day + int(np.floor(k * self.cfg.days_per_iteration + 1e-9))

    def _collect(self, stage: str, agent: PolicyBatchAgent, tasks: Sequence[Any],
                 screens: ScreenTable, *, id_prefix: str, seed: int = 0, fleet: Any = None,
                 **kw: Any):
        """``fleet.collect`` for ``stage`` (``fleet``: :meth:`fleet` when None), counting
        unjudged steps. Episode ``k`` of
        ``tasks`` is ``{id_prefix}-{k:05d}`` with env seed ``seed + k`` whatever the number
        of processes: with N processes each collects its own contiguous share and the
        episodes (and their screens) are exchanged, so every process returns all of them.

        When the judge cannot answer (``max_unjudged_steps`` in a row, or no verdict for
        ``max_unjudged_s``) or no device is left, what had finished is kept aside
        (:meth:`_stop_run`) and :class:`RunStopped` says why.

        A background collection (``learner="async"``) is stopped first (the fleet collects
        one thing at a time); the next take starts it again."""
        self._stop_collecting()
        if self.cfg.day != 1 or self.cfg.days_per_iteration:  # drift (env "sim" only)
            kw["reset_options"] = {"day": self.phone_day(kw.get("iteration"))}
        a = self.rank * len(tasks) // self.world_size
        b = (self.rank + 1) * len(tasks) // self.world_size
        stopped: dict[str, Any] | None = None
        with self._bar(b - a, f"{stage}: episodes", unit="ep") as bar:
            def started(_slot: int, obs: Observation) -> None:
                if obs.step == 0:
                    bar.update()

            try:
                episodes = (fleet if fleet is not None else self.fleet()).collect(
                    agent, list(tasks[a:b]), screens, id_prefix=id_prefix, seed=seed + a,
                    on_step=started, **kw)
            except (JudgeUnavailable, NoDevicesLeft) as e:
                episodes, stopped = e.episodes, self._why_stopped(e)
        if self.world_size > 1:
            episodes, stopped = self._exchange(episodes, stopped, screens, id_prefix, a)
        if stopped is not None:
            self._stop_run(stage, [ep.trajectory for ep in episodes], screens, stopped)
        self._tally_unjudged(stage, [ep.trajectory for ep in episodes])
        return episodes

    def _why_stopped(self, e: JudgeUnavailable | NoDevicesLeft) -> dict[str, Any]:
        """What :meth:`_stop_run` says and logs about a collection that had to stop."""
        if isinstance(e, NoDevicesLeft):
            return {"why": f"no device was left (every one quarantined): {e.reason}",
                    "fix": "bring the devices back and resume", "log": {"reason": e.reason,
                                                                          "no_devices": True}}
        quiet = f" (no verdict for {e.seconds:.0f} s)" if e.seconds is not None else ""
        return {"why": f"{e.n} steps in a row were unjudged{quiet}; the last one: {e.reason} "
                       f"(the judge's config: {self.cfg.judge})", "fix": "fix the judge and resume",
                "log": {"unjudged_in_a_row": e.n, "reason": e.reason,
                        "seconds_without_verdict": e.seconds}}

    def _stop_run(self, stage: str, got: list[Trajectory], screens: ScreenTable,
                  stopped: dict[str, Any]) -> None:
        """The judge could not answer or no device was left (``stopped``, from
        :meth:`_why_stopped`): keep what had finished (``got``) in a store of its own,
        ``stopped/<stage>``, raise :class:`RunStopped`.

        The run's store and checkpoints are left as they were: the last checkpoint is at
        the start of the phase that stopped (one is saved after every phase, iteration and
        evaluation), so ``--resume`` redoes that phase whole, with the same task draws, and
        never mistakes a part of a pile or an iteration for all of it (issue 29)."""
        self.features.fill(screens)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", stage).strip("-")
        n = 1 + sum(1 for p in (self.out / "stopped").glob(f"{name}-*"))
        where = self.out / "stopped" / f"{name}-{n}"  # each stop its own: none overwritten
        if self.is_main and got:
            TrajectoryStore.create(where, screens.feature_dim).append(got, screens)
        latest = self.out / "checkpoints" / "latest"
        resume = (f"--resume goes on from checkpoint {latest.read_text().strip()} (the start "
                  f"of {stage})" if latest.is_file() else "the run starts over")
        self.log(stage="stopped", during=stage, **stopped["log"], kept_trajectories=len(got),
                 kept_in=str(where) if got else None, fleet=self._fleet_stats())
        self._save_fleet_stats()  # a resumed run's summary names the devices that left
        kept = f"kept in {where}" if got else "none to keep"
        raise RunStopped(
            f"stopped during {stage}: {stopped['why']}. {len(got)} finished trajectories: "
            f"{kept}; {stopped['fix']}: {resume}")

    def _tally_unjudged(self, stage: str, trajs: Sequence[Trajectory]) -> None:
        """Count ``trajs``' unjudged steps and steps under ``stage`` (the judge's
        reliability in the summary)."""
        steps = sum(len(t) for t in trajs)
        unjudged = sum(t.num_unjudged for t in trajs)
        name = "online" if stage.startswith("online") else stage
        tally = self.summary.setdefault("unjudged_steps", {})
        u, n = tally.get(name, (0, 0))
        tally[name] = [u + unjudged, n + steps]

    def _exchange(self, episodes: list, stopped: dict[str, Any] | None,
                  screens: ScreenTable, id_prefix: str, first: int):
        """Every process's episodes (renamed to their index in the whole task list) and the
        screens they visit (images and features), on every process, in task order."""
        from dataclasses import replace

        def renamed(ep):
            k = int(ep.trajectory.traj_id.rsplit("-", 1)[1])
            return replace(ep, trajectory=replace(ep.trajectory,
                                                  traj_id=f"{id_prefix}-{first + k:05d}"))

        episodes = [renamed(ep) for ep in episodes]
        self.features.fill(screens)
        rows = self._screen_rows([ep.trajectory for ep in episodes], screens)
        parts = dist.all_gather((episodes, rows, stopped))
        out: list = []
        stops = []
        for r, (eps, rws, stop) in enumerate(parts):
            out += eps
            if stop is not None:
                stops.append(stop)
            if r != self.rank:
                for sid, img, feats in rws:
                    screens.add(img, feats, screen_id=sid)
        return out, (stops[0] if stops else None)

    @staticmethod
    def _screen_rows(trajs: Sequence[Trajectory], screens: ScreenTable) -> list[tuple]:
        """(id, decoded image, features) of every screen ``trajs`` visit, once each."""
        seen: dict[str, None] = {}
        for t in trajs:
            for st in t.steps:
                seen.setdefault(st.screen_id)
                seen.setdefault(st.next_screen_id)
        feats = screens.features(list(seen)) if seen else []
        return [(sid, screens.image(sid), f) for sid, f in zip(seen, feats)]

    # -- the learner (digirl_lite.learners: one file per algorithm) ---------------------------
    def _actor_optimizer(self) -> torch.optim.Optimizer:
        """The learner's optimiser of the actor (AdamW at ``actor_lr``; PPO: the value head's
        group at ``value_lr``)."""
        return self.learner.make_actor_optimizer()

    def offline(self, pile: Sequence[Trajectory]) -> None:
        """The offline phase: the pile into the buffer, then the learner's offline update on
        its training split."""
        self.buffer.add(pile)
        self.log(stage="offline", **self.learner.offline(self.buffer.trajectories("train")))

    def _bound_memory(self) -> dict[str, int]:
        """Memory bounded by the buffer (issue 15): drop the screens no buffered trajectory
        uses (they are in the store) and trim the feature / text caches to what the buffer
        needs plus a few recently used entries (:mod:`digirl_lite.train.memory`)."""
        from digirl_lite.train.memory import bound_to_buffer

        return bound_to_buffer(self.buffer, self.screens, self.features, self.text)

    def online_iteration(self, k: int, collected: list[Trajectory] | None = None) -> None:
        """Iteration ``k`` (1-based). ``collected``: trajectories already collected and
        stored for it before a crash (resume), so they are not collected again.

        ``learner="async"``: instead of collecting, take ``rollouts_per_iteration``
        completed trajectories from the background collection (:meth:`take_online`), then
        update as the synchronous loop does and publish the new weights to the phones
        (:meth:`_publish`: steps sampled from then on carry version ``k``)."""
        c = self.cfg
        t_iter = time.perf_counter()
        before = dict(self.timings)
        staleness: dict[str, Any] = {}
        mechanism: dict[str, Any] = {}  # recoveries in the successes (issue 47), sync only
        if collected is None and c.learner == "async":
            collected, staleness = self.take_online(k)
        elif collected is None:
            tasks = self._train_tasks()
            # process 0 draws every process's tasks: rollouts_per_iteration each
            idx = dist.broadcast_object(self.learner.draw_tasks(
                len(tasks), c.rollouts_per_iteration * self.world_size)
                if self.is_main else None)
            self.fleet().policy_version = k - 1  # the weights after k - 1 iterations
            agent = self.agent()
            episodes = self.timed("collect", lambda: self._collect(
                f"online iteration {k}", agent, [tasks[i] for i in idx], self.screens,
                id_prefix=f"online-s{c.seed}-it{k:04d}", source=Source.ONLINE, iteration=k,
                seed=c.seed * 1_000_003 + 100_000 * k))
            collected = [e.trajectory for e in episodes]
            mechanism = recovery_stats(episodes)
            self.timings["inference"] = self.timings.get("inference", 0.0) + agent.seconds
            self.features.fill(self.screens)
            self.timed("store", lambda: self._store_append(collected))
        self.buffer.add(collected)
        self._bound_memory()
        self.online_trajectories += len(collected)
        update = self.learner.update(collected)
        if c.learner == "async":
            self._publish(k)
            if not staleness:  # resumed with what was stored before a crash
                staleness = {"async_dropped": 0, **self._staleness_counts(collected, k - 1)}
        self.iteration, self.phase = k, "online"
        self.timed("checkpoint", self.save_checkpoint)
        wins = float(np.mean([t.is_success for t in collected])) if collected else 0.0
        split = {name: round(self.timings.get(name, 0.0) - before.get(name, 0.0), 3)
                 for name in ITERATION_PHASES}
        split["environments"] = round(split["collect"] - split["inference"], 3)
        self.log(stage="online", iteration=k, online_trajectories=self.online_trajectories,
                 collect_success=round(wins, 4), **mechanism, **update,
                 **staleness, seconds=round(time.perf_counter() - t_iter, 2),
                 time_split=split)

    # -- the asynchronous learner (learner="async"; issue 17, spec/DARWIN.md A.1) ----------
    def take_online(self, k: int) -> tuple[list[Trajectory], dict[str, Any]]:
        """Iteration ``k``'s data from the background collection (started here if it is not
        running): completed trajectories in ``take_order``, first those carried over from a
        stopped collection, until ``rollouts_per_iteration`` of them are at most
        ``max_staleness`` policy versions behind the learner's (``k - 1``: the weights after
        ``k - 1`` iterations). A trajectory's staleness is that of its oldest step; staler
        ones are dropped (neither stored nor trained on, counted in ``async_dropped``).
        What is kept is renumbered to iteration ``k``, its screens copied into the run's
        table, and stored. Returns the trajectories and the counts for metrics.jsonl:
        ``async_dropped``, ``staleness`` (kept trajectories per staleness) and
        ``staleness_max``; the steps keep the ``policy_version`` they were sampled with.

        ``collect`` in the iteration's ``time_split`` is the learner's wait for completed
        trajectories; the phones' inference runs beside the learner, in
        ``async_inference_s``."""
        c = self.cfg
        self._start_collecting()
        now = k - 1
        kept: list[Trajectory] = []
        dropped: list[Trajectory] = []
        inference0 = self._collect_agent.seconds
        t0 = time.perf_counter()
        while len(kept) < c.rollouts_per_iteration:
            want = c.rollouts_per_iteration - len(kept)
            batch, self._carried = self._carried[:want], self._carried[want:]
            if len(batch) < want:
                try:
                    batch += [e.trajectory for e in self.fleet().take(want - len(batch))]
                except (JudgeUnavailable, NoDevicesLeft) as e:  # as the sync loop does
                    self._collecting = False
                    self.fleet().stop()
                    got = kept + [t for t in batch + [ep.trajectory for ep in e.episodes]
                                  if self._stale(t, now) <= c.max_staleness]
                    self._stop_run(f"online iteration {k}", self._adopt(got, k),
                                   self.screens, self._why_stopped(e))
            for t in batch:
                (kept if self._stale(t, now) <= c.max_staleness else dropped).append(t)
        self.timings["collect"] = self.timings.get("collect", 0.0) + time.perf_counter() - t0
        self._tally_unjudged("online", kept + dropped)
        kept = self._adopt(kept, k)
        self.timed("store", lambda: self._store_append(kept))
        summary = self.summary.setdefault("async", {"kept": 0, "dropped": 0})
        summary["kept"] += len(kept)
        summary["dropped"] += len(dropped)
        return kept, {"async_dropped": len(dropped),
                      "async_dropped_staleness": sorted(self._stale(t, now) for t in dropped),
                      **self._staleness_counts(kept, now),
                      "async_inference_s": round(self._collect_agent.seconds - inference0, 3)}

    @staticmethod
    def _stale(t: Trajectory, now: int) -> int:
        """Policy versions between ``now`` and ``t``'s oldest step (0 without steps)."""
        return now - min((s.policy_version for s in t.steps), default=now)

    def _staleness_counts(self, trajs: Sequence[Trajectory], now: int) -> dict[str, Any]:
        got = [self._stale(t, now) for t in trajs]
        return {"staleness": {str(v): got.count(v) for v in sorted(set(got))},
                "staleness_max": max(got, default=0)}

    def _adopt(self, trajs: list[Trajectory], k: int) -> list[Trajectory]:
        """``trajs`` from the background collection as iteration ``k``'s: renumbered, their
        screens copied into the run's table (the fleet's thread keeps writing its own),
        features filled."""
        trajs = [replace(t, iteration=k) for t in trajs]
        self._copy_screens(trajs, self._collect_screens, self.screens)
        self.features.fill(self.screens)
        return trajs

    @staticmethod
    def _copy_screens(trajs: Sequence[Trajectory], src: ScreenTable, dst: ScreenTable) -> None:
        for t in trajs:
            for st in t.steps:
                for sid in (st.screen_id, st.next_screen_id):
                    if sid not in dst:
                        image, feats = src.row(sid)
                        dst.add(image, feats, screen_id=sid)

    def _start_collecting(self) -> None:
        """Start the background collection unless it runs: the phones' own copy of the
        policy (:meth:`_publish` refreshes it; the learner never updates weights a phone is
        sampling from), a screen table of their own, and an endless stream of training
        tasks drawn from a generator seeded by the run's ``rng``. Trajectory ids are
        ``online-s{seed}-a{generation}-{k}``: the generation counts the starts over the
        run, resumes included (read back from the store), so ids never repeat."""

        from digirl_lite.vision import FeatureCache

        if self._collecting:
            return
        c = self.cfg
        pattern = re.compile(rf"online-s{c.seed}-a(\d+)-")
        stored = [int(m.group(1)) for i in self._stored_ids if (m := pattern.match(i))]
        self._generation = max([self._generation, *stored]) + 1
        if self._behaviour is None:
            self._behaviour = copy.copy(self.policy)  # the tokenizer is shared (read only)
            self._behaviour.model = copy.deepcopy(self.policy.model)
        else:
            self._behaviour.model.load_state_dict(self.policy.model.state_dict())
        self._behaviour.model.eval()
        if self._collect_screens is None:
            self._collect_screens = ScreenTable(self.img_dim)
        self._collect_agent = PolicyBatchAgent(
            self._behaviour, FeatureCache(self.features.encoder, max_items=4096),
            self._collect_screens, c.temperature, c.max_new_tokens, c.constrained_decoding,
            self.copy_text(), c.typed_span_once)
        fleet = self.fleet()
        fleet.policy_version = self.iteration
        seed = int(self.rng.integers(0, 2**31 - 1))
        kw = {"reset_options": {"day": c.day}} if c.day != 1 else {}
        fleet.start(self._collect_agent, self._task_stream(np.random.default_rng(seed)),
                    self._collect_screens, id_prefix=f"online-s{c.seed}-a{self._generation:03d}",
                    source=Source.ONLINE, iteration=self.iteration + 1, seed=seed,
                    order=c.take_order, **kw)
        self._collecting = True
        self.say(f"background collection {self._generation} started at policy version "
                 f"{self.iteration} on {self.phones.n} phones")

    def _task_stream(self, rng: np.random.Generator) -> Iterator[Any]:
        """Training tasks drawn uniformly with ``rng``, without end."""
        tasks = self._train_tasks()
        while True:
            yield tasks[int(rng.integers(0, len(tasks)))]

    def _stop_collecting(self) -> None:
        """Stop the background collection (before an evaluation, at the end): episodes still
        running are lost by design (as at a kill); completed ones not yet taken are carried
        over to the next take (in ``take_order`` "start", only those that started before
        the oldest episode still running). ``summary["async"]`` counts what the stop
        discarded. The phones' screen table keeps only what those need."""
        if not self._collecting:
            return
        self._collecting = False
        stats = self.fleet().stats
        before = (stats.discarded_unfinished, stats.discarded_out_of_order)
        left = [e.trajectory for e in self.fleet().stop()]
        self._carried += left
        summary = self.summary.setdefault("async", {"kept": 0, "dropped": 0})
        for key, was, now in zip(("discarded_running", "discarded_out_of_order"), before,
                                 (stats.discarded_unfinished, stats.discarded_out_of_order)):
            summary[key] = summary.get(key, 0) + now - was
        keep = ScreenTable(self.img_dim)
        self._copy_screens(self._carried, self._collect_screens, keep)
        self._collect_screens = keep

    def _publish(self, k: int) -> None:
        """The learner's weights to the phones, inference held while they change; steps
        sampled from then on carry policy version ``k``."""
        if not self._collecting or self._behaviour is None:
            return  # the next start copies them
        with self.fleet().updating_policy(version=k):
            self._behaviour.model.load_state_dict(self.policy.model.state_dict())

    def evaluate(self, stage: str, splits: bool | None = None) -> dict[str, Any]:
        """Held-out success of the current policy, as ``stage``. The evaluation samples
        from a random stream of its own, fixed by the seed and the stage's name, and leaves
        the run's streams where they were: neither training nor a later evaluation depends
        on how often a run evaluates (``eval_every``), and two arms of a grid evaluate a
        stage with the same random numbers (their paired difference has less noise).

        ``splits``: also evaluate each held-out split of ``eval_splits`` (issue 32 item 5),
        the same way on a stream of its own, into ``report["splits"][name]`` (no key where
        the run has none); None: at the stage ends (:data:`SPLIT_STAGES`), not at the
        learning curve's points. The report
        reaches the summary (and so the next checkpoint) only with its splits: a run killed
        during them redoes the stage whole."""
        report = self._evaluation(stage, self._test_tasks(), self.cfg.eval_tasks)
        report["day"] = self.phone_day()  # the simulated phone's drift day (1: none)
        self._log_evaluation(stage, report)
        if self.phones.splits and (splits or (splits is None and stage in SPLIT_STAGES)):
            report["splits"] = {}
            for name, tasks in self.phones.splits.items():
                rep = self._evaluation(f"{stage}:{name}", tasks, self.cfg.eval_split_tasks)
                rep["day"] = report["day"]
                self._log_evaluation(f"{stage}:{name}", rep)
                report["splits"][name] = rep
        self.summary["stages"][stage] = report
        self.curve.append((self.online_trajectories, report["success_rate"]))
        # judged and true side by side (issue 32): a noisy judge shows as the gap
        self.say(f"eval:{stage}: {stage_rates(report)}, {report['judged_episodes']}/"
                 f"{report['episodes']} judged"
                 + ("; " + " | ".join(f"{name} {split_rate(rep)}" for name, rep
                                      in report["splits"].items())
                    if report.get("splits") else ""))
        for name, rep in [(stage, report), *((f"{stage}:{k}", r) for k, r
                                              in (report.get("splits") or {}).items())]:
            if not rep["complete"]:
                self.say(f"evaluation {name} is incomplete: {rep['judged_episodes']} of "
                         f"{rep['episodes']} tasks judged (min_judged_share "
                         f"{self.cfg.min_judged_share}); its rate is not reported as the "
                         + ("stage's" if name == stage else "split's"))
        return report

    def _evaluation(self, name: str, tasks: Sequence[Any], n_tasks: int) -> dict[str, Any]:
        """One evaluation of the first ``n_tasks`` of ``tasks`` as ``name`` (a stage, or
        ``<stage>:<split>``): its random stream from ``eval:<name>``, its episodes
        ``eval-<name>-NNNNN``, all of them stored in ``eval/<name>/`` (":" as "-")."""
        screens = ScreenTable(self.img_dim)
        dev = self.accelerator.device
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(self.cfg.seed + 7919 * self.rank
                              + zlib.crc32(f"eval:{name}".encode()))
            report, episodes = self.timed("evaluate", lambda: evaluate(
                _StageFleet(self, f"eval:{name}"), self.agent(screens), tasks,
                n_tasks=n_tasks, seed=10_000 + self.cfg.seed,
                id_prefix=f"eval-{name.replace(':', '-')}", screens=screens,
                min_judged_share=self.cfg.min_judged_share))
        if self.is_main:  # every evaluation trajectory, for replay and the report
            self.features.fill(screens)
            ev = self.out / "eval" / name.replace(":", "-")
            if ev.exists():
                shutil.rmtree(ev)  # an evaluation interrupted by a crash, now redone
            TrajectoryStore.create(ev, screens.feature_dim).append(
                [e.trajectory for e in episodes], screens)
        return report

    def _log_evaluation(self, name: str, report: dict[str, Any]) -> None:
        """The evaluation's line in metrics.jsonl, ``stage`` ``eval:<name>``."""
        self.log(stage=f"eval:{name}", online_trajectories=self.online_trajectories,
                 day=report["day"],
                 success_rate=round(report["success_rate"], 4),
                 ci95=[round(x, 3) for x in report["ci95"]],
                 mean_length=round(report["mean_length"], 2),
                 invalid_step_rate=round(report["invalid_step_rate"], 4),
                 unjudged=report["unjudged"], failure_kinds=report["failure_kinds"],
                 judged=f"{report['judged_episodes']}/{report['episodes']}",
                 complete=report["complete"], not_evaluated=report["not_evaluated"],
                 success_rate_unjudged_as_failures=round(
                     report["success_rate_unjudged_as_failures"], 4),
                 truth=report["truth"], true_success_rate=round(report["true_success_rate"], 4),
                 judge_accuracy=(report["judge_agreement"] or {}).get("accuracy"),
                 failure_causes=report.get("failure_causes") or None,
                 success_with_recovery=report.get("success_with_recovery"))

    # -- persistence ----------------------------------------------------------------------
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
        self._save_fleet_stats()
        fsync_tree(tmp)
        final = root / name
        os.rename(tmp, final)
        fsync_dir(root)
        previous = (root / "latest").read_text().strip() if (root / "latest").is_file() else ""
        atomic_write_text(root / "latest", name)
        fsync_dir(root)
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

    # -- the whole run --------------------------------------------------------------------
    def run(self, resume: bool = False, offline: bool = True, online: bool = True,
            allow_config_change: bool = False) -> dict[str, Any]:
        """The whole run: starting policy (evaluated as "copier"), then the offline phase on
        the pile (evaluated as "offline") unless ``offline=False``, then ``cfg.iterations``
        online iterations (evaluated as "online") unless ``online=False``.

        A checkpoint follows every phase (:data:`RUN_PHASES`), every iteration and every
        evaluation, so ``resume`` continues the run in ``out_dir`` from wherever it was
        killed: a phase that had not finished is redone, and what it had stored is read
        back, never stored twice. ``allow_config_change``: resume under a config that
        differs from the run's (refused otherwise)."""
        try:
            self._lock_folder()  # held since __init__, unless an earlier run() let it go
            return self._run(resume, offline, online, allow_config_change)
        finally:  # a stopped or crashed run still ends its workers and emulators
            self.close()

    def _done(self, phase: str) -> bool:
        order = (*RUN_PHASES, "online")
        return bool(self.phase) and order.index(self.phase) >= order.index(phase)

    def _finish(self, phase: str) -> None:
        self.phase = phase
        self.save_checkpoint()

    def _run(self, resume: bool, offline: bool, online: bool,
             allow_config_change: bool) -> dict[str, Any]:
        t0 = time.perf_counter()
        c = self.cfg
        iterations = c.iterations if online else 0
        self.say(f"run folder: {self.out.resolve()} (metrics.jsonl, summary.json, store/, "
                 "eval/, checkpoints/)" + (f"; cache: {self.cache_dir}" if self.cache_dir
                                           else ""))
        if resume and self.load_checkpoint(allow_config_change):
            self.log(stage="resume", phase=self.phase, iteration=self.iteration)
        else:
            if (self.out / "checkpoints" / "latest").is_file() or (self.out / "store").exists():
                raise FileExistsError(f"{self.out} holds a run; pass resume=True (--resume) "
                                      "or another output folder")
            if resume:
                self.say(f"nothing to resume in {self.out}: starting the run")
        if not self._done("starting_policy"):
            self.say("starting policy")
            self.build_starting_policy()
            self._finish("starting_policy")
        self.copy_text()  # the span extractor, here: all processes fine-tune it together
        if not self._done("eval:copier"):
            self.evaluate("copier")
            self._finish("eval:copier")
        if offline:
            pile = None
            if not self._done("pile"):
                pile = self.build_pile()
                self._store_append(pile)
                self._finish("pile")
            if not self._done("offline"):
                pile = pile if pile is not None else self.build_pile()
                self.say(f"offline phase: {self.learner.offline_work} on {len(pile)} "
                         "trajectories")
                # the offline phase draws from a stream fixed by the seed alone: the same
                # whether the pile was collected here (which samples), read from the cache
                # or from the store of an interrupted run
                offline_seed = c.seed + 7919 * self.rank + 15_485_863
                self._seed_everything(offline_seed)
                self.rng = np.random.default_rng(offline_seed)
                self.offline(pile)
                self._finish("offline")
            if not self._done("eval:offline"):
                self.evaluate("offline")
                self._finish("eval:offline")
        pending = [t for t in self._stored if t.iteration == self.iteration + 1
                   and t.source is Source.ONLINE]
        if iterations:
            self.say(f"online phase: {iterations} iterations of "
                     f"{c.rollouts_per_iteration * self.world_size} trajectories")
        bar = self._bar(iterations, "online iterations")
        bar.update(min(self.iteration, iterations))
        while True:
            k = self.iteration
            if (c.eval_every and 0 < k < iterations and k % c.eval_every == 0
                    and f"online-{k}" not in self.summary["stages"]):
                self.evaluate(f"online-{k}")
                self.save_checkpoint()
            if k >= iterations:
                break
            self.online_iteration(k + 1, collected=pending or None)
            bar.update()
            pending = []
        bar.close()
        if online and "online" not in self.summary["stages"]:
            self.evaluate("online")
        self.summary.update({
            "wall_s": round(time.perf_counter() - t0, 1) + self.summary.get("wall_s", 0.0),
            "online_trajectories": self.online_trajectories,
            "processes": self.world_size,
            "buffer": self.buffer.counts(),
            "timings_s": {k: round(v, 2) for k, v in self.timings.items()},
            "feature_cache_hit_rate": round(self.features.hit_rate, 3),
            # what the devices survived, and which left the fleet when (issue 29)
            "fleet": self._fleet_stats(),
            # per stage: unjudged steps / steps collected (the judge's reliability)
            "unjudged_step_rate": {k: round(u / n, 4) if n else 0.0
                                   for k, (u, n) in self.summary.get("unjudged_steps",
                                                                     {}).items()},
        })
        self.save_checkpoint()
        if self.is_main:
            atomic_write_text(self.out / "summary.json", json.dumps(redact(self.summary),
                                                                     indent=1, default=float))
            self.plot()
        return self.summary

    def plot(self) -> Path | None:
        """The learning curve to ``out/learning_curve.png``: drawn on a figure of its own
        (``matplotlib.figure.Figure``), so matplotlib's backend (a notebook's inline one)
        is left as it was."""
        try:
            from matplotlib.figure import Figure
        except ImportError:  # pragma: no cover - a core dependency
            return None
        xs = [x for x, _ in self.curve]
        ys = [y for _, y in self.curve]
        fig = Figure(figsize=(6, 4))
        ax = fig.subplots()
        ax.plot(xs, ys, marker="o")
        ax.set_xlabel("online trajectories")
        ax.set_ylabel(f"held-out success ({self.cfg.eval_tasks} test tasks)")
        ax.set_ylim(0, 1)
        where = f"simulated {self.cfg.world}" if self.cfg.env == "sim" else \
            f"{self.cfg.world} on {self.phones.n} devices"
        ax.set_title(f"{self.cfg.algorithm} {where}, seed {self.cfg.seed}")
        ax.grid(alpha=0.3)
        path = self.out / "learning_curve.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        return path
