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

Unusable trajectories (infrastructure cut, unjudged step) are valued but never kept, as in
the trainer. Critic values come from :mod:`digirl_lite.critics.data`, the math from
:mod:`digirl_lite.filters`; nothing is re-derived here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from digirl_lite import filters

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.critics import EmbeddingCache, InstructionCritic, StepCritic
    from digirl_lite.data.records import ScreenTable, Trajectory
    from digirl_lite.viz.runs import Run

__all__ = ["TrajectoryGrade", "Grader"]


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
        if algorithm not in ("digirl", "filtered_bc", "awr"):
            raise ValueError(f"algorithm must be 'digirl', 'filtered_bc' or 'awr', got "
                             f"{algorithm!r}")
        if step_filter not in filters.STEP_FILTERS:
            raise ValueError(f"step_filter must be one of {filters.STEP_FILTERS}, got "
                             f"{step_filter!r}")
        self.step_critic, self.instr_critic, self.text = step_critic, instr_critic, text
        self.algorithm, self.lam, self.top_p = algorithm, lam, top_p
        self.step_filter = step_filter
        self.image_encoder = image_encoder

    @classmethod
    def from_run(cls, run: Run | str | os.PathLike[str], checkpoint: str | None = None, *,
                 text_encoder: Any = None, image_encoder: Any = None) -> Grader:
        """The critics of ``run``'s newest checkpoint (or ``checkpoint``) with its filter
        settings.

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

    def _fill_features(self, trajs: Sequence[Trajectory], screens: ScreenTable) -> None:
        needed = dict.fromkeys(s.screen_id for t in trajs for s in t.steps)
        missing = [sid for sid in needed if not screens.has_features(sid)]
        if not missing:
            return
        if self.image_encoder is None:
            raise ValueError(f"{len(missing)} screen(s) have no features and the grader has no "
                             "image_encoder")
        feats = self.image_encoder.encode([screens.image(sid) for sid in missing])
        for sid, row in zip(missing, feats):
            screens.add(features=row, screen_id=sid)

    def grade(self, trajectories: Sequence[Trajectory], screens: ScreenTable
              ) -> dict[str, TrajectoryGrade]:
        """Grades of ``trajectories`` (those with at least one step), by trajectory id.

        The trajectory filter ranks the usable trajectories of this set against each other.
        """
        from digirl_lite.critics.data import critic_values_many, instruction_values

        trajs = [t for t in trajectories if t.steps]
        if not trajs:
            return {}
        self._fill_features(trajs, screens)
        v_instr = instruction_values(trajs, self.text, self.instr_critic)  # (N,)
        r = np.array([t.final_reward for t in trajs])
        a_instr = filters.instruction_advantage(r, v_instr)
        usable = np.array([t.is_usable for t in trajs])
        kept = np.zeros(len(trajs), dtype=bool)
        if usable.any():
            if self.algorithm == "filtered_bc":
                kept[usable] = filters.filtered_bc_keep(r[usable], p=self.top_p)
            else:
                kept[usable] = filters.keep_top_fraction(a_instr[usable], self.top_p)
        values = critic_values_many(trajs, screens, self.text, self.step_critic)
        out = {}
        for i, (t, v) in enumerate(zip(trajs, values)):
            a, step_ok = filters.step_grades(v, t.rewards, [s.mc_return for s in t.steps],
                                             t.horizon, self.step_filter, self.lam)
            if self.algorithm in ("filtered_bc", "awr"):  # AWR weights, drops none
                step_ok = np.ones(len(t.steps), dtype=bool)
            valid = np.array([s.action.is_valid for s in t.steps])
            out[t.traj_id] = TrajectoryGrade(
                traj_id=t.traj_id, instr_value=float(v_instr[i]),
                instr_advantage=float(a_instr[i]), kept=bool(kept[i]),
                values=tuple(float(x) for x in v), advantages=tuple(float(x) for x in a),
                step_kept=tuple(bool(x) for x in (step_ok & valid & kept[i])),
                step_filter=self.step_filter)
        return out
