"""DarwinX: selection over harness variants with the model frozen, on GEPA's engine
(spec/DARWIN.md section B; issue 30, item 3).

GEPA (the ``gepa`` package) runs the loop: pick a parent (its ``CandidateSelector``), evaluate
it on a minibatch with traces (its ``GEPAAdapter.evaluate``), build a reflective dataset and
propose new component texts (``make_reflective_dataset``, ``propose_new_texts``), evaluate the
child on the same minibatch, accept or reject it (its ``AcceptanceCriterion``), evaluate an
accepted child on the validation set and add it to its state. What DarwinX adds is written
here and plugged into those hooks:

- fitness: per-task avg@k on the evolution set (k = 3 to screen: GEPA's minibatch is the
  whole evolution set at k = 3; k = 5 to confirm: GEPA's validation set is the same tasks
  at k = 5), timeouts and INVALID steps fail, infrastructure truncations are re-run by the
  fleet and never counted;
- the gate: g > 0 and R <= delta (:func:`gate`), then the preservation probe: the lineage's
  solved set re-sampled at fresh seeds, every task of it still solved (:class:`DarwinGate`);
- the archive tree of every evaluated child, accepted or not, with its parent, edits, g, R,
  solved set and lineage gain G(c) = G(p) + g(c) (:class:`Archive`);
- parent sampling p* ~ (1 - beta) argmax G over confirmed variants + beta uniform over the
  population (:class:`LineageSelector`);
- the kinds of child (:func:`classify`) and the merge of complementary variants, kept only
  when it solves the union of their solved sets: in the loop, GEPA's merge step with
  DarwinX's pair, child and rule (``merges``, :meth:`DarwinX.propose_merge`); across runs,
  :func:`merge`;
- evidence for the proposer (:func:`~digirl_lite.harness.runner.evidence_from`) and the
  shared memory K_g (:class:`~digirl_lite.harness.evidence.Memory`).

A run writes ``archive.json`` (every node), ``generations.jsonl`` (one line per
generation) and ``episodes.jsonl`` (the runner's cache) into its folder. After ``kill -9``
the same command replays the run from the cache (evaluations already measured are read, not
run; the proposers are deterministic or cache their replies) and goes on where it stopped;
GEPA's own pickled state is not used (nothing here loads a pickle).
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from digirl_lite.harness.evidence import (
    EVIDENCE_KINDS,
    Evidence,
    Memory,
    ProposalError,
    Proposer,
)
from digirl_lite.harness.harness import (
    AGENT_COMPONENTS,
    H0_COMPONENTS,
    Edit,
    EditError,
    Harness,
    candidate_id,
    check_readable,
)
from digirl_lite.harness.runner import HarnessRunner, Outcome, evidence_from
from digirl_lite.paths import atomic_write_text

__all__ = ["gate", "GateResult", "solved_set", "classify", "Node", "Archive", "select_parent",
           "DarwinX", "DarwinGate", "LineageSelector", "HarnessAdapter", "merge", "merge_harness",
           "avg_at_k",
           "SOLVED", "ACCEPT_MODES"]

log = logging.getLogger("digirl_lite.harness")

SOLVED = 0.5
"""A task is solved by a variant when its avg@k is at least this (spec: p_t >= 1/2)."""
STALL_GENERATIONS = 3
"""The loop stops when this many generations in a row measured no new episode (every child
was one already measured, or an invalid proposal): the proposer has run dry."""
ACCEPT_MODES = ("gate", "minibatch_sum", "all")
"""``gate``: DarwinX (g > 0, R <= delta, then the probe); ``minibatch_sum``: GEPA's default
(the child's summed minibatch score beats the parent's); ``all``: every child (E2)."""


# ---------------------------------------------------------------------------------------
# the arithmetic (spec/DARWIN.md B's worked numbers are the tests)
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GateResult:
    deltas: tuple[float, ...]
    g: float
    R: float
    passed: bool


def gate(parent: Sequence[float], child: Sequence[float], delta: float) -> GateResult:
    """Delta_t = p_t(c) - p_t(p); g = sum Delta_t; R = sum max(0, -Delta_t); promoted iff
    g > 0 and R <= delta (a tolerance of 1e-9 for rates that are sums of thirds)."""
    if len(parent) != len(child):
        raise ValueError(f"{len(parent)} parent rates, {len(child)} child rates")
    d = tuple(float(c) - float(p) for p, c in zip(parent, child))
    g = sum(d)
    r = sum(max(0.0, -x) for x in d)
    return GateResult(d, g, r, g > 1e-9 and r <= delta + 1e-9)


def solved_set(rates: dict[str, float], threshold: float = SOLVED) -> set[str]:
    """The tasks whose rate is at least ``threshold``."""
    return {t for t, p in rates.items() if p >= threshold - 1e-9}


def classify(parent_solved: set[str], child_solved: set[str], accepted: bool) -> str:
    """By solved set: ``improver`` (all the parent solved and more), ``neutral`` (the same
    set), ``stepping_stone`` (solves new tasks, loses some: never an ancestor under the
    gate, it gives lessons to the memory) or ``archived`` (lost tasks and gained none, or a
    rejected child that lost nothing). A child that lost tasks keeps that kind when an
    acceptance rule other than the gate took it (E2 counts them)."""
    new = child_solved - parent_solved
    lost = parent_solved - child_solved
    if new and lost:
        return "stepping_stone"
    if lost or not accepted:
        return "archived"
    return "improver" if new else "neutral"


def avg_at_k(outcomes: Sequence[Outcome]) -> dict[str, float]:
    """Per-task success rate over the episodes an infrastructure fault did not cut (a task
    with none left has no rate)."""
    wins: dict[str, list[bool]] = {}
    for o in outcomes:
        if not o.infra:
            wins.setdefault(o.task, []).append(bool(o.success))
    return {t: sum(w) / len(w) for t, w in wins.items()}


# ---------------------------------------------------------------------------------------
# the archive
# ---------------------------------------------------------------------------------------
@dataclass
class Node:
    """One evaluated variant."""

    id: str
    parent: str | None
    generation: int
    harness: dict[str, Any]
    """:meth:`Harness.as_dict`: H0 and every edit from the root."""
    edits: list[dict[str, Any]] = field(default_factory=list)
    """This node's own edits (with provenance)."""
    candidate: str = ""
    screen: dict[str, float] = field(default_factory=dict)
    """avg@k_screen per evolution task."""
    g: float = 0.0
    R: float = 0.0
    G: float = 0.0
    solved: list[str] = field(default_factory=list)
    lineage_solved: list[str] = field(default_factory=list)
    """The tasks this lineage has shown it solves (its probe re-checked the parent's)."""
    probe: dict[str, Any] | None = None
    confirm: dict[str, float] | None = None
    """avg@k_confirm per evolution task (accepted variants)."""
    kind: str = "root"
    accepted: bool = True
    reason: str = ""
    proposer: str = ""
    evidence: dict[str, int] = field(default_factory=dict)
    decided: dict[str, int] = field(default_factory=dict)
    t: float = 0.0
    merged_from: list[str] = field(default_factory=list)
    """A merge (``kind`` "merge"): the ids of the variants merged (``parent`` is the first)."""

    @property
    def confirmed(self) -> bool:
        return self.accepted and self.confirm is not None


@dataclass
class Archive:
    nodes: list[Node] = field(default_factory=list)

    def add(self, node: Node) -> Node:
        if any(n.id == node.id for n in self.nodes):
            raise ValueError(f"node {node.id} is already in the archive")
        self.nodes.append(node)
        return node

    def get(self, node_id: str) -> Node:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def accepted_by_candidate(self, cid: str) -> Node | None:
        for n in self.nodes:
            if n.accepted and n.candidate == cid:
                return n
        return None

    def population(self) -> list[Node]:
        return [n for n in self.nodes if n.accepted]

    def save(self, path: str | Path, **extra: Any) -> None:
        atomic_write_text(Path(path), json.dumps({"nodes": [asdict(n) for n in self.nodes],
                                                  **extra}, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Archive:
        d = json.loads(Path(path).read_text())
        return cls([Node(**n) for n in d["nodes"]])


def select_parent(archive: Archive, beta: float, rng: random.Random) -> Node:
    """p* ~ (1 - beta) argmax_G over confirmed variants + beta uniform over the population
    (Broaden); ties in G go to the newest (the deepest lineage)."""
    pop = archive.population()
    if not pop:
        raise ValueError("the archive has no accepted variant")
    if beta > 0 and rng.random() < beta:
        return pop[rng.randrange(len(pop))]
    confirmed = [n for n in pop if n.confirmed] or pop
    best = max(n.G for n in confirmed)
    return [n for n in confirmed if n.G >= best - 1e-12][-1]


# ---------------------------------------------------------------------------------------
# GEPA's hooks
# ---------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------
class DarwinX:
    """One DarwinX run.

    Args:
        runner: plays tasks with a harness (:class:`~digirl_lite.harness.runner.HarnessRunner`).
        proposer: turns evidence into edits (scripted or LLM).
        tasks: the evolution set (never the test list).
        out_dir: where the archive, the generation log and the episode cache go.
        budget: episodes in all (the fixed evaluation budget).
        k_screen, k_confirm: avg@k to screen a child and to confirm an accepted one.
        delta: the bounded regression R a promoted child may have.
        beta: the Broaden share of parent sampling.
        accept: one of :data:`ACCEPT_MODES`.
        probe_k: episodes per task of the preservation probe (fresh seeds).
        seed: seeds GEPA's and the parent sampling's random draws and the episodes' seeds.
        base: H0's components (default :data:`~digirl_lite.harness.harness.H0_COMPONENTS`).
        max_generations: stop after this many generations (None: the budget alone). The
            loop also stops when :data:`STALL_GENERATIONS` generations in a row measured
            nothing new (:attr:`stopped` says why it stopped).
        merges: GEPA's merge step (``use_merge``) with at most this many merges kept (its
            ``max_merge_invocations``; 0: no merge step): after an accepted child, the next
            generation tries to merge two complementary variants of the archive
            (:meth:`propose_merge`), kept only when the child solves the union of their
            solved sets.
        agent_reads: the components of
            :data:`~digirl_lite.harness.harness.AGENT_COMPONENTS` the frozen agent reads
            (:attr:`~digirl_lite.harness.harness.HarnessAgent.reads`; default both, as a
            prompted agent). A proposal that edits one it does not read (a prompt or psi edit
            for a trained policy) is refused, its reason naming the component and
            ``agent_name``.
        agent_name: the agent as refusals name it.
        evidence: the evidence kinds the proposer gets (a subset of
            :data:`~digirl_lite.harness.evidence.EVIDENCE_KINDS`; default all): the loop
            builds the evidence, then keeps only these kinds for the proposer and the memory
            K_g, whatever the proposer. Without ``"teacher"`` the teacher plays nothing
            (no budget spent on it).

    A proposal that is not a valid edit (a reply that does not parse, an edit that does not
    apply, one the agent cannot read) is counted (:attr:`invalid_proposals`) and recorded
    as a rejected child with the reason; the loop goes on.
    """

    def __init__(self, runner: HarnessRunner, proposer: Proposer, tasks: Sequence[str],
                 out_dir: str | Path, *, budget: int = 2000, k_screen: int = 3,
                 k_confirm: int = 5, delta: float = 0.5, beta: float = 0.2,
                 accept: str = "gate", probe_k: int = 3, seed: int = 0,
                 base: dict[str, str] | None = None,
                 on_generation: Callable[[dict[str, Any]], None] | None = None,
                 max_generations: int | None = None, merges: int = 0,
                 agent_reads: Sequence[str] = AGENT_COMPONENTS,
                 agent_name: str = "agent",
                 evidence: Sequence[str] = EVIDENCE_KINDS) -> None:
        if accept not in ACCEPT_MODES:
            raise ValueError(f"accept must be one of {ACCEPT_MODES}, got {accept!r}")
        bad = [k for k in evidence if k not in EVIDENCE_KINDS]
        if bad or not evidence or isinstance(evidence, str):
            raise ValueError(f"evidence {evidence!r}: a non-empty list of kinds, each one of "
                             f"{EVIDENCE_KINDS}")
        self.evidence = tuple(evidence)
        if len(set(tasks)) != len(tasks) or not tasks:
            raise ValueError("the evolution set must be distinct tasks (and not empty)")
        self.runner, self.proposer, self.tasks = runner, proposer, list(tasks)
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.budget, self.k_screen, self.k_confirm = budget, k_screen, k_confirm
        self.delta, self.beta, self.accept, self.probe_k = delta, beta, accept, probe_k
        self.seed = seed
        self.rng = random.Random(seed)
        self.base = dict(base or H0_COMPONENTS)
        self.on_generation = on_generation
        self.max_generations = max_generations
        if merges < 0:
            raise ValueError(f"merges must be >= 0, got {merges}")
        self.merges = merges
        self.agent_reads = frozenset(agent_reads)
        self.agent_name = agent_name
        self.invalid_proposals = 0  # proposals refused before any episode (counted, skipped)
        self.stopped = ""  # why the loop stopped
        self.stalled = 0  # generations in a row that measured nothing new
        self._episodes_at_gen = 0
        self.archive = Archive()
        self.memory = Memory()
        self.generation = 0
        self._parent: Node | None = None
        self._pending: dict[str, tuple[Harness, list[Edit], str]] = {}
        self._evidence_kinds: dict[str, int] = {}  # the last proposal's, for its node
        self.error: Exception | None = None  # what stopped the run (:meth:`stop_on_error`)
        self._log_path = self.out / "generations.jsonl"
        self._replayed = 0
        self._logged_before = 0
        self._episodes0 = runner.distinct_episodes

    # -- episodes ------------------------------------------------------------------------
    def _seeds(self, what: str, k: int, j: int) -> int:
        offsets = {"screen": 0, "confirm": 50_000, "teacher": 0}
        return 1_000_000 * (self.seed + 1) + offsets[what] + 1000 * j

    def play(self, components: dict[str, str], tasks: Sequence[str], k: int, seed: int
             ) -> list[Outcome]:
        """``k`` episodes of each task: repeat ``j`` at env seeds ``seed + 1000 j + i``."""
        outs: list[Outcome] = []
        for j in range(k):
            outs += self.runner.run(components, list(tasks), seed + 1000 * j)
        return outs

    @property
    def episodes(self) -> int:
        """Distinct episodes this run has measured (an evaluation read again, e.g. the
        parent's each generation, counts once; so does a replay's)."""
        return self.runner.distinct_episodes - self._episodes0

    def _probe_seed(self) -> int:
        return 1_000_000 * (self.seed + 1) + 500_000 + 10_000 * self.generation

    # -- proposals -----------------------------------------------------------------------
    @contextlib.contextmanager
    def stop_on_error(self) -> Any:
        """Around DarwinX's code in GEPA's reflective step (the evidence, the proposal):
        GEPA logs an exception raised there and tries again at its next iteration, forever
        if the error stays (a teacher's fleet that is down, a bug); kept here, it stops the
        loop (:class:`_Budget`) and :meth:`run` raises it. An invalid proposal is no error
        (:meth:`propose_child` records it as a rejected child)."""
        try:
            yield
        except Exception as e:
            self.error = e
            raise

    def gather_evidence(self, outs: Sequence[Outcome]) -> list[Evidence]:
        """The evidence of a parent's screening episodes ``outs`` (GEPA's reflective
        dataset, :meth:`HarnessAdapter.make_reflective_dataset`): failure-, teacher- and
        self-derived (:func:`~digirl_lite.harness.runner.evidence_from`), of the kinds this
        run hands its proposer. The teacher plays each task the parent never solved."""
        teacher: list[Outcome] = []
        never = sorted({o.task for o in outs if not o.infra}
                       - {o.task for o in outs if o.success})
        if never and self.runner.teacher is not None and "teacher" in self.evidence:
            fails = {}
            for o in outs:
                if o.task in never and not o.infra and o.task not in fails:
                    fails[o.task] = o.seed
            # the teacher plays each never-solved task at the seed of its first failure
            for task, s in fails.items():
                teacher += self.runner.run_teacher([task], s)
        return [e for e in evidence_from(outs, teacher) if e.kind in self.evidence]

    def propose_child(self, candidate: dict[str, str], evidence: Sequence[Evidence]
                      ) -> dict[str, str]:
        """The proposer's child of ``candidate`` from ``evidence`` (GEPA's
        ``propose_new_texts``); the evidence's failure themes go to the memory K_g first. A
        proposal that is not a valid edit becomes a rejected child (recorded when judged):
        GEPA gets the parent's texts back, which it then evaluates from the cache."""
        parent = self._parent
        if parent is None or parent.candidate != candidate_id(candidate):
            parent = self.archive.accepted_by_candidate(candidate_id(candidate))
        harness = Harness.from_dict(parent.harness)
        self.memory = self.memory.aggregate(evidence)
        self._evidence_kinds = {k: sum(e.kind == k for e in evidence)
                                for k in ("failure", "teacher", "self")}
        try:
            edits = self.proposer.propose(harness.components, evidence, self.memory)
            if not edits:
                raise ProposalError("the proposer returned no edit")
            check_readable(edits, self.agent_reads, self.agent_name)
            child = harness.extend(edits)
        except (ProposalError, EditError) as e:
            self.invalid_proposals += 1
            log.warning("generation %d: invalid proposal skipped (%d so far): %s",
                        self.generation + 1, self.invalid_proposals, str(e)[:300])
            self._pending[candidate_id(candidate)] = (harness, [], f"invalid proposal: {e}")
            return dict(candidate)
        comps = child.components
        self._pending[candidate_id(comps)] = (child, list(edits), "")
        return comps

    # -- merge ---------------------------------------------------------------------------
    def merge_pair(self) -> tuple[Node, Node] | None:
        """The next pair to merge: two confirmed variants (improvers, neutral children,
        merges: spec B's recombinable kinds), neither an ancestor of the other, each solving
        a task the other does not (their ``lineage_solved``), not merged before; the pair
        with the largest union, the newest on ties. None when there is none."""
        nodes = {n.id: n for n in self.archive.nodes}

        def ancestors(n: Node) -> set[str]:
            out: set[str] = set()
            todo = [n.parent, *n.merged_from]
            while todo:
                i = todo.pop()
                if i is not None and i not in out and i in nodes:
                    out.add(i)
                    todo += [nodes[i].parent, *nodes[i].merged_from]
            return out

        tried = {tuple(sorted(n.merged_from)) for n in self.archive.nodes if n.merged_from}
        pool = [n for n in self.archive.population()
                if n.confirmed and n.kind in ("improver", "neutral", "merge")]
        best: tuple[int, int, int] | None = None
        pair = None
        for i, a in enumerate(pool):
            for j in range(i + 1, len(pool)):
                b = pool[j]
                sa, sb = set(a.lineage_solved), set(b.lineage_solved)
                if (tuple(sorted((a.id, b.id))) in tried or not sa - sb or not sb - sa
                        or a.id in ancestors(b) or b.id in ancestors(a)):
                    continue
                key = (len(sa | sb), i, j)
                if best is None or key > best:
                    best, pair = key, (a, b)
        return pair

    def propose_merge(self, state: Any) -> Any:
        """GEPA's merge proposal (:class:`DarwinMerge`): the pair of :meth:`merge_pair`
        merged (:func:`merge_harness`), played ``k_screen`` times on the union of their
        solved sets at fresh seeds, and recorded in the archive as a node of kind "merge",
        accepted when it solves the whole union. None when there is no pair (or the merged
        harness is one the archive holds)."""
        from gepa.proposer.base import CandidateProposal

        pair = self.merge_pair()
        if pair is None:
            return None
        a, b = pair
        idx = {candidate_id(c): i for i, c in enumerate(state.program_candidates)}
        if a.candidate not in idx or b.candidate not in idx:
            return None
        self.generation += 1
        union = sorted(set(a.lineage_solved) | set(b.lineage_solved))
        node = Node(id=f"n{len(self.archive.nodes):04d}", parent=a.id,
                    generation=self.generation, harness={}, merged_from=[a.id, b.id],
                    kind="merge", G=max(a.G, b.G), proposer="merge", t=time.time())
        try:
            child = merge_harness([Harness.from_dict(a.harness), Harness.from_dict(b.harness)])
        except (EditError, ValueError) as e:
            child = None
            node.harness, node.accepted = a.harness, False
            node.reason = f"the edits do not combine: {e}"
        rates: dict[str, float] = {}
        if child is not None:
            cid = candidate_id(child.components)
            node.harness, node.candidate = child.as_dict(), cid
            have = {(e.kind, e.content) for e in Harness.from_dict(a.harness).edits}
            node.edits = [e.as_dict() for e in child.edits if (e.kind, e.content) not in have]
            if self.archive.accepted_by_candidate(cid) is not None:
                node.accepted, node.reason = False, "the merge equals a variant in the archive"
            else:
                seed = 1_000_000 * (self.seed + 1) + 700_000 + 10_000 * self.generation
                rates = avg_at_k(self.play(child.components, union, self.k_screen, seed))
                solved = solved_set(rates)
                missing = sorted(set(union) - solved)
                node.screen, node.solved = rates, sorted(solved)
                node.accepted = not missing
                node.reason = ("covers the union of its parents' solved sets" if not missing
                               else f"misses {missing} of the union")
                if node.accepted:
                    node.lineage_solved = sorted(set(union) | solved)
        self.archive.add(node)
        self.stalled = self.stalled + 1 if self.episodes == self._episodes_at_gen else 0
        self._episodes_at_gen = self.episodes
        self._log(node)
        if child is None or node.candidate == "" or (not rates and not node.accepted):
            return None  # nothing GEPA should evaluate
        bar = float(len(union))
        return CandidateProposal(
            candidate=child.components, parent_program_ids=[idx[a.candidate], idx[b.candidate]],
            subsample_indices=[self.tasks.index(t) for t in union if t in self.tasks],
            subsample_scores_before=[bar, bar],
            subsample_scores_after=[1.0 if rates.get(t, 0.0) >= SOLVED - 1e-9 else 0.0
                                    for t in union],
            tag="merge", metadata={"node": node.id, "merged_from": node.merged_from})

    # -- the gate ------------------------------------------------------------------------
    def judge_child(self, proposal: Any, state: Any) -> tuple[bool, str]:
        """Record the child of ``proposal`` in the archive; return (accepted, why)."""
        self.generation += 1
        pidx = proposal.parent_program_ids[0]
        parent = self.archive.accepted_by_candidate(
            candidate_id(state.program_candidates[pidx]))
        cid = candidate_id(proposal.candidate)
        harness, edits, invalid = self._pending.pop(cid, (None, [], "unknown child"))
        before = {o["task"]: o["rate"] for o in proposal.eval_before.outputs}
        after = {o["task"]: o["rate"] for o in proposal.eval_after.outputs}
        tasks = [t for t in self.tasks if before.get(t) is not None and after.get(t) is not None]
        parent.screen = parent.screen or {t: before[t] for t in tasks}
        res = gate([before[t] for t in tasks], [after[t] for t in tasks], self.delta)
        child_rates = {t: after[t] for t in tasks}
        node = Node(id=f"n{len(self.archive.nodes):04d}", parent=parent.id,
                    generation=self.generation,
                    harness=(harness or Harness.from_dict(parent.harness)).as_dict(),
                    edits=[e.as_dict() for e in edits], candidate=cid, screen=child_rates,
                    g=res.g, R=res.R, G=parent.G + res.g,
                    solved=sorted(solved_set(child_rates)),
                    proposer=getattr(self.proposer, "name", type(self.proposer).__name__),
                    evidence=dict(self._evidence_kinds), t=time.time())
        p_solved = set(parent.lineage_solved) | solved_set({t: before[t] for t in tasks})
        accepted, reason = False, ""
        if invalid:
            reason = invalid
        elif self.archive.accepted_by_candidate(cid) is not None:
            reason = "the child equals a variant already in the archive"
        elif self.accept == "all":
            accepted, reason = True, "accept-all"
        elif self.accept == "minibatch_sum":
            accepted = sum(after[t] for t in tasks) > sum(before[t] for t in tasks) + 1e-9
            reason = ("minibatch sum " + ("rose" if accepted else "did not rise")
                      + f" (g = {res.g:+.3f})")
        elif not res.passed:
            reason = (f"gate: g = {res.g:+.3f}, R = {res.R:.3f} (needs g > 0, "
                      f"R <= {self.delta})")
        else:
            probe = self._probe(state.program_candidates[pidx], proposal.candidate,
                                sorted(p_solved))
            node.probe = probe
            accepted = probe["ok"]
            reason = ("gate and probe passed" if accepted else
                      f"probe: lost {probe['lost']} of the lineage's solved set")
        node.accepted = accepted
        node.reason = reason
        # the probe's verdict on the lineage's tasks: kept, or missed by the parent too
        c_solved = set(node.solved) | (set(node.probe["kept"]) | set(node.probe["parent_missed"])
                                       if node.probe else set())
        node.kind = classify(p_solved, c_solved, accepted)
        node.lineage_solved = sorted(p_solved | c_solved) if accepted else []
        node.decided = self._decided(proposal.eval_after)
        self.archive.add(node)
        entry = {"content": "\n".join(e.content.strip() for e in edits),
                 "g": round(res.g, 4), "R": round(res.R, 4), "node": node.id}
        self.memory = self.memory.aggregate([], worked=[entry] if accepted else [],
                                            regressed=[] if accepted or not edits else [entry])
        self.stalled = self.stalled + 1 if self.episodes == self._episodes_at_gen else 0
        self._episodes_at_gen = self.episodes
        self._log(node)
        return accepted, reason

    @staticmethod
    def _decided(eval_batch: Any) -> dict[str, int]:
        """Who decided the steps of an evaluation: ``agent``, ``rule``, ``xi`` counts."""
        out: dict[str, int] = {}
        for o in eval_batch.outputs:
            for k, v in (o.get("decided") or {}).items():
                out[k] = out.get(k, 0) + v
        return out

    def _probe(self, parent: dict[str, str], child: dict[str, str], tasks: list[str]
               ) -> dict[str, Any]:
        """The preservation probe: the lineage's solved set re-sampled at fresh seeds
        (``probe_k`` episodes per task), the child and, at the same seeds, the parent. A
        task is lost when the parent solves it there (avg >= 1/2) and the child does not:
        a task the lineage once solved by luck and its parent no longer solves at the new
        seeds is not held against the child (it is reported in ``parent_missed``)."""
        if not tasks:
            return {"tasks": [], "rates": {}, "parent_rates": {}, "ok": True, "lost": [],
                    "kept": [], "parent_missed": []}
        seed = self._probe_seed()
        rates = avg_at_k(self.play(child, tasks, self.probe_k, seed))
        prates = avg_at_k(self.play(parent, tasks, self.probe_k, seed))
        ok_c = {t for t in tasks if rates.get(t, 0.0) >= SOLVED - 1e-9}
        ok_p = {t for t in tasks if prates.get(t, 0.0) >= SOLVED - 1e-9}
        lost = sorted(ok_p - ok_c)
        return {"tasks": tasks, "rates": rates, "parent_rates": prates, "ok": not lost,
                "lost": lost, "kept": sorted(ok_c), "parent_missed": sorted(set(tasks) - ok_p)}

    def confirmed(self, candidate: dict[str, str], outputs: Any, scores: dict) -> None:
        node = self.archive.accepted_by_candidate(candidate_id(candidate))
        if node is None:
            return
        if outputs:
            node.confirm = {o["task"]: o["rate"] for o in outputs.values()
                            if o.get("rate") is not None}
        else:
            node.confirm = {self.tasks[int(i)]: float(s) for i, s in scores.items()}
        self._save()

    # -- records -------------------------------------------------------------------------
    def _log(self, node: Node) -> None:
        line = {"generation": node.generation, "node": node.id, "parent": node.parent,
                "accepted": node.accepted, "kind": node.kind, "g": node.g, "R": node.R,
                "G": node.G, "reason": node.reason, "screen_mean": _mean(node.screen),
                "solved": len(node.solved), "lineage_solved": len(node.lineage_solved),
                "edits": node.edits, "episodes": self.episodes, "t": node.t}
        if node.merged_from:
            line["merged_from"] = node.merged_from
        if self._replayed < self._logged_before:
            self._replayed += 1  # already in the log (a replay after kill -9)
        else:
            with open(self._log_path, "a") as f:
                f.write(json.dumps(line) + "\n")
        self._save()
        if self.on_generation is not None:
            self.on_generation(line)

    def _save(self) -> None:
        self.archive.save(self.out / "archive.json", memory=self.memory.as_dict(),
                          episodes=self.episodes, budget=self.budget,
                          settings={"k_screen": self.k_screen, "k_confirm": self.k_confirm,
                                    "delta": self.delta, "beta": self.beta,
                                    "accept": self.accept, "probe_k": self.probe_k,
                                    "seed": self.seed, "tasks": self.tasks},
                          stopped=self.stopped, invalid_proposals=self.invalid_proposals)

    # -- run -----------------------------------------------------------------------------
    def run(self) -> Archive:
        """Evolve until the budget is spent; returns the archive (also in ``archive.json``)."""
        try:
            import gepa  # noqa: F401 - its engine runs the loop (:func:`_engine`)
        except ImportError:
            raise ImportError("DarwinX runs on GEPA's engine: pip install "
                              "'digirl-lite[harness]' (the gepa package)") from None

        self._logged_before = (sum(1 for line in self._log_path.read_text().splitlines()
                                   if line.strip()) if self._log_path.is_file() else 0)
        root = Harness(dict(self.base), [])
        comps = root.components
        self.archive.add(Node(id="n0000", parent=None, generation=0, harness=root.as_dict(),
                              candidate=candidate_id(comps), kind="root", reason="H0",
                              t=time.time()))
        s = self._seeds("screen", self.k_screen, 0)
        train = [EvoItem(t, self.k_screen, s) for t in self.tasks]
        val = [EvoItem(t, self.k_confirm, self._seeds("confirm", self.k_confirm, 0))
               for t in self.tasks]
        engine = _engine(self, comps, train, val)
        with engine.experiment_tracker:  # no backend: a no-op, as gepa.optimize does it
            engine.run()
        self._save()
        if self.error is not None:
            raise self.error
        return self.archive


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


def _mean(d: dict[str, float]) -> float | None:
    return sum(d.values()) / len(d) if d else None


def merge_harness(variants: Sequence[Harness]) -> Harness:
    """H0 (+) (Delta_1 (+) ... (+) Delta_n): the variants' edits in order, an edit two of
    them share taken once. ValueError when they are fewer than two or do not share their
    H0; :class:`EditError` when the edits do not combine."""
    if len(variants) < 2:
        raise ValueError("a merge needs two variants or more")
    base = variants[0].base
    if any(v.base != base for v in variants):
        raise ValueError("the variants do not share their H0")
    edits: list[Edit] = []
    seen: set[tuple[str, str]] = set()
    for v in variants:
        for e in v.edits:
            if (e.kind, e.content) not in seen:
                seen.add((e.kind, e.content))
                edits.append(e)
    return Harness(dict(base), []).extend(edits)


def merge(runner: HarnessRunner, variants: Sequence[Harness], tasks: Sequence[str],
          solved_sets: Sequence[set[str]], *, k: int = 3, seed: int = 0) -> dict[str, Any]:
    """Merge complementary variants of one ancestor outside a run (:func:`merge_harness`),
    e.g. variants evolved by separate runs. Kept only when the child solves the union of
    their solved sets (avg@k >= 1/2 on each task of it, at ``k`` episodes from seed
    ``seed``). Returns the child, its rates and the verdict. Inside a run, GEPA's merge
    step does this (``DarwinX(merges=...)``)."""
    try:
        child = merge_harness(variants)
    except EditError as e:
        return {"kept": False, "reason": f"the edits do not combine: {e}", "child": None}
    union = set().union(*solved_sets)
    outs: list[Outcome] = []
    for j in range(k):
        outs += runner.run(child.components, list(tasks), seed + 1000 * j)
    rates = avg_at_k(outs)
    solved = solved_set(rates)
    missing = sorted(union - solved)
    return {"kept": not missing, "child": child.as_dict(), "rates": rates,
            "solved": sorted(solved), "union": sorted(union), "missing": missing,
            "reason": "covers the union" if not missing else f"misses {missing}"}
