"""DarwinX's hooks in GEPA's engine: the adapter (:class:`HarnessAdapter`: evaluate,
``make_reflective_dataset``, ``propose_new_texts``), the candidate selector
(:class:`LineageSelector`), the acceptance criterion (:class:`DarwinGate`), the merge step (a
``MergeProposer``, :func:`_darwin_merge`), the batch sampler, the callbacks, the stop rule
(:class:`_Budget`), and the engine assembled from them (:func:`_engine`). Each hook hands
its work to the loop (:class:`~digirl_lite.harness.darwinx.DarwinX`); gepa is imported where
a hook needs it (an optional dependency).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from digirl_lite.harness.archive import select_parent
from digirl_lite.harness.evidence import Evidence
from digirl_lite.harness.gate import avg_at_k
from digirl_lite.harness.harness import candidate_id
from digirl_lite.harness.runner import Outcome

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.harness.darwinx import DarwinX

__all__ = ["STALL_GENERATIONS", "EvoItem", "HarnessAdapter", "LineageSelector", "DarwinGate"]

log = logging.getLogger("digirl_lite.harness")

STALL_GENERATIONS = 3
"""The loop stops when this many generations in a row measured no new episode (every child
was one already measured, or an invalid proposal): the proposer has run dry."""


@dataclass(frozen=True)
class EvoItem:
    """One evolution task as GEPA's data instance: the task, its k and its seed base."""

    task: str
    k: int
    seed: int


class HarnessAdapter:
    """GEPA's adapter: evaluates a candidate (the harness's components) as avg@k per task,
    builds the evidence and asks the proposer for the child."""

    def __init__(self, loop: DarwinX) -> None:
        self.loop = loop

    def evaluate(self, batch: list[EvoItem], candidate: dict[str, str],
                 capture_traces: bool = False) -> Any:
        from gepa import EvaluationBatch

        outs = self.loop.play(candidate, [it.task for it in batch], batch[0].k, batch[0].seed)
        rates = avg_at_k(outs)
        by_task: dict[str, list[Outcome]] = {}
        for o in outs:
            by_task.setdefault(o.task, []).append(o)
        outputs = []
        for it in batch:
            dec: dict[str, int] = {}
            for o in by_task.get(it.task, []):
                for k, v in o.decided.items():
                    key = k.split(":")[0]
                    dec[key] = dec.get(key, 0) + v
            outputs.append({"task": it.task, "rate": rates.get(it.task), "decided": dec})
        # a task every attempt of which infrastructure cut counts as its parent's rate
        # would: it has no rate, and GEPA needs a number, so 0 (the gate reads ``outputs``)
        scores = [rates.get(it.task, 0.0) for it in batch]
        return EvaluationBatch(outputs=outputs, scores=scores,
                               trajectories=[by_task.get(it.task, []) for it in batch]
                               if capture_traces else None,
                               num_metric_calls=len(outs))

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: Any,
                                components_to_update: list[str]
                                ) -> dict[str, list[dict[str, Any]]]:
        """The evidence of the parent's minibatch (its episodes are ``eval_batch``'s
        trajectories; :meth:`DarwinX.gather_evidence`), one JSON record per piece
        (:meth:`~digirl_lite.harness.evidence.Evidence.as_dict`). The evidence is about the
        harness as a whole (the proposer chooses the component an edit goes to), so every
        component to update gets the same records."""
        outs = [o for traj in (eval_batch.trajectories or []) for o in traj]
        with self.loop.stop_on_error():
            records = [e.as_dict() for e in self.loop.gather_evidence(outs)]
        return {c: records for c in components_to_update}

    def propose_new_texts(self, candidate: dict[str, str],
                          reflective_dataset: dict[str, list[dict[str, Any]]],
                          components_to_update: list[str]) -> dict[str, str]:
        """The proposer's child (:meth:`DarwinX.propose_child`) from the evidence in
        ``reflective_dataset`` (the records :meth:`make_reflective_dataset` returned)."""
        records = reflective_dataset[components_to_update[0]] if components_to_update else []
        with self.loop.stop_on_error():
            return self.loop.propose_child(candidate, [Evidence.from_dict(r) for r in records])


class LineageSelector:
    """GEPA's candidate selector: :func:`select_parent` on the archive."""

    def __init__(self, loop: DarwinX) -> None:
        self.loop = loop

    def select_candidate_idx(self, state: Any) -> int:
        node = select_parent(self.loop.archive, self.loop.beta, self.loop.rng)
        for i, cand in enumerate(state.program_candidates):
            if candidate_id(cand) == node.candidate:
                self.loop._parent = node
                return i
        raise RuntimeError(f"node {node.id} is not in GEPA's state")


class DarwinGate:
    """GEPA's acceptance criterion: records every child in the archive and accepts by the
    loop's mode (``gate``: DarwinX's gate and probe)."""

    def __init__(self, loop: DarwinX) -> None:
        self.loop = loop
        self.last_reason = ""

    def should_accept(self, proposal: Any, state: Any) -> bool:
        ok, reason = self.loop.judge_child(proposal, state)
        self.last_reason = reason
        return ok

    def reject_reason(self, proposal: Any, state: Any) -> str:
        return self.last_reason


def _darwin_merge(loop: DarwinX, logger: Any, valset: Any, callbacks: list[Any]) -> Any:
    """A :class:`DarwinMerge`, GEPA's ``MergeProposer`` with DarwinX's merge (built on first
    use: gepa is an optional dependency), for GEPA's engine (:func:`_engine`)."""
    from gepa.proposer.merge import MergeProposer

    class DarwinMerge(MergeProposer):
        """GEPA's merge step with DarwinX's rule. GEPA schedules a merge after each accepted
        child (at most ``max_merge_invocations`` kept) and keeps the proposal when its
        subsample score sum reaches its parents' largest; GEPA's own merge picks each
        component from one parent. Here the pair is two complementary variants in the
        archive (:meth:`DarwinX.propose_merge`), the child is H0 (+) Delta_1 (+) Delta_2 (the
        skills of both, not one side's), and its subsample is the union of their solved
        sets, scored 1 per task the child solves there (avg@k_screen >= 1/2) against a bar
        of the union's size for each parent: GEPA keeps the merge exactly when the child
        solves the whole union (spec/DARWIN.md B)."""

        def propose(self, state: Any) -> Any:
            return loop.propose_merge(state)

    def evaluator(batch: Any, candidate: Any) -> Any:
        # GEPA's own merge evaluates its child with this; DarwinMerge plays its episodes
        raise NotImplementedError("DarwinX's merge step evaluates its child itself")

    return DarwinMerge(logger=logger, valset=valset, evaluator=evaluator, use_merge=True,
                       max_merge_invocations=loop.merges, callbacks=callbacks)


class _WholeSet:
    """GEPA's batch sampler: the whole evolution set every generation, in its order."""

    def next_minibatch_ids(self, loader: Any, state: Any) -> list[int]:
        return list(loader.all_ids())


class _Callbacks:
    """GEPA callbacks: the confirmation (validation set, k_confirm) of accepted variants."""

    def __init__(self, loop: DarwinX) -> None:
        self.loop = loop

    def on_valset_evaluated(self, event: Any) -> None:
        self.loop.confirmed(event["candidate"], event.get("outputs_by_val_id"),
                            event["scores_by_val_id"])


class _Budget:
    """Stops GEPA when the run's episode budget is spent (screening, probes, confirmations
    and the teacher's episodes all count; cached ones too, so a replay stops where the
    original did)."""

    def __init__(self, loop: DarwinX) -> None:
        self.loop = loop

    def __call__(self, state: Any) -> bool:
        loop = self.loop
        if loop.error is not None:
            loop.stopped = f"error: {type(loop.error).__name__}: {loop.error}"
        elif loop.episodes >= loop.budget:
            loop.stopped = "budget"
        elif loop.max_generations and loop.generation >= loop.max_generations:
            loop.stopped = "max_generations"
        elif loop.stalled >= STALL_GENERATIONS:
            loop.stopped = (f"stalled: {STALL_GENERATIONS} generations in a row measured "
                            "nothing new (the proposer has no untried edit)")
        return bool(loop.stopped)


def _engine(loop: DarwinX, seed_candidate: dict[str, str], train: list[EvoItem],
            val: list[EvoItem]) -> Any:
    """GEPA's engine with DarwinX's hooks. ``gepa.optimize`` takes no merge proposer, its
    engine does: the engine is assembled here as ``optimize`` assembles it from the same
    arguments (no reflection LM, run folder or tracking backend; ``optimize``'s
    ``module_selector="all"``, ``skip_perfect_score=False``, ``use_merge``), with
    :func:`_darwin_merge` as its merge step when ``loop.merges`` > 0."""
    from gepa.core.data_loader import ensure_loader
    from gepa.core.engine import GEPAEngine
    from gepa.logging.experiment_tracker import create_experiment_tracker
    from gepa.proposer.reflective_mutation.reflective_mutation import (
        ReflectiveMutationProposer,
    )
    from gepa.strategies.component_selector import AllReflectionComponentSelector

    adapter, logger, callbacks = HarnessAdapter(loop), _QuietLogger(), [_Callbacks(loop)]
    tracker = create_experiment_tracker()
    valset = ensure_loader(val)
    reflective = ReflectiveMutationProposer(
        logger=logger, trainset=ensure_loader(train), adapter=adapter,
        candidate_selector=LineageSelector(loop),
        module_selector=AllReflectionComponentSelector(), batch_sampler=_WholeSet(),
        perfect_score=1.0, skip_perfect_score=False, experiment_tracker=tracker,
        callbacks=callbacks)
    merge = _darwin_merge(loop, logger, valset, callbacks) if loop.merges else None
    return GEPAEngine(
        adapter=adapter, run_dir=None, valset=valset, seed_candidate=seed_candidate,
        perfect_score=1.0, seed=loop.seed, reflective_proposer=reflective,
        merge_proposer=merge, frontier_type="instance", logger=logger,
        experiment_tracker=tracker, callbacks=callbacks, track_best_outputs=True,
        display_progress_bar=False, raise_on_exception=True, stop_callback=_Budget(loop),
        acceptance_criterion=DarwinGate(loop))


class _QuietLogger:
    def log(self, message: str) -> None:
        log.debug("gepa: %s", message)
