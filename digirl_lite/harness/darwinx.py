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

This module holds the loop (:class:`DarwinX`); the rest lives beside it and is re-exported
here: the arithmetic in :mod:`.gate` (:func:`gate`, :func:`solved_set`, :func:`classify`,
:func:`avg_at_k`), the archive in :mod:`.archive` (:class:`Node`, :class:`Archive`,
:func:`select_parent`), GEPA's hooks and engine in :mod:`.gepa_hooks`, the merge across runs
in :mod:`.merging` (:func:`merge_harness`, :func:`merge`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from digirl_lite.harness.archive import Archive, Node, select_parent
from digirl_lite.harness.evidence import (
    EVIDENCE_KINDS,
    Evidence,
    Memory,
    ProposalError,
    Proposer,
)
from digirl_lite.harness.gate import (
    SOLVED,
    GateResult,
    avg_at_k,
    classify,
    gate,
    solved_set,
)
from digirl_lite.harness.gepa_hooks import (
    STALL_GENERATIONS,
    DarwinGate,
    EvoItem,
    HarnessAdapter,
    LineageSelector,
    _engine,
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
from digirl_lite.harness.merging import merge, merge_harness
from digirl_lite.harness.runner import HarnessRunner, Outcome, evidence_from

__all__ = ["gate", "GateResult", "solved_set", "classify", "Node", "Archive", "select_parent",
           "DarwinX", "DarwinGate", "LineageSelector", "HarnessAdapter", "merge", "merge_harness",
           "avg_at_k",
           "SOLVED", "ACCEPT_MODES", "STALL_GENERATIONS", "EvoItem"]

log = logging.getLogger("digirl_lite.harness")

ACCEPT_MODES = ("gate", "minibatch_sum", "all")
"""``gate``: DarwinX (g > 0, R <= delta, then the probe); ``minibatch_sum``: GEPA's default
(the child's summed minibatch score beats the parent's); ``all``: every child (E2)."""


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


def _mean(d: dict[str, float]) -> float | None:
    return sum(d.values()) / len(d) if d else None
