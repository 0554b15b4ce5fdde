"""DigiRL's loop (spec/DIGIRL.md section 7), top-down: starting policy, pile, offline phase,
online iterations, evaluation (:meth:`Trainer.run`).

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

This file is the loop; the Trainer's other jobs are mixed in from their own modules:
:mod:`~digirl_lite.train.pile` (the starting policy and the pile),
:mod:`~digirl_lite.train.collection` (the agent, the fleets, collection with its
data-parallel exchange), :mod:`~digirl_lite.train.async_collection` (the background
collection), :mod:`~digirl_lite.train.checkpoints` (the run folder: lock, store,
checkpoints, resume) and :mod:`~digirl_lite.train.runlog` (metrics.jsonl, TensorBoard,
summary.json, the learning curve).
"""

from __future__ import annotations

import shutil
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from digirl_lite import distributed as dist
from digirl_lite.data.records import ScreenTable, Source, Trajectory
from digirl_lite.data.replay import ReplayBuffer
from digirl_lite.data.store import TrajectoryStore
from digirl_lite.errors import ConfigError
from digirl_lite.learners import learner_class, learner_names
from digirl_lite.paths import FileLock, user_cache_dir
from digirl_lite.policy.updates import (  # noqa: F401 (imported from here)
    mle_update,
    steps_to_batch,
    text_mle_update,
)
from digirl_lite.redaction import redact
from digirl_lite.train.async_collection import AsyncCollection
from digirl_lite.train.checkpoints import RUN_PHASES, RunFolder
from digirl_lite.train.collection import (  # noqa: F401 (imported from here)
    FLEET_FILE,
    Collection,
    PolicyBatchAgent,
    RunStopped,
    _StageFleet,
    merge_fleet_stats,
)
from digirl_lite.train.config import DigiRLConfig
from digirl_lite.train.evaluate import evaluate, recovery_stats, split_rate, stage_rates
from digirl_lite.train.pile import StartingPolicyAndPile
from digirl_lite.train.runlog import RunLog, tensorboard_writer

__all__ = ["PolicyBatchAgent", "Trainer", "RunStopped", "mle_update", "steps_to_batch",
           "text_mle_update", "ITERATION_PHASES", "RUN_PHASES", "SPLIT_STAGES", "USER_CACHE"]

SPLIT_STAGES = ("copier", "offline", "online")
"""The stages evaluated on the held-out splits too (``eval_splits``): the stage ends, not
the learning curve's ``online-k`` points."""

USER_CACHE = "user-cache"
"""``Trainer(cache_dir=USER_CACHE)`` (the default): :func:`digirl_lite.paths.user_cache_dir`."""

ITERATION_PHASES = ("collect", "inference", "store", "critics", "filter", "actor", "checkpoint")
"""Where an online iteration's time goes (``time_split`` in metrics.jsonl): ``collect`` is
the fleet's wall time, of which ``inference`` is the policy's (features + sampling) and
``environments`` the rest."""


class Trainer(StartingPolicyAndPile, Collection, AsyncCollection, RunFolder, RunLog):
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
        from digirl_lite.envs.setup import make_phones, world_info
        from digirl_lite.vision import FeatureCache

        cfg.check_paths()  # every field that cannot work, before anything is built
        from digirl_lite.envs.judges import probe_judge

        probe_judge(cfg.judge)  # a VLM judge that does not answer: refused in seconds
        if cfg.eval_judge is not None:
            probe_judge(cfg.eval_judge)
        self.cfg = cfg
        # what the run needs of its world beyond its phones (drift days, the pile key's
        # world entries, the screens' feature width), from the env factory
        self.world_info = world_info(cfg)
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
        if self.world_size > 1 and cfg.claw:
            # one bank per process would drift apart: each validates on its own episodes
            raise ConfigError(f"claw: the experience bank runs in one process for now (this "
                              f"launch has {self.world_size})")
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
                                      else self.world_info.feature_dim)
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
        # run held both (tests/package/test_behaviour_unchanged.py)
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
        # Darwin-Claw around the learning policy (``claw``): its units act before the policy
        self.claw = None
        if cfg.claw:
            from digirl_lite.train.claw import ClawLoop

            self.claw = ClawLoop(self)
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
                self._tb = tensorboard_writer(self.out)
        except BaseException:
            if hasattr(self, "phones"):
                self.phones.close()
            self._release_folder()
            raise

    def _critics(self) -> list[torch.nn.Module]:
        """The critics this run's learner asked for (its ``critics``)."""
        return [m for m in (self.step_critic, self.instr_critic) if m is not None]

    def _initial_policy(self):
        """The policy before :meth:`build_starting_policy`
        (:func:`digirl_lite.policy.factory.initial_policy`)."""
        from digirl_lite.policy.factory import initial_policy

        return initial_policy(self.cfg)

    def _image_encoder(self, dim: int | None):
        """The frozen image encoder (``image_encoder``): the sim encoder gives ``dim``-d
        features (None: its default width), BLIP-2 its own."""
        from digirl_lite.vision import SimScreenEncoder

        if self.cfg.image_encoder == "sim":
            return SimScreenEncoder(**({} if dim is None else {"dim": dim}), seed=0)
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

    def _actor_optimizer(self) -> torch.optim.Optimizer:
        """The learner's optimiser of the actor (AdamW at ``actor_lr``; PPO: the value head's
        group at ``value_lr``)."""
        return self.learner.make_actor_optimizer()

    # -- the whole run: the algorithm box ------------------------------------------------
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

    def _run(self, resume: bool, offline: bool, online: bool,
             allow_config_change: bool) -> dict[str, Any]:
        t0 = time.perf_counter()
        c = self.cfg
        iterations = c.iterations if online else 0
        self.say(f"run folder: {self.out.resolve()} (metrics.jsonl, summary.json, store/, "
                 "eval/, checkpoints/)" + (f"; cache: {self.cache_dir}" if self.cache_dir
                                           else ""))
        self._resume_or_start(resume, allow_config_change)  # resume: checkpoints.py
        # the starting policy (the AutoUI role), evaluated as "copier"
        self._once("starting_policy", self.build_starting_policy, say="starting policy")
        self.copy_text()  # the span extractor, here: all processes fine-tune it together
        self._once("eval:copier", self.evaluate, "copier")
        if offline:
            # the pile (the starting policy's own attempts, judged), the offline phase on it
            pile = self._once("pile", self._pile_phase)
            self._once("offline", lambda: self._offline_phase(
                pile if pile is not None else self.build_pile()))
            self._once("eval:offline", self.evaluate, "offline")
        # the online iterations: the first of a resumed run takes what it had stored
        pending = self._stored_online(self.iteration + 1)
        if pending and self.claw is not None and self.iteration < iterations:
            self.claw.skipped(self.iteration + 1, "resumed from the trajectories stored "
                              "before a crash, without their screens' UI trees")
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
        if self.claw is not None:
            self.summary["claw"] = {"active": self.claw.active()}
        self.summary.update(self._totals(t0))
        self.save_checkpoint()
        if self.is_main:
            self._write_summary()  # summary.json and learning_curve.png
        return self.summary

    # -- its phases, in order (the starting policy and the pile: train/pile.py) -----------
    def _pile_phase(self) -> list[Trajectory]:
        """The pile (:meth:`build_pile`), in the run's store: a resumed run reads it back."""
        pile = self.build_pile()
        self._store_append(pile)
        return pile

    def _offline_phase(self, pile: list[Trajectory]) -> None:
        self.say(f"offline phase: {self.learner.offline_work} on {len(pile)} trajectories")
        # the offline phase draws from a stream fixed by the seed alone: the same
        # whether the pile was collected here (which samples), read from the cache
        # or from the store of an interrupted run
        offline_seed = self.cfg.seed + 7919 * self.rank + 15_485_863
        self._seed_everything(offline_seed)
        self.rng = np.random.default_rng(offline_seed)
        self.offline(pile)

    def offline(self, pile: Sequence[Trajectory]) -> None:
        """The offline phase: the pile into the buffer, then the learner's offline update on
        its training split."""
        self.buffer.add(pile)
        self.log(stage="offline", **self.learner.offline(self.buffer.trajectories("train")))

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
        episodes = None  # the fleet's episodes, when this iteration collects them here
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
            seed = c.seed * 1_000_003 + 100_000 * k
            # with ``claw``, the bank's active units act before the policy
            acting = self.claw.agent(agent) if self.claw is not None else agent
            episodes = self.timed("collect", lambda: self._collect(
                f"online iteration {k}", acting, [tasks[i] for i in idx], self.screens,
                id_prefix=f"online-s{c.seed}-it{k:04d}", source=Source.ONLINE, iteration=k,
                seed=seed))
            collected = [e.trajectory for e in episodes]
            mechanism = recovery_stats(episodes)
            self.timings["inference"] = self.timings.get("inference", 0.0) + agent.seconds
            self.features.fill(self.screens)
            self.timed("store", lambda: self._store_append(collected))
        self.buffer.add(collected)
        self._bound_memory()
        self.online_trajectories += len(collected)
        update = self.learner.update(collected)
        if self.claw is not None and episodes is not None:
            # the cycle on this iteration's episodes, validated with the updated policy
            # on the same phones (the drift day's, where the phone drifts)
            self.timed("claw", lambda: self.claw.cycle(
                episodes, self.fleet(), salt=seed, iteration=k,
                collect_kwargs=self._reset_kw(k)))
            from digirl_lite.harness.harness import decision_shares

            update["unit_steps"] = round(decision_shares(collected)["rule"], 4)
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
        if self.claw is not None:  # the bank's cycle: triage and causal validation
            split["claw"] = round(self.timings.get("claw", 0.0) - before.get("claw", 0.0), 3)
        self.log(stage="online", iteration=k, online_trajectories=self.online_trajectories,
                 collect_success=round(wins, 4), **mechanism, **update,
                 **staleness, seconds=round(time.perf_counter() - t_iter, 2),
                 time_split=split)

    def _bound_memory(self) -> dict[str, int]:
        """Memory bounded by the buffer (issue 15): drop the screens no buffered trajectory
        uses (they are in the store) and trim the feature / text caches to what the buffer
        needs plus a few recently used entries (:mod:`digirl_lite.train.memory`)."""
        from digirl_lite.train.memory import bound_to_buffer

        return bound_to_buffer(self.buffer, self.screens, self.features, self.text)

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
        if (self.claw is not None and stage in SPLIT_STAGES and self.claw.rules().strip()):
            # the policy without its units, on the same seeds and stream: what the units
            # add at evaluation, apart from what they added to the collected data
            off = self._evaluation(f"{stage}:units_off", self._test_tasks(),
                                   self.cfg.eval_tasks, units=False, stream=stage)
            off["day"] = report["day"]
            self._log_evaluation(f"{stage}:units_off", off)
            report["units_off"] = off
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

    def _evaluation(self, name: str, tasks: Sequence[Any], n_tasks: int, units: bool = True,
                    stream: str | None = None) -> dict[str, Any]:
        """One evaluation of the first ``n_tasks`` of ``tasks`` as ``name`` (a stage, or
        ``<stage>:<split>``): its random stream from ``eval:<stream or name>``, its episodes
        ``eval-<name>-NNNNN``, all of them stored in ``eval/<name>/`` (":" as "-").
        ``units``: with ``claw``, the bank's active units act before the policy (False: the
        policy alone); the report then says who decided the steps (``decided``)."""
        from digirl_lite.harness.harness import decision_shares

        screens = ScreenTable(self.img_dim)
        dev = self.accelerator.device
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(self.cfg.seed + 7919 * self.rank
                              + zlib.crc32(f"eval:{stream or name}".encode()))
            report, episodes = self.timed("evaluate", lambda: evaluate(
                _StageFleet(self, f"eval:{name}"), self._eval_agent(screens, units), tasks,
                n_tasks=n_tasks, seed=10_000 + self.cfg.seed,
                id_prefix=f"eval-{name.replace(':', '-')}", screens=screens,
                min_judged_share=self.cfg.min_judged_share))
        if self.claw is not None:
            report["decided"] = decision_shares([e.trajectory for e in episodes])
        if self.is_main:  # every evaluation trajectory, for replay and the report
            self.features.fill(screens)
            ev = self.out / "eval" / name.replace(":", "-")
            if ev.exists():
                shutil.rmtree(ev)  # an evaluation interrupted by a crash, now redone
            TrajectoryStore.create(ev, screens.feature_dim).append(
                [e.trajectory for e in episodes], screens)
        return report

    def _eval_agent(self, screens: ScreenTable, units: bool = True) -> Any:
        """The evaluations' agent: the run's sampling agent, with ``claw`` and ``units`` the
        bank's active units acting first."""
        agent = self.agent(screens)
        return self.claw.agent(agent) if units and self.claw is not None else agent

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

    # -- what the phases share ------------------------------------------------------------
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
