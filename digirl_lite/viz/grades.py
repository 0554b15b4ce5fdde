"""Grade trajectories the way the filters see them: both critics' values, Eq. 4.4 and
Eq. 4.3, and what the filters would keep.

The viewer grades *any* set of trajectories (evaluation episodes are never trained on): each
gets V_instruct(c) and A_instruct = r - V (Eq. 4.4), each step V_step(s_h) and its advantage
(Eq. 4.3, or the released code's grade), and "kept" answers "would the trainer's online
filters imitate this?" for the set as if it were the buffer:

- DigiRL: the trajectory is among the top ``top_p`` by A_instruct (``keep_top_fraction`` over
  the usable trajectories of the set), and the step's advantage passes the step filter
  (A > 1/H for the paper's form, grade > 0 for the released one) and its action is valid.
- Filtered BC: the trajectory passes ``filtered_bc_keep`` and the action is valid.

The keep rules are the learners' own (``trajectory_keep`` and ``step_keep`` of the run's
learner, :mod:`digirl_lite.learners`). Unusable trajectories (infrastructure cut, unjudged
step) are valued but never kept, as in the trainer. Critic values come from
:mod:`digirl_lite.critics.data`, the math from :mod:`digirl_lite.filters`; nothing is
re-derived here.

PPO and GRPO runs (issue 17) have no critics and no filters: :class:`OnPolicyGrader` gives
what their learner computes from the checkpoint's policy, with the learner's own function
(its ``token_rows``: :mod:`digirl_lite.policy.on_policy`): per step the value head's value, the
token-level GAE advantage and return (PPO), the recorded log-probability of the action, and
GRPO's group-standardised advantage per trajectory (no value head, no per-step values).
:meth:`Grader.from_run` returns one for such runs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from digirl_lite import filters
from digirl_lite.learners import learner_class, learner_names

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.critics import EmbeddingCache, InstructionCritic, StepCritic
    from digirl_lite.data.records import ScreenTable, Trajectory
    from digirl_lite.viz.runs import Run

__all__ = ["TrajectoryGrade", "Grader", "OnPolicyGrade", "OnPolicyGrader", "grade_rows"]


def _learners(on_policy: bool) -> tuple[str, ...]:
    """The registered algorithms graded by :class:`OnPolicyGrader` (``on_policy``: a value
    head or group advantages, no critics) or by :class:`Grader` (the others, whose learner
    has keep rules)."""
    return tuple(n for n in learner_names() if learner_class(n).on_policy == on_policy
                 and (on_policy or hasattr(learner_class(n), "trajectory_keep")))


@dataclass(frozen=True)
class TrajectoryGrade:
    """What the critics and filters say about one trajectory of T steps.

    Attributes:
        traj_id: the trajectory's id.
        instr_value: V_instruct(task).
        instr_advantage: Eq. 4.4, final reward - V_instruct.
        kept: the trajectory passes the trajectory-level filter (see module docstring).
        values: V_step(s_0) .. V_step(s_T), T + 1 entries (V(s_T) = 0: terminal).
        advantages: the step grade per step, T entries (Eq. 4.3, or the released grade).
        step_kept: whether each step would be imitated, T entries.
        step_filter: ``"paper"`` (Eq. 4.3, keep A > 1/H) or ``"released"`` (keep grade > 0).
    """

    traj_id: str
    instr_value: float
    instr_advantage: float
    kept: bool
    values: tuple[float, ...]
    advantages: tuple[float, ...]
    step_kept: tuple[bool, ...]
    step_filter: str = "paper"

    def row(self) -> dict[str, Any]:
        """The trajectory's columns for a table."""
        return {"V_instr": self.instr_value, "A_instr": self.instr_advantage,
                "kept": self.kept, "kept_steps": sum(self.step_kept)}

    def step_rows(self) -> list[dict[str, Any]]:
        """One row per step: V_step, the step grade, kept."""
        return [{"step": h, "V": v, "A": a, "kept": k}
                for h, (v, a, k) in enumerate(zip(self.values, self.advantages,
                                                  self.step_kept))]


class Grader:
    """Critics plus the filter settings of a run.

    Args:
        step_critic: a :class:`~digirl_lite.critics.StepCritic`.
        instr_critic: an :class:`~digirl_lite.critics.InstructionCritic`.
        text: the embedding cache of the critics' text encoder.
        algorithm: ``"digirl"``, ``"filtered_bc"`` or ``"awr"`` (the run's ``algorithm``;
            AWR keeps every valid step of a kept trajectory, weighted by its grade).
        lam: Eq. 4.3's lambda (the run's ``lam``; paper 0.5).
        top_p: Eq. 4.4's kept fraction (the run's ``top_p``; paper 0.1).
        step_filter: ``"paper"``, ``"released"`` or ``"none"`` (the run's ``step_filter``).
        image_encoder: fills in features of screens stored without them (an
            :class:`~digirl_lite.vision.ImageEncoder`); None: such screens raise.
    """

    def __init__(self, step_critic: StepCritic, instr_critic: InstructionCritic,
                 text: EmbeddingCache, *, algorithm: str = "digirl", lam: float = filters.GAMMA,
                 top_p: float = 0.1, step_filter: str = "paper", image_encoder: Any = None
                 ) -> None:
        if algorithm not in _learners(on_policy=False):
            raise ValueError(f"algorithm must be one of {_learners(on_policy=False)}, got "
                             f"{algorithm!r}")
        if step_filter not in filters.STEP_FILTERS:
            raise ValueError(f"step_filter must be one of {filters.STEP_FILTERS}, got "
                             f"{step_filter!r}")
        self.step_critic, self.instr_critic, self.text = step_critic, instr_critic, text
        self.algorithm, self.lam, self.top_p = algorithm, lam, top_p
        self.learner = learner_class(algorithm)  # its keep rules
        self.step_filter = step_filter
        self.image_encoder = image_encoder

    @classmethod
    def from_run(cls, run: Run | str | os.PathLike[str], checkpoint: str | None = None, *,
                 text_encoder: Any = None, image_encoder: Any = None
                 ) -> Grader | OnPolicyGrader:
        """The critics of ``run``'s newest checkpoint (or ``checkpoint``) with its filter
        settings; for a PPO or GRPO run (``algorithm`` in its config), an
        :class:`OnPolicyGrader` of the checkpoint's policy instead (``text_encoder`` unused).

        Layer sizes are read from the state dicts, so any hidden width loads.

        Args:
            run: a :class:`~digirl_lite.viz.Run` or its folder.
            checkpoint: a checkpoint folder (default: ``checkpoints/latest``).
            text_encoder: the critics' text encoder (default: :class:`MiniLMEncoder`, the
                trainer's); its ``dim`` must match the checkpoint.
            image_encoder: for screens stored without features (default: for runs on the
                simulator's encoder, the trainer's :class:`SimScreenEncoder` with seed 0 at
                the checkpoint's image width; else none, and such screens raise).

        Raises:
            FileNotFoundError: the run has no checkpoint.
        """
        from digirl_lite.critics import EmbeddingCache, InstructionCritic, StepCritic
        from digirl_lite.viz.runs import Run

        run = run if isinstance(run, Run) else Run(run)
        if learner_class(run.config.get("algorithm", "digirl")).on_policy:
            return OnPolicyGrader.from_run(run, checkpoint, image_encoder=image_encoder)
        state = run.critic_state(checkpoint)
        if state is None:
            raise FileNotFoundError(f"{run.path} has no checkpoint with critics")
        sc, ic = state["step_critic"], state["instr_critic"]
        hidden, d_in = sc["critic1.0.weight"].shape
        text_dim = ic["critic.weight"].shape[1]
        img_dim = (d_in - text_dim) // 2
        if text_dim + 2 * img_dim != d_in:
            raise ValueError(f"step critic input {d_in} is not text {text_dim} + 2 frames")
        step_critic = StepCritic(text_dim, img_dim, hidden=hidden)
        step_critic.load_state_dict(sc)
        instr_critic = InstructionCritic(text_dim)
        instr_critic.load_state_dict(ic)
        step_critic.eval()
        instr_critic.eval()
        if text_encoder is None:
            from digirl_lite.critics import MiniLMEncoder

            text_encoder = MiniLMEncoder(device="cpu")
        if int(text_encoder.dim) != text_dim:
            raise ValueError(f"the critics read {text_dim}-d text embeddings; the text encoder "
                             f"gives {text_encoder.dim}")
        c = run.config
        if image_encoder is None and c.get("image_encoder", "sim") == "sim":
            from digirl_lite.vision import SimScreenEncoder

            image_encoder = SimScreenEncoder(dim=img_dim, seed=0)
        return cls(step_critic, instr_critic, EmbeddingCache(text_encoder),
                   algorithm=c.get("algorithm", "digirl"), lam=c.get("lam", filters.GAMMA),
                   top_p=c.get("top_p", 0.1), step_filter=c.get("step_filter", "paper"),
                   image_encoder=image_encoder)

    def grade(self, trajectories: Sequence[Trajectory], screens: ScreenTable
              ) -> dict[str, TrajectoryGrade]:
        """Grades of ``trajectories`` (those with at least one step), by trajectory id.

        The trajectory filter ranks the usable trajectories of this set against each other.
        """
        from digirl_lite.critics.data import critic_values_many, instruction_values

        trajs = [t for t in trajectories if t.steps]
        if not trajs:
            return {}
        _fill_features(trajs, screens, self.image_encoder)
        v_instr = instruction_values(trajs, self.text, self.instr_critic)  # (N,)
        r = np.array([t.final_reward for t in trajs])
        a_instr = filters.instruction_advantage(r, v_instr)
        usable = np.array([t.is_usable for t in trajs])
        kept = np.zeros(len(trajs), dtype=bool)
        if usable.any():
            kept[usable] = self.learner.trajectory_keep(r[usable], a_instr[usable], self.top_p)
        values = critic_values_many(trajs, screens, self.text, self.step_critic)
        out = {}
        for i, (t, v) in enumerate(zip(trajs, values)):
            a, step_ok = filters.step_grades(v, t.rewards, [s.mc_return for s in t.steps],
                                             t.horizon, self.step_filter, self.lam)
            step_ok = self.learner.step_keep(step_ok)
            valid = np.array([s.action.is_valid for s in t.steps])
            out[t.traj_id] = TrajectoryGrade(
                traj_id=t.traj_id, instr_value=float(v_instr[i]),
                instr_advantage=float(a_instr[i]), kept=bool(kept[i]),
                values=tuple(float(x) for x in v), advantages=tuple(float(x) for x in a),
                step_kept=tuple(bool(x) for x in (step_ok & valid & kept[i])),
                step_filter=self.step_filter)
        return out


def _fill_features(trajs: Sequence[Trajectory], screens: ScreenTable, image_encoder: Any
                   ) -> None:
    """Features for the screens of ``trajs`` stored without them (``image_encoder``)."""
    needed = dict.fromkeys(s.screen_id for t in trajs for s in t.steps)
    missing = [sid for sid in needed if not screens.has_features(sid)]
    if not missing:
        return
    if image_encoder is None:
        raise ValueError(f"{len(missing)} screen(s) have no features and the grader has no "
                         "image_encoder")
    feats = image_encoder.encode([screens.image(sid) for sid in missing])
    for sid, row in zip(missing, feats):
        screens.add(features=row, screen_id=sid)


def _mean(x: Sequence[float]) -> float:
    return float(np.mean(x)) if len(x) else float("nan")


@dataclass(frozen=True)
class OnPolicyGrade:
    """What a PPO or GRPO learner computes for one trajectory of T steps (N action tokens).

    The token-level arrays are the learner's (its ``token_rows``); the per-step numbers the
    viewer shows are read from them (see the properties).

    Attributes:
        traj_id: the trajectory's id.
        algorithm: ``"ppo"`` or ``"grpo"``.
        reward: the trajectory's final reward.
        step_lengths: action tokens per step, T entries summing to N.
        token_values: the value head's value per token, N entries (GRPO: none).
        token_advantages: per token, N entries: token-level GAE (PPO,
            :func:`digirl_lite.ppo.token_gae` with ``gamma``, ``lam``) or the trajectory's
            group advantage on every token (GRPO, :func:`digirl_lite.ppo.grpo_advantages`).
        token_returns: per token, advantages + values (PPO); GRPO: none.
        log_probs: per step, the recorded log-probability of the action as sampled (the sum
            over its tokens), None where the step recorded none.
        gamma: the discount across steps (the run's ``ppo_gamma``).
        lam: GAE's lambda (the run's ``ppo_lam``).
    """

    traj_id: str
    algorithm: str
    reward: float
    step_lengths: tuple[int, ...]
    token_values: tuple[float, ...]
    token_advantages: tuple[float, ...]
    token_returns: tuple[float, ...]
    log_probs: tuple[float | None, ...]
    gamma: float
    lam: float

    step_kept: tuple[bool, ...] = ()
    """No filter: PPO and GRPO train on every step with a recorded log-probability."""

    def _per_step(self, x: Sequence[float], pick: str) -> tuple[float, ...]:
        if not x:
            return ()
        b = np.cumsum([0, *self.step_lengths])
        return tuple(float(x[b[h]]) if pick == "first" else _mean(x[b[h]:b[h + 1]])
                     for h in range(len(self.step_lengths)))

    @property
    def values(self) -> tuple[float, ...]:
        """V at each step's first action token (the value of the state the action was taken
        in), then 0 for the end (terminal): T + 1 entries; () under GRPO."""
        first = self._per_step(self.token_values, "first")
        return (*first, 0.0) if first else ()

    @property
    def value_means(self) -> tuple[float, ...]:
        """The value head's mean over each step's tokens, T entries; () under GRPO."""
        return self._per_step(self.token_values, "mean")

    @property
    def advantages(self) -> tuple[float, ...]:
        """The mean over each step's tokens of their advantages, T entries (GRPO: the
        trajectory's group advantage)."""
        return self._per_step(self.token_advantages, "mean")

    @property
    def returns(self) -> tuple[float, ...]:
        """The return at each step's first token (the value head's target for ``values``),
        T entries; () under GRPO."""
        return self._per_step(self.token_returns, "first")

    @property
    def value_at_start(self) -> float | None:
        """V at the first token of the first step (None under GRPO)."""
        return self.token_values[0] if self.token_values else None

    def row(self) -> dict[str, Any]:
        """The trajectory's columns for a table."""
        out: dict[str, Any] = {"reward": self.reward}
        if self.token_values:  # a value head (PPO)
            out["V_start"] = self.value_at_start
            out["mean_A"] = _mean(self.token_advantages)
        else:
            out["A_group"] = self.token_advantages[0] if self.token_advantages else None
        lp = [x for x in self.log_probs if x is not None]
        out["log_prob"] = float(sum(lp)) if lp else None
        return out

    def step_rows(self) -> list[dict[str, Any]]:
        """One row per step: tokens, V (first token) and its mean over the tokens, A (mean
        over the tokens), the return at the first token, the recorded log-probability."""
        T = len(self.step_lengths)
        v, vm, r = self.values, self.value_means, self.returns
        return [{"step": h, "tokens": self.step_lengths[h],
                 "V": v[h] if v else None, "V_mean": vm[h] if vm else None,
                 "A": self.advantages[h], "G": r[h] if r else None,
                 "log_prob": self.log_probs[h]} for h in range(T)]


class OnPolicyGrader:
    """A PPO or GRPO run's policy (and value head) with its learner settings.

    Args:
        policy: a :class:`~digirl_lite.policy.base.Policy` (PPO: with its trained value
            head).
        algorithm: ``"ppo"`` or ``"grpo"`` (the run's ``algorithm``).
        gamma: the run's ``ppo_gamma``.
        lam: the run's ``ppo_lam``.
        image_encoder: fills in features of screens stored without them; None: such
            screens raise.
    """

    def __init__(self, policy: Any, *, algorithm: str = "ppo", gamma: float | None = None,
                 lam: float | None = None, image_encoder: Any = None) -> None:
        from digirl_lite import ppo

        if algorithm not in _learners(on_policy=True):
            raise ValueError(f"algorithm must be one of {_learners(on_policy=True)}, got "
                             f"{algorithm!r}")
        self.policy, self.algorithm = policy, algorithm
        self.gamma = ppo.GAMMA if gamma is None else float(gamma)
        self.lam = ppo.LAM if lam is None else float(lam)
        self.image_encoder = image_encoder

    @classmethod
    def from_run(cls, run: Run | str | os.PathLike[str], checkpoint: str | None = None, *,
                 image_encoder: Any = None) -> OnPolicyGrader:
        """The policy of ``run``'s newest checkpoint (or ``checkpoint``) with the run's
        ``algorithm``, ``ppo_gamma`` and ``ppo_lam``.

        Raises:
            FileNotFoundError: the run has no checkpoint with a policy.
            ValueError: a PPO checkpoint whose policy has no value head.
        """
        from pathlib import Path

        from digirl_lite.policy.factory import load_policy
        from digirl_lite.viz.runs import Run

        run = run if isinstance(run, Run) else Run(run)
        d = Path(checkpoint) if checkpoint is not None else run.latest_checkpoint()
        if d is None or not (d / "policy").is_dir():
            raise FileNotFoundError(f"{run.path} has no checkpoint with a policy")
        c = run.config
        algorithm = c.get("algorithm", "ppo")
        policy = load_policy(d / "policy", **({"base": c["policy_path"]}
                                              if c.get("policy") == "vlm" else {}))
        if getattr(learner_class(algorithm), "value_coef_applies", False) \
                and policy.value_head_fresh:
            raise ValueError(f"{d / 'policy'} has no value head: nothing to show for PPO")
        if image_encoder is None and c.get("image_encoder", "sim") == "sim":
            from digirl_lite.vision import SimScreenEncoder
            from digirl_lite.vision.sim_encoder import SIM_FEATURE_DIM

            dim = policy.img_dim if policy.screen_input == "features" else SIM_FEATURE_DIM
            image_encoder = SimScreenEncoder(dim=dim, seed=0)
        return cls(policy, algorithm=algorithm, gamma=c.get("ppo_gamma"),
                   lam=c.get("ppo_lam"), image_encoder=image_encoder)

    def grade(self, trajectories: Sequence[Trajectory], screens: ScreenTable
              ) -> dict[str, OnPolicyGrade]:
        """Grades of ``trajectories`` by id: those the learner would use (at least one step,
        no unjudged step; GRPO: no infrastructure truncation). GRPO's groups are the
        trajectories of one task within this set."""
        trajs = [t for t in trajectories if t.steps]
        if not trajs:
            return {}
        _fill_features(trajs, screens, self.image_encoder)
        rows = learner_class(self.algorithm).token_rows(trajs, self.policy, screens,
                                                        gamma=self.gamma, lam=self.lam)
        out, k = {}, 0
        for t in trajs:  # the rows: those of the trajectories kept, in order, a step each
            if k >= len(rows) or rows[k].step is not t.steps[0]:
                continue  # left out by the learner (unjudged; GRPO: infrastructure cut)
            rs, k = rows[k:k + len(t.steps)], k + len(t.steps)
            out[t.traj_id] = OnPolicyGrade(
                traj_id=t.traj_id, algorithm=self.algorithm, reward=float(t.final_reward),
                step_lengths=tuple(len(r.token_ids) for r in rs),
                token_values=tuple(float(x) for r in rs for x in r.values),
                token_advantages=tuple(float(x) for r in rs for x in r.advantages),
                token_returns=tuple(float(x) for r in rs for x in r.returns),
                log_probs=tuple(float(sum(r.step.action_log_probs))
                                if r.step.action_log_probs else None for r in rs),
                gamma=self.gamma, lam=self.lam)
        return out


def grade_rows(trajectories: Sequence[Trajectory],
               grades: dict[str, TrajectoryGrade | OnPolicyGrade]) -> list[dict[str, Any]]:
    """One table row per trajectory: id, task, ending, steps and its grade's columns
    (:meth:`TrajectoryGrade.row` or :meth:`OnPolicyGrade.row`; none where ungraded)."""
    return [{"traj_id": t.traj_id, "task": t.task, "ending": t.ending.value, "steps": len(t),
             **(grades[t.traj_id].row() if t.traj_id in grades else {})}
            for t in trajectories]
