"""DigiRL's learner (spec sections 4-6): both critics trained on the buffer, Eq. 4.4's
instruction filter picks trajectories, Eq. 4.3's step filter (or the released grade) picks
their steps, Eq. 4.2's maximum likelihood trains the actor on them. The offline phase does
the same on every success of the pile.

:class:`~digirl_lite.learners.filtered_bc.FilteredBC` and :class:`~digirl_lite.learners.awr.AWR`
are this learner with another choice of trajectories or steps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from digirl_lite import distributed as dist
from digirl_lite import filters
from digirl_lite.learners.base import Learner
from digirl_lite.policy.updates import actor_precision, mle_update

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.data.records import Step, Trajectory

__all__ = ["DigiRL"]

TRAJECTORY_CHOICES = ("top_p", "successes", "all")


class DigiRL(Learner):
    name = "digirl"
    uses_critics = True

    # -- the phases -------------------------------------------------------------------------
    def offline(self, pile: Sequence[Trajectory]) -> dict[str, Any]:
        run, c = self.run, self.cfg
        if self.uses_critics:  # the critics' inputs
            run.text.get(sorted({t.task for t in pile}))
        crit = run._timed("offline_critics", lambda: self.train_critics(
            c.offline_critic_updates))
        steps, weights, kept = run._timed("offline_filter", lambda: self.select_steps(
            pile, "successes"))  # spec: offline, every success
        loss = run._timed("offline_actor", lambda: self.train_actor(
            steps, c.offline_actor_updates, weights))
        return {**crit, **kept, "actor_loss": loss}

    def update(self, collected: Sequence[Trajectory]) -> dict[str, Any]:
        run, c = self.run, self.cfg
        crit = run._timed("critics", lambda: self.train_critics(c.critic_updates))
        steps, weights, kept = run._timed("filter", lambda: self.select_steps(
            run.buffer.trajectories("train"), "top_p" if c.instruction_filter else "all"))
        loss = run._timed("actor", lambda: self.train_actor(steps, c.actor_updates, weights))
        return {**crit, **kept, "actor_loss": loss}

    # -- critics ----------------------------------------------------------------------------
    def train_critics(self, updates: int) -> dict[str, float]:
        """``updates`` cross-entropy updates of both critics on the buffer's training split
        (none where the learner reads no critic)."""
        from digirl_lite.critics.data import buffer_texts, instruction_batch, step_batches
        from digirl_lite.critics.losses import instruction_critic_loss, step_critic_loss

        run, c = self.run, self.cfg
        trajs = run.buffer.trajectories("train")
        if not trajs or updates <= 0 or not self.uses_critics:
            return {}
        s_loss = i_loss = float("nan")
        # the prompts' embeddings: with N processes each encodes 1/N of the new ones
        run.text.warm_shared(buffer_texts(trajs))
        dev = run.accelerator.device  # the critics' (Trainer)
        batches = step_batches(trajs, run.screens, run.text, c.critic_batch, rng=self.rng,
                               drop_last=False, device=dev)
        ib = instruction_batch(trajs, run.text, device=dev)
        run.step_critic.train()
        run.instr_critic.train()
        accum = c.grad_accum  # step-critic minibatches per update (released: 32)
        for _ in run._iter(updates, "critics"):
            run.critic_opt.zero_grad()
            s_loss = 0.0
            for j in range(accum):
                b = next(batches, None)
                if b is None:
                    batches = step_batches(trajs, run.screens, run.text, c.critic_batch,
                                           rng=self.rng, device=dev)
                    b = next(batches)
                loss = step_critic_loss(run.step_critic, b, c.critic_loss) / accum
                s_loss += float(loss.detach())
                if j == accum - 1:  # every task at once: the instruction critic's batch
                    loss_i = instruction_critic_loss(run.instr_critic, ib, c.critic_loss)
                    i_loss = float(loss_i.detach())
                    loss = loss + loss_i
                loss.backward()
            dist.average_gradients(list(run.step_critic.parameters())
                                   + list(run.instr_critic.parameters()))
            run.critic_opt.step()
        return {"step_critic_loss": round(s_loss, 4), "instr_critic_loss": round(i_loss, 4)}

    # -- filters ----------------------------------------------------------------------------
    def select_steps(self, trajs: Sequence[Trajectory], trajectories: str = "top_p"
                     ) -> tuple[list[Step], np.ndarray | None, dict[str, Any]]:
        """The actor's data (spec section 6): steps, their weights, and counts for the log.

        ``trajectories`` picks the trajectories: "top_p" (the online iterations:
        :meth:`keep_trajectories`, Eq. 4.4's top ``top_p`` by instruction advantage),
        "successes" (the offline phase: every success of the pile) or "all" (every usable
        one: the ``instruction_filter=False`` ablation). Their steps:
        :meth:`choose_steps` (DigiRL: those ``step_filter`` keeps, Eq. 4.3, the released
        grade, or all for "none"). Only valid actions are kept. The weights ((N,), None but
        for AWR) go to :meth:`train_actor`.
        """
        if trajectories not in TRAJECTORY_CHOICES:
            raise ValueError(f"trajectories must be 'top_p', 'successes' or 'all', got "
                             f"{trajectories!r}")
        usable = [t for t in trajs if t.is_usable and t.steps]
        if not usable:
            return [], None, {"kept_trajectories": 0, "kept_steps": 0}
        r = np.array([t.final_reward for t in usable])
        if trajectories == "successes":
            keep_t = r > 0
        elif trajectories == "all":
            keep_t = np.ones(len(usable), dtype=bool)
        else:
            keep_t = self.keep_trajectories(usable, r)
        kept = [t for t, k in zip(usable, keep_t) if k]
        if not kept:
            return [], None, {"kept_trajectories": 0, "kept_steps": 0}
        steps, weights, info = self.choose_steps(kept)
        return steps, weights, {"kept_trajectories": len(kept), "kept_steps": len(steps),
                                **info}

    def keep_trajectories(self, usable: Sequence[Trajectory], rewards: np.ndarray
                          ) -> np.ndarray:
        """Eq. 4.4: the top ``top_p`` of ``usable`` by instruction advantage."""
        from digirl_lite.critics.data import instruction_values

        with torch.no_grad():
            v_i = instruction_values(usable, self.run.text, self.run.instr_critic)
        return filters.keep_top_fraction(filters.instruction_advantage(rewards, v_i),
                                         self.cfg.top_p)

    def step_grades(self, kept: Sequence[Trajectory]
                    ) -> list[tuple[Trajectory, np.ndarray, np.ndarray]]:
        """Each kept trajectory with its steps' grades and which ``step_filter`` keeps
        (Eq. 4.3, the released grade, or every step for "none")."""
        from digirl_lite.critics.data import critic_values_many

        c = self.cfg
        with torch.no_grad():
            values = critic_values_many(kept, self.run.screens, self.run.text,
                                        self.run.step_critic)
        out = []
        for t, v in zip(kept, values):
            a, keep = filters.step_grades(v, t.rewards, [s.mc_return for s in t.steps],
                                          t.horizon, c.step_filter, c.lam)
            out.append((t, np.asarray(a), np.asarray(keep, dtype=bool)))
        return out

    def choose_steps(self, kept: Sequence[Trajectory]
                     ) -> tuple[list[Step], np.ndarray | None, dict[str, Any]]:
        """The valid steps of ``kept`` that the step filter keeps (no weights)."""
        steps = [s for t, _, keep in self.step_grades(kept)
                 for s, k in zip(t.steps, keep) if k and s.action.is_valid]
        return steps, None, {}

    # -- the actor --------------------------------------------------------------------------
    def train_actor(self, steps: Sequence[Step], updates: int,
                    weights: np.ndarray | None = None) -> float:
        """``updates`` maximum-likelihood updates on minibatches of ``steps`` drawn
        uniformly; with ``weights`` (AWR) each minibatch's loss is their weighted mean."""
        run, c = self.run, self.cfg
        if not steps or updates <= 0:
            return float("nan")
        loss = float("nan")
        with actor_precision(self.policy, c.actor_precision):
            for _ in run._iter(updates, "actor"):
                idx = self.rng.integers(0, len(steps), c.actor_batch)
                loss = mle_update(self.policy, run.actor_opt, [steps[i] for i in idx],
                                  run.screens, c.actor_grad_clip, run.accelerator,
                                  c.grad_accum, None if weights is None else weights[idx])
        return round(loss, 4)
