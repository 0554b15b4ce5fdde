"""DigiRL's loop (spec/DIGIRL.md section 7), top-down: starting policy, pile, offline phase,
online iterations, evaluation, checkpoints.

    trainer = Trainer(sim_webshop(), out_dir="runs/webshop")
    trainer.run()

Offline: instruction critic, step critic, then the actor on the pile's successful
trajectories. Online, each iteration: collect K trajectories at temperature 1.0; add them to
the buffer; train both critics on the raw buffer; keep the top 10% of trajectories by
Eq. 4.4; keep their steps with Eq. 4.3 > 1/H; MLE updates of the actor on the kept steps.
Filtered BC replaces the two filters by "successful trajectories, every step".
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from digirl_lite import filters
from digirl_lite.data.records import ScreenTable, Source, Step, Trajectory, screen_id_of_image
from digirl_lite.data.replay import ReplayBuffer
from digirl_lite.data.store import TrajectoryStore
from digirl_lite.envs.base import Observation
from digirl_lite.errors import ConfigError
from digirl_lite.paths import atomic_write_text, content_key
from digirl_lite.policy.updates import mle_update, steps_to_batch, text_mle_update
from digirl_lite.rollout.fleet import JudgeUnavailable
from digirl_lite.train.config import DigiRLConfig
from digirl_lite.train.evaluate import evaluate

__all__ = ["PolicyBatchAgent", "Trainer", "RunStopped", "mle_update", "steps_to_batch",
           "text_mle_update", "ITERATION_PHASES"]

ITERATION_PHASES = ("collect", "inference", "store", "critics", "filter", "actor", "checkpoint")
"""Where an online iteration's time goes (``time_split`` in metrics.jsonl): ``collect`` is
the fleet's wall time, of which ``inference`` is the policy's (features + sampling) and
``environments`` the rest."""


class PolicyBatchAgent:
    """The policy behind the fleet's batch interface: features by screen content (cached),
    one sampling call for every phone of the batch."""

    def __init__(self, policy, features, screens: ScreenTable, temperature: float = 1.0,
                 max_new_tokens: int = 64) -> None:
        self.policy, self.features, self.screens = policy, features, screens
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.seconds = 0.0  # time spent in act_batch (features + sampling): "inference"
        self.calls = 0

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
        ids = [o.screen_id or screen_id_of_image(o.screenshot) for o in observations]
        feats = self.features_of(ids)
        out = self.policy.act([o.prompt for o in observations], feats,
                              temperature=self.temperature, max_new_tokens=self.max_new_tokens)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out


class RunStopped(RuntimeError):
    """The run stopped on purpose (its judge could not answer): what was collected is stored
    and, from the online phase on, a checkpoint saved; ``--resume`` goes on from there once
    the cause is fixed."""


class _StageFleet:
    """The Trainer's fleet as :func:`evaluate` sees it: ``collect`` through
    :meth:`Trainer._collect`, so evaluations count and stop on unjudged steps too."""

    def __init__(self, trainer: Trainer, stage: str) -> None:
        self.trainer, self.stage = trainer, stage

    def collect(self, agent, tasks, screens, **kw):
        return self.trainer._collect(self.stage, agent, tasks, screens, **kw)


class Trainer:
    """One run: owns the policy, the critics, their optimisers, the buffer, the store.

    Args:
        cfg: the run's configuration.
        out_dir: holds ``metrics.jsonl``, ``summary.json``, ``learning_curve.png``,
            ``store/`` (every trajectory collected) and ``checkpoints/``.
        cache_dir: where the starting policy and the pile are kept across runs (they are
            deterministic in the config); None disables caching.
        progress: print progress lines (one per phase and iteration).
    """

    def __init__(self, cfg: DigiRLConfig, out_dir: str | Path,
                 cache_dir: str | Path | None = "runs/cache", progress: bool = True) -> None:
        from accelerate import Accelerator

        from digirl_lite.critics import EmbeddingCache, InstructionCritic, StepCritic
        from digirl_lite.envs.setup import make_phones
        from digirl_lite.vision import FeatureCache

        cfg.check_paths()  # every field that cannot work, before anything is built
        self.cfg = cfg
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.progress = progress
        self.accelerator = Accelerator(cpu=cfg.device == "cpu")
        self.is_main = self.accelerator.is_main_process
        # under `accelerate launch` every process collects its own trajectories
        self._seed_everything(cfg.seed + 7919 * self.accelerator.process_index)
        # every size follows the policy: image features, screen tables, the step critic
        self.policy = self._initial_policy().to(self.accelerator.device)
        encoder = self._image_encoder()
        if int(encoder.dim) != self.policy.img_dim:
            raise ConfigError(
                f"image_encoder {cfg.image_encoder!r} gives {encoder.dim}-d features but the "
                f"policy (starting_policy {cfg.starting_policy!r}) reads "
                f"{self.policy.img_dim}-d image features: use the encoder the policy was "
                "trained with")
        self.features = FeatureCache(encoder)
        self.text = EmbeddingCache(self._text_encoder())
        d_t, d_i = self.text.encoder.dim, self.policy.img_dim
        self.step_critic = StepCritic(d_t, d_i, hidden=cfg.critic_hidden,
                                      init_value=cfg.critic_init_value)
        self.instr_critic = InstructionCritic(d_t, init_value=cfg.critic_init_value)
        self.critic_opt = torch.optim.Adam(
            list(self.step_critic.parameters()) + list(self.instr_critic.parameters()),
            lr=cfg.critic_lr)
        self.actor_opt = torch.optim.AdamW(self.policy.model.parameters(), lr=cfg.actor_lr)
        self.buffer = ReplayBuffer(cfg.capacity, seed=cfg.seed)
        self.screens = ScreenTable(self.policy.img_dim)
        self.rng = np.random.default_rng(cfg.seed)
        self.iteration = 0  # online iterations done
        self.online_trajectories = 0
        self.timings: dict[str, float] = {}
        self.summary: dict[str, Any] = {"config": cfg.as_dict(), "stages": {},
                                        "unjudged_steps": {}}
        self.curve: list[tuple[int, float]] = []
        self._fleet = None
        self._tb = None
        # the phones last: devices are reached (emulators started) only once the rest holds
        self.phones = make_phones(cfg, seed=cfg.seed + 7919 * self.accelerator.process_index)
        if self.phones.n != cfg.n_envs:
            print(f"[digirl_lite] {self.phones.n} devices in android "
                  f"({'devices' if 'devices' in cfg.android else 'emulators'}): the fleet has "
                  f"{self.phones.n} phones (n_envs={cfg.n_envs} applies to the simulator)",
                  flush=True)
        if cfg.tensorboard and self.is_main:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ImportError("tensorboard=True needs the 'tensorboard' extra: "
                                  "pip install 'digirl-lite[tensorboard]'") from e
            self._tb = SummaryWriter(str(self.out / "tensorboard"))

    def _initial_policy(self):
        """A policy directory (a saved AutoUIPolicy or a real Auto-UI checkpoint) is loaded
        here; for "sft" / "shipped" this is the simulator preset's shape, replaced by the
        trained or shipped weights in :meth:`build_starting_policy`."""
        from digirl_lite.policy import AutoUIPolicy

        src = self.cfg.starting_policy
        if src in ("sft", "shipped"):
            return AutoUIPolicy.sim_preset(seed=self.cfg.seed)
        d = Path(src).expanduser()
        try:
            return (AutoUIPolicy.load(d) if (d / "digirl_policy.json").is_file()
                    else AutoUIPolicy.from_pretrained(d))
        except (OSError, ValueError) as e:
            raise ConfigError(f"starting_policy {str(d)!r}: {e}") from None

    def _image_encoder(self):
        from digirl_lite.vision import SimScreenEncoder

        if self.cfg.image_encoder == "sim":
            return SimScreenEncoder(dim=self.policy.img_dim, seed=0)
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

    def _iter(self, n: int, desc: str):
        """``range(n)`` with a progress bar when the phase is long enough to watch."""
        if n < 20:
            yield from range(n)
            return
        with self._bar(n, desc) as bar:
            for i in range(n):
                yield i
                bar.update()

    def _bar(self, total: int, desc: str):
        """A progress bar for one phase (tqdm), silent without ``progress``."""
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True,
                    disable=not (self.progress and self.is_main))

    # -- plumbing -----------------------------------------------------------------------
    @staticmethod
    def _seed_everything(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    def log(self, **record: Any) -> None:
        if not self.is_main:
            return
        record = {"time": round(time.time(), 3), **record}
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

    def _timed(self, name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        out = fn()
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0
        return out

    def fleet(self):
        if self._fleet is None:
            from digirl_lite.rollout import make_fleet

            opts = {"max_unjudged_steps": self.cfg.max_unjudged_steps,
                    **self.cfg.fleet_options}
            self._fleet = make_fleet(self.cfg.fleet, self.phones.make_env, self.phones.n,
                                     **opts)
        return self._fleet

    def close(self) -> None:
        """Stop the fleet's workers (threads, processes, Ray actors), the emulators this run
        started, and TensorBoard."""
        if self._fleet is not None:
            self._fleet.close()
            self._fleet = None
        self.phones.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def agent(self, screens: ScreenTable | None = None) -> PolicyBatchAgent:
        return PolicyBatchAgent(self.policy, self.features,
                                screens if screens is not None else self.screens,
                                self.cfg.temperature, self.cfg.max_new_tokens)

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
        if c.starting_policy in ("sft", "shipped"):
            from digirl_lite.train.starting import starting_policy

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
        self.actor_opt = torch.optim.AdamW(self.policy.model.parameters(), lr=c.actor_lr)

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
    def build_pile(self) -> list[Trajectory]:
        """The starting policy's own attempts on train tasks, scored by the judge (cached)."""
        from digirl_lite.data.store import load_trajectories

        c = self.cfg
        policy_id = (self.sft_key() if c.starting_policy in ("sft", "shipped")
                     else str(Path(c.starting_policy).expanduser().resolve()))
        devices = () if c.env == "sim" else (c.env, c.android)  # sim keys as before
        key = self._cache_key("pile-v2", c.world, c.seed, c.pile_size, c.judge, c.temperature,
                              c.max_new_tokens, c.horizon, c.task_file, policy_id, *devices)
        cached = self.cache_dir / f"pile-{key}" if self.cache_dir else None
        if cached is not None and (cached / "digirl_store.json").is_file():
            trajs, screens = load_trajectories(cached)
            self.screens.merge(screens)
            self.log(stage="pile", cached=str(cached), trajectories=len(trajs))
            return trajs
        tasks = self._train_tasks()
        idx = np.random.default_rng(c.seed + 1).integers(0, len(tasks), c.pile_size)
        episodes = self._timed("pile", lambda: self._collect(
            "pile", self.agent(), [tasks[i] for i in idx], self.screens,
            id_prefix=f"pile-s{c.seed}", source=Source.OFFLINE, iteration=-1,
            seed=c.seed * 1_000_003 + 7))
        self.features.fill(self.screens)
        trajs = [e.trajectory for e in episodes]
        if cached is not None:
            sub = ScreenTable(self.screens.feature_dim)
            for t in trajs:
                for s in t.steps:
                    for sid in (s.screen_id, s.next_screen_id):
                        if sid not in sub:
                            i = self.screens.index_of([sid])[0]
                            sub.add(self.screens.image(sid), self.screens.matrix()[i],
                                    screen_id=sid)
            TrajectoryStore.create(cached, sub.feature_dim).append(trajs, sub)
        self.log(stage="pile", trajectories=len(trajs),
                 success_rate=round(float(np.mean([t.is_success for t in trajs])), 4))
        return trajs

    def _collect(self, stage: str, agent: PolicyBatchAgent, tasks: Sequence[Any],
                 screens: ScreenTable, **kw: Any):
        """``fleet.collect`` for ``stage``, counting unjudged steps. When the judge cannot
        answer (``max_unjudged_steps`` in a row), what had finished is stored (the run's
        store, or the evaluation's), a checkpoint is saved from the online phase on, and
        :class:`RunStopped` says why."""
        try:
            episodes = self.fleet().collect(agent, tasks, screens, **kw)
        except JudgeUnavailable as e:
            got = [ep.trajectory for ep in e.episodes]
            self.features.fill(screens)
            where = self.out / "store"
            if stage.startswith("eval"):
                where = self.out / "eval" / stage.removeprefix("eval:")
                if self.is_main and got:
                    TrajectoryStore.create(where, screens.feature_dim, exist_ok=True).append(
                        got, screens)
            elif got:
                self._store_append(got)
            saved = ""
            if stage.startswith("online"):
                saved = f"; checkpoint {self.save_checkpoint()}"
            self.log(stage="stopped", during=stage, unjudged_in_a_row=e.n, reason=e.reason,
                     kept_trajectories=len(got))
            raise RunStopped(
                f"stopped during {stage}: {e} (the judge's config: {self.cfg.judge}). "
                f"{len(got)} finished trajectories were stored in {where}{saved}; fix the judge "
                "and resume") from e
        steps = sum(len(ep.trajectory) for ep in episodes)
        unjudged = sum(ep.trajectory.num_unjudged for ep in episodes)
        name = "online" if stage.startswith("online") else stage
        tally = self.summary.setdefault("unjudged_steps", {})
        u, n = tally.get(name, (0, 0))
        tally[name] = [u + unjudged, n + steps]
        return episodes

    # -- critics --------------------------------------------------------------------------
    def train_critics(self, updates: int) -> dict[str, float]:
        from digirl_lite.critics.data import instruction_batch, step_batches
        from digirl_lite.critics.losses import instruction_critic_loss, step_critic_loss

        trajs = self.buffer.trajectories("train")
        if not trajs or updates <= 0:
            return {}
        s_loss = i_loss = float("nan")
        batches = step_batches(trajs, self.screens, self.text, self.cfg.critic_batch,
                               rng=self.rng, drop_last=False)
        ib = instruction_batch(trajs, self.text)
        self.step_critic.train()
        self.instr_critic.train()
        accum = self.cfg.grad_accum  # step-critic minibatches per update (released: 32)
        for _ in self._iter(updates, "critics"):
            self.critic_opt.zero_grad()
            s_loss = 0.0
            for j in range(accum):
                b = next(batches, None)
                if b is None:
                    batches = step_batches(trajs, self.screens, self.text,
                                           self.cfg.critic_batch, rng=self.rng)
                    b = next(batches)
                loss = step_critic_loss(self.step_critic, b, self.cfg.critic_loss) / accum
                s_loss += float(loss.detach())
                if j == accum - 1:  # every task at once: the instruction critic's batch
                    loss_i = instruction_critic_loss(self.instr_critic, ib, self.cfg.critic_loss)
                    i_loss = float(loss_i.detach())
                    loss = loss + loss_i
                loss.backward()
            self.critic_opt.step()
        return {"step_critic_loss": round(s_loss, 4), "instr_critic_loss": round(i_loss, 4)}

    # -- filters --------------------------------------------------------------------------
    def select_steps(self, trajs: Sequence[Trajectory], instruction_filter: bool
                     ) -> tuple[list[Step], dict[str, Any]]:
        """The actor's data: Filtered BC (successes, every step) or DigiRL (Eq. 4.4 over
        ``trajs`` when ``instruction_filter``, then Eq. 4.3 per step)."""
        from digirl_lite.critics.data import critic_values_many, instruction_values

        c = self.cfg
        usable = [t for t in trajs if t.is_usable and t.steps]
        if not usable:
            return [], {"kept_trajectories": 0, "kept_steps": 0}
        r = np.array([t.final_reward for t in usable])
        if c.algorithm == "filtered_bc":
            keep_t = filters.filtered_bc_keep(r, p=c.top_p) if instruction_filter else r > 0
            kept = [t for t, k in zip(usable, keep_t) if k]
            steps = [s for t in kept for s in t.steps if s.action.is_valid]
            return steps, {"kept_trajectories": len(kept), "kept_steps": len(steps)}
        if instruction_filter:
            with torch.no_grad():
                v_i = instruction_values(usable, self.text, self.instr_critic)
            a_i = filters.instruction_advantage(r, v_i)
            kept = [t for t, k in zip(usable, filters.keep_top_fraction(a_i, c.top_p)) if k]
        else:
            kept = [t for t in usable if t.is_success]
        steps: list[Step] = []
        if kept:
            with torch.no_grad():
                values = critic_values_many(kept, self.screens, self.text, self.step_critic)
            for t, v in zip(kept, values):
                _, keep = filters.step_grades(v, t.rewards, [s.mc_return for s in t.steps],
                                              t.horizon, c.step_filter, c.lam)
                steps += [s for s, k in zip(t.steps, keep) if k and s.action.is_valid]
        return steps, {"kept_trajectories": len(kept), "kept_steps": len(steps)}

    def train_actor(self, steps: Sequence[Step], updates: int) -> float:
        if not steps or updates <= 0:
            return float("nan")
        loss = float("nan")
        for _ in self._iter(updates, "actor"):
            idx = self.rng.integers(0, len(steps), self.cfg.actor_batch)
            loss = mle_update(self.policy, self.actor_opt, [steps[i] for i in idx],
                              self.screens, self.cfg.actor_grad_clip, self.accelerator,
                              self.cfg.grad_accum)
        return round(loss, 4)

    # -- stages ---------------------------------------------------------------------------
    def offline(self, pile: Sequence[Trajectory]) -> None:
        c = self.cfg
        self.buffer.add(pile)
        self.text.get(sorted({t.task for t in pile}))
        crit = self._timed("offline_critics", lambda: self.train_critics(
            c.offline_critic_updates))
        steps, kept = self._timed("offline_filter", lambda: self.select_steps(
            self.buffer.trajectories("train"), instruction_filter=False))
        loss = self._timed("offline_actor", lambda: self.train_actor(
            steps, c.offline_actor_updates))
        self.log(stage="offline", **crit, **kept, actor_loss=loss)

    def _bound_memory(self) -> dict[str, int]:
        """Memory bounded by the buffer (issue 15): drop the screens no buffered trajectory
        uses (they are in the store) and trim the feature / text caches to what the buffer
        needs plus a few recently used entries (:mod:`digirl_lite.train.memory`)."""
        from digirl_lite.train.memory import bound_to_buffer

        return bound_to_buffer(self.buffer, self.screens, self.features, self.text)

    def online_iteration(self, k: int, collected: list[Trajectory] | None = None) -> None:
        """Iteration ``k`` (1-based). ``collected``: trajectories already collected and
        stored for it before a crash (resume), so they are not collected again."""
        c = self.cfg
        t_iter = time.perf_counter()
        before = dict(self.timings)
        if collected is None:
            tasks = self._train_tasks()
            idx = self.rng.integers(0, len(tasks), c.rollouts_per_iteration)
            self.fleet().policy_version = k - 1  # the weights after k - 1 iterations
            agent = self.agent()
            episodes = self._timed("collect", lambda: self._collect(
                f"online iteration {k}", agent, [tasks[i] for i in idx], self.screens,
                id_prefix=f"online-s{c.seed}-it{k:04d}", source=Source.ONLINE, iteration=k,
                seed=c.seed * 1_000_003 + 100_000 * k))
            collected = [e.trajectory for e in episodes]
            self.timings["inference"] = self.timings.get("inference", 0.0) + agent.seconds
            self.features.fill(self.screens)
            self._timed("store", lambda: self._store_append(collected))
        self.buffer.add(collected)
        self._bound_memory()
        self.online_trajectories += len(collected)
        crit = self._timed("critics", lambda: self.train_critics(c.critic_updates))
        steps, kept = self._timed("filter", lambda: self.select_steps(
            self.buffer.trajectories("train"), instruction_filter=True))
        loss = self._timed("actor", lambda: self.train_actor(steps, c.actor_updates))
        self.iteration = k
        self._timed("checkpoint", self.save_checkpoint)
        wins = float(np.mean([t.is_success for t in collected])) if collected else 0.0
        split = {name: round(self.timings.get(name, 0.0) - before.get(name, 0.0), 3)
                 for name in ITERATION_PHASES}
        split["environments"] = round(split["collect"] - split["inference"], 3)
        self.log(stage="online", iteration=k, online_trajectories=self.online_trajectories,
                 collect_success=round(wins, 4), **crit, **kept, actor_loss=loss,
                 seconds=round(time.perf_counter() - t_iter, 2), time_split=split)

    def evaluate(self, stage: str) -> dict[str, Any]:
        screens = ScreenTable(self.policy.img_dim)
        report, episodes = self._timed("evaluate", lambda: evaluate(
            _StageFleet(self, f"eval:{stage}"), self.agent(screens), self._test_tasks(),
            n_tasks=self.cfg.eval_tasks, seed=10_000 + self.cfg.seed,
            id_prefix=f"eval-{stage}", screens=screens))
        if self.is_main:  # every evaluation trajectory, for replay and the report
            self.features.fill(screens)
            ev = self.out / "eval" / stage
            if ev.exists():
                shutil.rmtree(ev)  # an evaluation interrupted by a crash, now redone
            TrajectoryStore.create(ev, screens.feature_dim).append(
                [e.trajectory for e in episodes], screens)
        self.summary["stages"][stage] = report
        self.curve.append((self.online_trajectories, report["success_rate"]))
        self.log(stage=f"eval:{stage}", online_trajectories=self.online_trajectories,
                 success_rate=round(report["success_rate"], 4),
                 ci95=[round(x, 3) for x in report["ci95"]],
                 mean_length=round(report["mean_length"], 2),
                 unjudged=report["unjudged"], failure_kinds=report["failure_kinds"])
        return report

    # -- persistence ----------------------------------------------------------------------
    def _store(self) -> TrajectoryStore:
        return TrajectoryStore.create(self.out / "store", self.policy.img_dim, exist_ok=True)

    def _store_append(self, trajs: Sequence[Trajectory]) -> None:
        if self.is_main:
            self._store().append(list(trajs), self.screens)

    def save_checkpoint(self) -> Path:
        """Atomically: policy, critics, optimisers, buffer ids, RNG states, counters.
        (Under ``accelerate launch`` the main process writes; the policies are equal.)"""
        root = self.out / "checkpoints"
        if not self.is_main:
            return root / f"iter-{self.iteration:04d}"
        root.mkdir(exist_ok=True)
        name = f"iter-{self.iteration:04d}"
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-{name}-"))
        self.policy.save(tmp / "policy")
        torch.save({"step_critic": self.step_critic.state_dict(),
                    "instr_critic": self.instr_critic.state_dict(),
                    "critic_opt": self.critic_opt.state_dict(),
                    "actor_opt": self.actor_opt.state_dict(),
                    "torch_rng": torch.get_rng_state()}, tmp / "state.pt")
        state = {"iteration": self.iteration, "online_trajectories": self.online_trajectories,
                 "buffer": self.buffer.state_dict(), "rng": self.rng.bit_generator.state,
                 "curve": self.curve, "summary": self.summary, "timings": self.timings}
        (tmp / "state.json").write_text(json.dumps(state, default=float))
        final = root / name
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        atomic_write_text(root / "latest", name)
        for old in sorted(p for p in root.glob("iter-*") if p.name != name)[:-1]:
            shutil.rmtree(old, ignore_errors=True)  # keep the newest two
        return final

    def load_checkpoint(self) -> bool:
        """Restore the newest checkpoint; False when there is none."""
        from digirl_lite.data.store import load_trajectories
        from digirl_lite.policy import AutoUIPolicy

        latest = self.out / "checkpoints" / "latest"
        if not latest.is_file():
            return False
        d = self.out / "checkpoints" / latest.read_text().strip()
        state = json.loads((d / "state.json").read_text())
        self.policy = AutoUIPolicy.load(d / "policy")
        tensors = torch.load(d / "state.pt", map_location="cpu", weights_only=True)
        self.step_critic.load_state_dict(tensors["step_critic"])
        self.instr_critic.load_state_dict(tensors["instr_critic"])
        self.critic_opt.load_state_dict(tensors["critic_opt"])
        self.actor_opt = torch.optim.AdamW(self.policy.model.parameters(), lr=self.cfg.actor_lr)
        self.actor_opt.load_state_dict(tensors["actor_opt"])
        torch.set_rng_state(tensors["torch_rng"])
        trajs, screens = load_trajectories(self.out / "store")
        self.screens.merge(screens)
        self.buffer = ReplayBuffer.from_state_dict(state["buffer"], trajs)
        self.rng.bit_generator.state = state["rng"]
        self.iteration = state["iteration"]
        self.online_trajectories = state["online_trajectories"]
        self.curve = [tuple(x) for x in state["curve"]]
        self.summary = state["summary"]
        self.timings = state["timings"]
        self._stored = trajs
        return True

    # -- the whole run --------------------------------------------------------------------
    def run(self, resume: bool = False, offline: bool = True,
            online: bool = True) -> dict[str, Any]:
        """The whole run: starting policy (evaluated as "copier"), then the offline phase on
        the pile (evaluated as "offline") unless ``offline=False``, then ``cfg.iterations``
        online iterations (evaluated as "online") unless ``online=False``. ``resume``
        continues the run in ``out_dir`` from its newest checkpoint."""
        try:
            return self._run(resume, offline, online)
        finally:  # a stopped or crashed run still ends its workers and emulators
            self.close()

    def _run(self, resume: bool, offline: bool, online: bool) -> dict[str, Any]:
        t0 = time.perf_counter()
        c = self.cfg
        iterations = c.iterations if online else 0
        if resume and self.load_checkpoint():
            self.log(stage="resume", iteration=self.iteration)
            pending = [t for t in self._stored if t.iteration == self.iteration + 1]
        else:
            if (self.out / "checkpoints" / "latest").is_file():
                raise FileExistsError(f"{self.out} holds a run; pass resume=True or another "
                                      "output folder")
            self.build_starting_policy()
            self.evaluate("copier")
            if offline:
                pile = self.build_pile()
                self._store_append(pile)
                self.offline(pile)
                self.evaluate("offline")
            self.iteration = 0
            self.save_checkpoint()
            pending = []
        bar = self._bar(iterations, "online iterations")
        bar.update(self.iteration)
        while self.iteration < iterations:
            k = self.iteration + 1
            self.online_iteration(k, collected=pending or None)
            bar.update()
            pending = []
            if c.eval_every and k % c.eval_every == 0 and k < iterations:
                self.evaluate(f"online-{k}")
                self.save_checkpoint()
        bar.close()
        if online and "online" not in self.summary["stages"]:
            self.evaluate("online")
        self.summary.update({
            "wall_s": round(time.perf_counter() - t0, 1) + self.summary.get("wall_s", 0.0),
            "online_trajectories": self.online_trajectories,
            "buffer": self.buffer.counts(),
            "timings_s": {k: round(v, 2) for k, v in self.timings.items()},
            "feature_cache_hit_rate": round(self.features.hit_rate, 3),
            # per stage: unjudged steps / steps collected (the judge's reliability)
            "unjudged_step_rate": {k: round(u / n, 4) if n else 0.0
                                   for k, (u, n) in self.summary.get("unjudged_steps",
                                                                     {}).items()},
        })
        self.save_checkpoint()
        if self.is_main:
            atomic_write_text(self.out / "summary.json", json.dumps(self.summary, indent=1,
                                                                     default=float))
            self.plot()
        return self.summary

    def plot(self) -> Path | None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:  # pragma: no cover - a core dependency
            return None
        xs = [x for x, _ in self.curve]
        ys = [y for _, y in self.curve]
        fig, ax = plt.subplots(figsize=(6, 4))
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
        plt.close(fig)
        return path
