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

import hashlib
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
from digirl_lite.train.config import DigiRLConfig
from digirl_lite.train.evaluate import evaluate

__all__ = ["PolicyBatchAgent", "Trainer", "mle_update", "steps_to_batch", "ITERATION_PHASES"]

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


def steps_to_batch(steps: Sequence[Step], screens: ScreenTable):
    """Prompts, (B, d) features of the screen each action was taken on, action strings."""
    return ([s.prompt for s in steps], screens.features([s.screen_id for s in steps]),
            [s.action_text for s in steps])


def mle_update(policy, opt, steps: Sequence[Step], screens: ScreenTable,
               grad_clip: float | None, accelerator=None) -> float:
    """Eq. 4.2: one maximum-likelihood update on ``steps`` (mean over steps); returns the loss.

    With an Accelerate ``accelerator``: its backward (mixed precision), and under
    ``accelerate launch`` with several processes the gradients are averaged across them
    before clipping (each process brings its own steps: data parallel).
    """
    return text_mle_update(policy, opt, *steps_to_batch(steps, screens), grad_clip, accelerator)


def text_mle_update(policy, opt, prompts: Sequence[str], feats, actions: Sequence[str],
                    grad_clip: float | None, accelerator=None) -> float:
    """:func:`mle_update` on prompts, image features and target strings directly."""
    policy.model.train()
    loss = -policy.log_prob(prompts, feats, actions).mean()
    opt.zero_grad()
    if accelerator is None:
        loss.backward()
    else:
        accelerator.backward(loss)
        if accelerator.num_processes > 1:
            for p in policy.model.parameters():
                if p.grad is not None:
                    p.grad = accelerator.reduce(p.grad, reduction="mean")
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), grad_clip)
    opt.step()
    return float(loss.detach())


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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

        from digirl_lite.critics import EmbeddingCache, InstructionCritic, MiniLMEncoder, StepCritic
        from digirl_lite.policy import AutoUIPolicy
        from digirl_lite.vision import FeatureCache

        cfg.check_paths()
        if cfg.env != "sim":
            raise NotImplementedError(
                f"env={cfg.env!r}: the Trainer drives the simulated phone; emulator fleets "
                "plug in through digirl_lite.rollout (issue 7)")
        self.cfg = cfg
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.progress = progress
        self.accelerator = Accelerator(cpu=cfg.device == "cpu")
        self.is_main = self.accelerator.is_main_process
        # under `accelerate launch` every process collects its own trajectories
        self._seed_everything(cfg.seed + 7919 * self.accelerator.process_index)
        self.policy = AutoUIPolicy.sim_preset(seed=cfg.seed).to(self.accelerator.device)
        self.features = FeatureCache(self._image_encoder())
        self.text = EmbeddingCache(MiniLMEncoder())
        d_t, d_i = self.text.encoder.dim, self.policy.img_dim
        self.step_critic = StepCritic(d_t, d_i, hidden=256, init_value=cfg.critic_init_value)
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
        self.summary: dict[str, Any] = {"config": cfg.as_dict(), "stages": {}}
        self.curve: list[tuple[int, float]] = []
        self._fleet = None
        self._tasks = None
        self._test = None
        self._tb = None
        if cfg.tensorboard and self.is_main:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ImportError("tensorboard=True needs the 'tensorboard' extra: "
                                  "pip install 'digirl-lite[tensorboard]'") from e
            self._tb = SummaryWriter(str(self.out / "tensorboard"))

    def _image_encoder(self):
        from digirl_lite.vision import SimScreenEncoder

        if self.cfg.image_encoder == "sim":
            return SimScreenEncoder(dim=self.policy.img_dim, seed=0)
        from digirl_lite.vision import Blip2Features

        return Blip2Features(self.cfg.image_encoder, device=self.accelerator.device)

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
            from digirl_lite.envs.sim import SimEnvFactory
            from digirl_lite.rollout import make_fleet

            kw = {"horizon": self.cfg.horizon} if self.cfg.horizon else {}
            make = SimEnvFactory(judge=self.cfg.judge,
                                 seed=self.cfg.seed + 7919 * self.accelerator.process_index,
                                 tasks=self.cfg.task_file or self.cfg.world, **kw)
            self._fleet = make_fleet(self.cfg.fleet, make, self.cfg.n_envs,
                                     **self.cfg.fleet_options)
        return self._fleet

    def close(self) -> None:
        """Stop the fleet's workers (threads, processes, Ray actors) and TensorBoard."""
        if self._fleet is not None:
            self._fleet.close()
            self._fleet = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def agent(self, screens: ScreenTable | None = None) -> PolicyBatchAgent:
        return PolicyBatchAgent(self.policy, self.features,
                                screens if screens is not None else self.screens,
                                self.cfg.temperature, self.cfg.max_new_tokens)

    def _train_tasks(self):
        """The train task list (loaded once; the fleet's workers load their own)."""
        if self._tasks is None:
            from digirl_lite.envs.sim import SimPhoneEnv

            self._tasks = SimPhoneEnv(self.cfg.task_file or self.cfg.world).tasks
        return self._tasks

    def _test_tasks(self):
        """The held-out task list (loaded once, not at every evaluation)."""
        if self._test is None:
            from digirl_lite.envs.sim import SimPhoneEnv

            self._test = SimPhoneEnv(self.cfg.test_task_file or f"{self.cfg.world}_test").tasks
        return self._test

    def _cache_key(self, *parts: Any) -> str:
        return hashlib.blake2b(json.dumps(parts, sort_keys=True, default=str).encode(),
                               digest_size=6).hexdigest()

    # -- the starting policy (AutoUI role) ---------------------------------------------------
    def sft_key(self) -> str:
        """What the SFT starting policy depends on (a cached or shipped one must match)."""
        from digirl_lite.policy import SIM_PRESET

        c = self.cfg
        return self._cache_key("sft-v3", c.world, c.sft_seed, c.sft_demos, c.sft_updates,
                               c.sft_batch, c.sft_lr, c.sft_surprise_rate,
                               c.sft_varied_products, c.sft_copy_updates, c.sft_copy_share,
                               SIM_PRESET,
                               self.policy.tokenizer.vocab_size)

    def build_starting_policy(self) -> None:
        """The starting policy: ``cfg.starting_policy`` "sft" (SFT on the expert's clean
        demonstrations, cached by config), "shipped" (``data/policies/sft-<world>``, which
        must have been built with this config's SFT settings), or a policy directory."""
        from digirl_lite.paths import data_dir
        from digirl_lite.policy import AutoUIPolicy

        c = self.cfg
        src = c.starting_policy
        if src not in ("sft", "shipped"):
            d = Path(src).expanduser()
            self.policy = (AutoUIPolicy.load(d) if (d / "digirl_policy.json").is_file()
                           else AutoUIPolicy.from_pretrained(d))
            self.log(stage="sft", loaded=str(d))
        else:
            key = self.sft_key()
            cached = (data_dir() / "policies" / f"sft-{c.world}" if src == "shipped"
                      else self.cache_dir / f"sft-{key}" if self.cache_dir else None)
            meta = cached / "sft.json" if cached is not None else None
            if meta is not None and meta.is_file():
                made = json.loads(meta.read_text()).get("key")
                if made != key:
                    raise ValueError(
                        f"{cached} was built with other SFT settings (key {made}, this run "
                        f"{key}); rebuild it with recipes/make_starting_policy.py or set "
                        "starting_policy='sft'")
                self.policy = AutoUIPolicy.load(cached)
                self.log(stage="sft", loaded=str(cached))
            elif src == "shipped":
                raise FileNotFoundError(
                    f"no shipped starting policy at {cached}; build it with "
                    f"python recipes/make_starting_policy.py --world {c.world} (or set "
                    "starting_policy='sft')")
            else:
                self.policy = self.train_sft()
                if cached is not None and self.is_main:
                    self.save_starting_policy(cached)
        self.policy.to(self.accelerator.device)
        self.actor_opt = torch.optim.AdamW(self.policy.model.parameters(), lr=c.actor_lr)

    def save_starting_policy(self, directory: str | Path) -> Path:
        """Save the policy with the SFT key it was built under (``sft.json``)."""
        d = self.policy.save(directory)
        _atomic_write_text(d / "sft.json", json.dumps({
            "key": self.sft_key(), "world": self.cfg.world, "sft_seed": self.cfg.sft_seed,
            "sft_demos": self.cfg.sft_demos, "sft_updates": self.cfg.sft_updates,
            "sft_batch": self.cfg.sft_batch, "sft_lr": self.cfg.sft_lr,
            "sft_surprise_rate": self.cfg.sft_surprise_rate,
            "sft_varied_products": self.cfg.sft_varied_products,
            "sft_copy_updates": self.cfg.sft_copy_updates,
            "sft_copy_share": self.cfg.sft_copy_share}, indent=1))
        return d

    def train_sft(self):
        """The starting policy from fresh preset weights: ``sft_copy_updates`` copy drills
        (:func:`~digirl_lite.envs.sim.pile.copy_drills`: the copying a pre-trained T5
        brings), then supervised fine-tuning on the expert's demonstrations, with a share
        ``sft_copy_share`` of drills in every batch."""
        from digirl_lite.envs.sim.pile import copy_drills, generate_demos
        from digirl_lite.policy import AutoUIPolicy

        c = self.cfg
        demos, dscreens, _ = generate_demos(c.world, n=c.sft_demos, seed=c.sft_seed,
                                            surprise_rate=c.sft_surprise_rate,
                                            varied_products=c.sft_varied_products)
        self.features.fill(dscreens)
        steps = [s for t in demos for s in t.steps]
        policy = AutoUIPolicy.sim_preset(seed=c.sft_seed).to(self.accelerator.device)
        opt = torch.optim.AdamW(policy.model.parameters(), lr=c.sft_lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min(1.0, (u + 1) / 50))
        rng = np.random.default_rng([c.sft_seed, self.accelerator.process_index])
        drills = copy_drills(seed=c.sft_seed * 1009 + self.accelerator.process_index)
        no_image = np.zeros((c.sft_batch, policy.img_dim), dtype=np.float32)
        n_drill = int(round(c.sft_copy_share * c.sft_batch))
        t0 = time.perf_counter()
        total = c.sft_copy_updates + c.sft_updates
        with self._bar(total, "sft") as bar:
            for u in range(total):
                k = c.sft_batch if u < c.sft_copy_updates else n_drill
                drill = [next(drills) for _ in range(k)]
                prompts, actions = [p for p, _ in drill], [a for _, a in drill]
                feats = no_image[:k]
                if k < c.sft_batch:
                    batch = [steps[i] for i in rng.integers(0, len(steps), c.sft_batch - k)]
                    bp, bf, ba = steps_to_batch(batch, dscreens)
                    prompts, actions = prompts + bp, actions + ba
                    feats = np.concatenate([feats, np.asarray(bf, dtype=np.float32)])
                loss = text_mle_update(policy, opt, prompts, feats, actions, 1.0,
                                       self.accelerator)
                sched.step()
                bar.update()
                if u % 100 == 0 or u == total - 1:
                    self.log(stage="sft", update=u, loss=round(loss, 4),
                             phase="copy" if u < c.sft_copy_updates else "demos")
        self.timings["sft"] = time.perf_counter() - t0
        return policy

    # -- the stored pile ------------------------------------------------------------------
    def build_pile(self) -> list[Trajectory]:
        """The starting policy's own attempts on train tasks, scored by the judge (cached)."""
        from digirl_lite.data.store import load_trajectories

        c = self.cfg
        policy_id = (self.sft_key() if c.starting_policy in ("sft", "shipped")
                     else str(Path(c.starting_policy).expanduser().resolve()))
        key = self._cache_key("pile-v2", c.world, c.seed, c.pile_size, c.judge, c.temperature,
                              c.max_new_tokens, c.horizon, c.task_file, policy_id)
        cached = self.cache_dir / f"pile-{key}" if self.cache_dir else None
        if cached is not None and (cached / "digirl_store.json").is_file():
            trajs, screens = load_trajectories(cached)
            self.screens.merge(screens)
            self.log(stage="pile", cached=str(cached), trajectories=len(trajs))
            return trajs
        tasks = self._train_tasks()
        idx = np.random.default_rng(c.seed + 1).integers(0, len(tasks), c.pile_size)
        episodes = self._timed("pile", lambda: self.fleet().collect(
            self.agent(), [tasks[i] for i in idx], self.screens, id_prefix=f"pile-s{c.seed}",
            source=Source.OFFLINE, iteration=-1, seed=c.seed * 1_000_003 + 7))
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
        for _ in self._iter(updates, "critics"):
            b = next(batches, None)
            if b is None:
                batches = step_batches(trajs, self.screens, self.text, self.cfg.critic_batch,
                                       rng=self.rng)
                b = next(batches)
            loss = step_critic_loss(self.step_critic, b, self.cfg.critic_loss)
            loss_i = instruction_critic_loss(self.instr_critic, ib, self.cfg.critic_loss)
            self.critic_opt.zero_grad()
            (loss + loss_i).backward()
            self.critic_opt.step()
            s_loss, i_loss = float(loss.detach()), float(loss_i.detach())
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
                              self.screens, self.cfg.actor_grad_clip, self.accelerator)
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
            episodes = self._timed("collect", lambda: self.fleet().collect(
                agent, [tasks[i] for i in idx], self.screens,
                id_prefix=f"online-s{c.seed}-it{k:04d}", source=Source.ONLINE, iteration=k,
                seed=c.seed * 1_000_003 + 100_000 * k))
            collected = [e.trajectory for e in episodes]
            self.timings["inference"] = self.timings.get("inference", 0.0) + agent.seconds
            self.features.fill(self.screens)
            self._timed("store", lambda: self._store_append(collected))
        self.buffer.add(collected)
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
            self.fleet(), self.agent(screens), self._test_tasks(),
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
                 failure_kinds=report["failure_kinds"])
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
        _atomic_write_text(root / "latest", name)
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
        })
        self.save_checkpoint()
        if self.is_main:
            _atomic_write_text(self.out / "summary.json", json.dumps(self.summary, indent=1,
                                                                     default=float))
            self.plot()
        self.close()
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
        ax.set_title(f"{self.cfg.algorithm} on simulated {self.cfg.world}, seed {self.cfg.seed}")
        ax.grid(alpha=0.3)
        path = self.out / "learning_curve.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        return path
