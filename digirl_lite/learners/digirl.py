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

from digirl_lite import filters
from digirl_lite.learners import register
from digirl_lite.learners.base import CRITICS, Learner

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.data.records import Step, Trajectory

__all__ = ["DigiRL"]

TRAJECTORY_CHOICES = ("top_p", "successes", "all")


@register("digirl")
class DigiRL(Learner):
    reads = ("instruction_filter", "step_filter", "critic_loss")
    critics = CRITICS

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.step_filter not in filters.STEP_FILTERS:
            raise ValueError(f"step_filter must be one of {filters.STEP_FILTERS}, "
                             f"got {cfg.step_filter!r}")
        if cfg.critic_loss not in ("ce", "mse"):
            raise ValueError(f"critic_loss must be 'ce' or 'mse', got {cfg.critic_loss!r}")

    # -- the keep rules (also the viewer's: digirl_lite.viz.grades) -------------------------
    @classmethod
    def trajectory_keep(cls, rewards: np.ndarray, instr_advantages: np.ndarray,
                        top_p: float) -> np.ndarray:
        """Which of the usable trajectories (final rewards and Eq. 4.4's advantages, (N,))
        the online filter keeps: Eq. 4.4's top ``top_p`` by instruction advantage."""
        return filters.keep_top_fraction(instr_advantages, top_p)

    @classmethod
    def step_keep(cls, step_ok: np.ndarray) -> np.ndarray:
        """Which steps of a kept trajectory are trained on (before the validity of their
        actions), given what ``step_filter`` keeps ((T,) bool): those."""
        return np.asarray(step_ok, dtype=bool)

    @classmethod
    def keep_rule(cls, grader: Any) -> str:
        """The keep rules in words (HTML), with ``grader``'s settings."""
        return (f"DigiRL: a trajectory is kept when its A<sub>instr</sub> is in the top "
                f"{grader.top_p:.0%} of its stage's trajectories (Eq. 4.4); a step of a kept "
                + ("trajectory when A &gt; 1/H (Eq. 4.3, &lambda; = "
                   f"{grader.lam:g})" if grader.step_filter == "paper"
                   else "trajectory when the released code's grade &gt; 0"))

    @classmethod
    def grades_note(cls, grader: Any, checkpoint: str) -> str:
        return (f"Grades from checkpoint {checkpoint}: "
                "V = the step critic's value of the state the action was taken in, A = the "
                f"step grade. {cls.keep_rule(grader)}. Evaluation episodes are never trained "
                "on: kept says what the filters would do with them.")

    # -- the phases -------------------------------------------------------------------------
    def offline(self, pile: Sequence[Trajectory]) -> dict[str, Any]:
        run, c = self.run, self.cfg
        if self.critics:  # the critics' inputs
            run.text.get(sorted({t.task for t in pile}))
        crit = run.timed("offline_critics", lambda: self.train_critics(
            c.offline_critic_updates))
        steps, weights, kept = run.timed("offline_filter", lambda: self.select_steps(
            pile, "successes"))  # spec: offline, every success
        loss = run.timed("offline_actor", lambda: self.train_actor(
            steps, c.offline_actor_updates, weights))
        return {**crit, **kept, "actor_loss": loss}

    def update(self, collected: Sequence[Trajectory]) -> dict[str, Any]:
        run, c = self.run, self.cfg
        crit = run.timed("critics", lambda: self.train_critics(c.critic_updates))
        steps, weights, kept = run.timed("filter", lambda: self.select_steps(
            run.buffer.trajectories("train"), "top_p" if c.instruction_filter else "all"))
        loss = run.timed("actor", lambda: self.train_actor(steps, c.actor_updates, weights))
        return {**crit, **kept, "actor_loss": loss}

    # -- critics ----------------------------------------------------------------------------
    def train_critics(self, updates: int) -> dict[str, float]:
        """``updates`` cross-entropy updates of both critics on the buffer's training split
        (none where the learner reads no critic)."""
        from digirl_lite import distributed as dist
        from digirl_lite.critics.data import buffer_texts, instruction_batch, step_batches
        from digirl_lite.critics.losses import instruction_critic_loss, step_critic_loss

        run, c = self.run, self.cfg
        trajs = run.buffer.trajectories("train")
        if not trajs or updates <= 0 or not self.critics:
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
        for _ in run.iterate(updates, "critics"):
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
        """:meth:`trajectory_keep` on ``usable`` (their instruction critic's values)."""
        import torch

        from digirl_lite.critics.data import instruction_values

        with torch.no_grad():
            v_i = instruction_values(usable, self.run.text, self.run.instr_critic)
        return self.trajectory_keep(rewards, filters.instruction_advantage(rewards, v_i),
                                    self.cfg.top_p)

    def step_grades(self, kept: Sequence[Trajectory]
                    ) -> list[tuple[Trajectory, np.ndarray, np.ndarray]]:
        """Each kept trajectory with its steps' grades and which ``step_filter`` keeps
        (Eq. 4.3, the released grade, or every step for "none")."""
        import torch

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
        """The valid steps of ``kept`` that :meth:`step_keep` keeps (no weights)."""
        steps = [s for t, _, keep in self.step_grades(kept)
                 for s, k in zip(t.steps, self.step_keep(keep)) if k and s.action.is_valid]
        return steps, None, {}

    # -- the actor --------------------------------------------------------------------------
    def train_actor(self, steps: Sequence[Step], updates: int,
                    weights: np.ndarray | None = None) -> float:
        """``updates`` maximum-likelihood updates on minibatches of ``steps`` drawn
        uniformly; with ``weights`` (AWR) each minibatch's loss is their weighted mean."""
        from digirl_lite.policy.updates import actor_precision, mle_update

        run, c = self.run, self.cfg
        if not steps or updates <= 0:
            return float("nan")
        loss = float("nan")
        with actor_precision(self.policy, c.actor_precision):
            for _ in run.iterate(updates, "actor"):
                idx = self.rng.integers(0, len(steps), c.actor_batch)
                loss = mle_update(self.policy, run.actor_opt, [steps[i] for i in idx],
                                  run.screens, c.actor_grad_clip, run.accelerator,
                                  c.grad_accum, None if weights is None else weights[idx])
        return round(loss, 4)
