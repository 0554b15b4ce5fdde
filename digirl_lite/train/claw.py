"""Darwin-Claw around a learning policy (``claw``: spec/DARWIN.md section C; issue 48,
item 5): the library's form of E3's "both" arm (``benchmarks/claw_drift.py``).

A run with ``claw`` keeps an experience bank (:class:`~digirl_lite.harness.claw.ExperienceBank`,
settings ``claw_options``). Its active units are rules that act before the policy
(:class:`~digirl_lite.harness.harness.HarnessAgent` with the H0 harness and the units as
its skills, around the run's own sampling agent): in every online iteration's collection
and in every evaluation. After an online iteration's update, a cycle runs on the episodes
that iteration collected: triage (``claw_triage``) writes candidate units from them, each
live unit is validated causally with the *updated* policy (the same tasks and env seeds
with and without it, common random numbers), and the lifecycle promotes, evicts and expires.
A step a unit decided is marked ``decided_by="rule:eu:<id>"`` in the store, and the
learner trains on it like any collected step (DigiRL, Filtered BC and AWR imitate it if
the filters keep it; PPO and GRPO skip it: it has no behaviour log-probabilities).

With an empty bank the agent is the policy alone, so a run with ``claw`` collects and
evaluates as the run without it until triage admits a unit (validation episodes then run on
the run's own phones, so its fleet statistics and phone resets differ from there on). At
the stage ends (copier, offline, online) an evaluation with active units also evaluates the
policy without them (``units_off``, on the same seeds): what the units add at evaluation,
apart from what they added to the data.

The bank goes into every checkpoint, and ``claw/bank.json`` and
``claw/skills/<skill>/SKILL.md`` are written with it, so they always hold the checkpoint's
bank; each cycle adds a ``claw`` line to ``metrics.jsonl``. A run resumes with the
checkpoint's bank. An iteration resumed from trajectories stored before a crash has no
episodes (no UI trees) to triage: its cycle is skipped and a line says so (a cycle that
finished before the crash but after the last checkpoint is not kept: its line stays in
``metrics.jsonl``, the bank is the checkpoint's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["ClawLoop", "BANK_FILE"]

BANK_FILE = "claw_bank.json"
"""The bank's file in a checkpoint."""


class ClawLoop:
    """The bank, its triage and its cycle, for one :class:`~digirl_lite.train.trainer.Trainer`
    (``trainer.claw``, built when ``cfg.claw``)."""

    def __init__(self, trainer: Any) -> None:
        from digirl_lite.harness.claw import ClawConfig, ExperienceBank
        from digirl_lite.harness.claw.bank import make_triage

        c = trainer.cfg
        self.trainer = trainer
        self.bank = ExperienceBank(ClawConfig.from_dict(c.claw_options))
        self.triage = make_triage(c.claw_triage, c.claw_triage_backend)
        self.folder = Path(trainer.out) / "claw"

    def rules(self) -> str:
        """The active units as a harness's skills (empty: none)."""
        from digirl_lite.harness.claw import skill_rules

        return skill_rules(self.bank)

    def agent(self, inner: Any) -> Any:
        """``inner`` (the run's sampling agent) with the active units acting first; ``inner``
        itself when none is active."""
        from digirl_lite.harness.harness import H0_COMPONENTS, BatchStepAgent, HarnessAgent

        rules = self.rules()
        if not rules.strip():
            return inner
        return HarnessAgent({**H0_COMPONENTS, "skills": rules}, BatchStepAgent(inner),
                            where="claw units")

    def _validation_agent(self, screens: Any) -> Any:
        """The updated policy for causal validation: the run's sampling masks, common random
        numbers per (task, step) (the per-episode memory of ``typed_span_once`` is left out:
        both sides of a validation sample alike)."""
        from digirl_lite.harness.harness import PolicyAgent

        t = self.trainer
        m = t.sampling_masks()
        return PolicyAgent(t.policy, t.features, screens, t.cfg.temperature,
                           m.max_new_tokens, m.constrained, copy_text=m.copy_text)

    def cycle(self, episodes: list[Any], fleet: Any, salt: int, iteration: int,
              collect_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        """One cycle on ``episodes`` (a fleet's, with their UI trees), validated on
        ``fleet`` (``collect_kwargs``: its ``collect`` options, e.g. the drift day's
        ``reset_options``) with CRN ``salt``; writes the run's ``claw`` line (the bank's
        files follow with the next checkpoint, :meth:`publish`); returns the cycle's record."""
        from digirl_lite.harness.claw import FleetRunner, traces_from_episodes
        from digirl_lite.harness.claw.bank import cycle_record

        traces = traces_from_episodes(episodes)
        runner = FleetRunner(fleet, self._validation_agent,
                             id_prefix=f"claw-val-it{iteration:04d}", crn_salt=salt,
                             collect_kwargs=collect_kwargs)
        rep = self.bank.cycle(traces, runner, [(t.task, t.seed) for t in traces], self.triage)
        rec = {"iteration": iteration, **cycle_record(rep, traces, self.bank, runner)}
        self.trainer.log(stage="claw", **{k: rec[k] for k in (
            "iteration", "collected", "collected_successes", "admitted", "promoted",
            "evicted", "runner_episodes")}, active=[u["id"] for u in rec["active_after"]],
            nursery=len(rec["nursery_after"]))
        return rec

    def skipped(self, iteration: int, why: str) -> None:
        """A cycle that cannot run (its iteration's episodes are gone): a line says so."""
        self.trainer.log(stage="claw", iteration=iteration, cycle=None, why=why)

    def save(self, folder: Path) -> None:
        """The bank into a checkpoint folder (being written)."""
        self.bank.save(Path(folder) / BANK_FILE)

    def publish(self) -> None:
        """The run's ``claw/`` files (``bank.json``, the ``SKILL.md`` of each skill), once
        the checkpoint holding the same bank is the latest."""
        from digirl_lite.harness.claw import write_skill_md

        self.folder.mkdir(parents=True, exist_ok=True)
        self.bank.save(self.folder / "bank.json")
        write_skill_md(self.bank, self.folder / "skills")

    def load(self, folder: Path) -> bool:
        """The bank from a checkpoint folder, under the run's ``claw_options`` (a resume with
        ``allow_config_change`` may change them); False when it holds none."""
        from digirl_lite.harness.claw import ClawConfig, ExperienceBank

        f = Path(folder) / BANK_FILE
        if not f.is_file():
            return False
        self.bank = ExperienceBank.load(f)
        self.bank.config = ClawConfig.from_dict(self.trainer.cfg.claw_options)
        return True

    def active(self) -> list[dict[str, Any]]:
        from digirl_lite.harness.claw.bank import units_record

        return units_record(self.bank)
