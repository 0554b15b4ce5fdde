"""One harness-evolution run from a config: the frozen agent's held-out success, DarwinX on
the evolution set, then the evolved harness's held-out success (``recipes/evolve_harness.py``).

Every part is built from :class:`EvolveConfig`; a config that cannot work stops before any
episode with a message naming the field. The run folder holds ``summary.json`` (held-out
success per stage, in the Trainer's stage format so the grid runner's tables read it),
``metrics.jsonl``, the DarwinX run (``darwinx/``: ``archive.json``, ``generations.jsonl``,
``episodes.jsonl``), ``report.md`` and ``lineage.png``. ``resume`` replays a killed run from
its cache (:mod:`digirl_lite.harness.darwinx`).

Stages (pass@1 on the first ``eval_tasks`` test tasks, one episode each, the same seeds for
every stage): ``frozen`` (H0: the agent alone), ``frozen_constrained`` (H0, the policy's
grammar mask on every step: the decoding baseline; a policy agent only) and ``evolved``
(the variant DarwinX ends with: the confirmed variant of largest lineage gain G).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from digirl_lite.errors import ConfigError
from digirl_lite.harness.frozen import (
    RunFields,
    agent_factory,
    as_tuple,
    check_frozen_setting,
    frozen_setting,
    held_out_sets,
    measure,
    run_folder,
)

__all__ = ["EvolveConfig", "run_evolution", "QUICK", "PROPOSERS", "lineage_lines",
           "run_label"]

PROPOSERS = ("scripted", "induction", "llm")
"""The proposers of ``EvolveConfig.proposer``: ``scripted``
(:class:`~digirl_lite.harness.proposers.ScriptedProposer`), ``induction``
(:class:`~digirl_lite.harness.induction.InductionProposer`: no LLM, nothing but the agent's
episodes) and ``llm`` (:class:`~digirl_lite.harness.llm.LLMProposer`)."""
QUICK = {"budget": 160, "evo_tasks": 6, "eval_tasks": 16, "k_screen": 2, "k_confirm": 2,
         "probe_k": 2, "n_envs": 8}


@dataclass
class EvolveConfig(RunFields):
    """A harness-evolution run.

    Attributes:
        world: "webshop" or "general" (the simulated phone's task sets).
        seed: seeds the evolution tasks, GEPA's and the parent sampling's draws, and the
            episodes' seeds.
        agent: "policy" (the shipped starting policy, or ``starting_policy``, frozen) or
            "prompted" (a VLM behind ``agent_backend``).
        starting_policy: a saved policy's directory (None: the shipped one of ``world``).
        agent_backend: the prompted agent's backend (``{"backend": "gemini" | "openai",
            ...}``, :func:`digirl_lite.judge.backends.make_backend`).
        proposer: "scripted", "induction" (rules induced from the agent's own episodes,
            :mod:`digirl_lite.harness.induction`) or "llm" (``proposer_backend``; an
            OpenAI-compatible one gets ``max_tokens`` 2048 unless it sets it). The LLM is offered
            prompt and psi edits only for a prompted agent; for the policy agent such an edit is
            refused (counted, recorded with its reason, skipped), as is any reply that is not a
            valid edit.
        teacher: who plays reference episodes of the evolution tasks the agent never solved
            (:mod:`digirl_lite.harness.teachers`): "screen" (an agent acting from the UI
            tree alone, as a deployed agent sees the phone, and it can fail), "none", or
            "privileged_expert" (the simulator's expert, which reads its internal state:
            the report and the log say "privileged"; issue 48). The phones put the
            simulator's state on their observations (``obs.state``) for that teacher only;
            every other run sees none, as on a real device.
        evidence: the evidence kinds that reach the proposer, any of ``"failure"`` (the
            agent's failed episodes), ``"self"`` (its own passes: beside a failure of the
            same task, or alone for a task it always solved) and ``"teacher"`` (the
            teacher's episodes of tasks it never solved); default all three, the loop's
            behaviour before the field existed. The loop filters the evidence before any
            proposer sees it ("scripted", "induction" and "llm" alike; the memory K_g's
            failure themes too), and without ``"teacher"`` the teacher is not played
            (``teacher`` is then as "none"). E1 by evidence kind (issue 48, item 4):
            ``["failure"]``, ``["failure", "self"]``, all three. ``--set
            evidence=failure,self`` or a JSON list.
        accept: "gate" (DarwinX), "minibatch_sum" (GEPA's default) or "all".
        budget: episodes the evolution may use (screening, probes, confirmations, teacher).
        evo_tasks: evolution tasks, written from the simulator's descriptions.
        k_screen, k_confirm, probe_k: avg@k to screen, to confirm, and per probed task.
        delta: the regression R a promoted child may have (in tasks' worth of solve rate).
        beta: the Broaden share of parent sampling.
        merges: GEPA's merge step in the loop, at most this many merges kept (0: none; a
            merge is kept only when it solves the union of its parents' solved sets).
        eval_tasks: held-out test tasks (the first N of the world's test list).
        eval_splits: held-out splits measured beside the test list at every stage (issue 48,
            item 4): split names (``tasks/<world>_<name>.txt``: ``unseen_products`` and
            ``unseen_phrasings`` on Web Shopping, ``unseen_names`` and ``unseen_phrasings``
            on General) or task file paths; each stage's report holds them under ``splits``.
        eval_split_tasks: the first N tasks of each split.
        n_envs: simulated phones; fleet: "sync" or "process".
        temperature: the policy's sampling temperature (the project's evaluations: 1.0).
        copy_typed_text: the policy agent's copy mask (a typed text is a span of the goal,
            whatever its quotes: :mod:`digirl_lite.policy.copying`), as the paper setting's
            starting policy acts (issue 48, item 4 (b)); policy agent only.
        env: extra SimPhoneEnv fields (e.g. {"day": 6} for a drift day).
        setting: a training run's config file (DigiRLConfig JSON, e.g.
            ``recipes/configs/paper_setting.json``) whose world the frozen agent faces
            (issue 48, item 4 (b)): the phones are that run's live phone (its layout and
            surprises, :func:`digirl_lite.envs.setup.sim_env_kwargs`), the frozen policy
            is that config's shipped starting policy for ``world``
            (:func:`digirl_lite.train.starting.shipped_policy_dir`) and its copy mask is
            on where the config's ``copy_typed_text`` is (the generic one: any span of the
            goal, not the config's trained span extractor). Not with ``env`` or
            ``starting_policy``.
        baselines: measure the ``frozen`` and ``frozen_constrained`` stages (they depend
            only on the world, the seed and ``eval_tasks``: a grid's other arms at the same
            seed may leave them to one arm).
    """

    world: str = "webshop"
    seed: int = 0
    agent: str = "policy"
    starting_policy: str | None = None
    agent_backend: dict[str, Any] | None = None
    proposer: str = "scripted"
    proposer_backend: dict[str, Any] | None = None
    teacher: str = "screen"
    evidence: tuple[str, ...] = ("failure", "self", "teacher")
    accept: str = "gate"
    budget: int = 1500
    evo_tasks: int = 24
    k_screen: int = 3
    k_confirm: int = 5
    probe_k: int = 3
    delta: float = 1.0
    beta: float = 0.2
    merges: int = 0
    eval_tasks: int = 96
    eval_splits: tuple[str, ...] = ()
    eval_split_tasks: int = 48
    n_envs: int = 16
    fleet: str = "sync"
    temperature: float = 1.0
    copy_typed_text: bool = False
    env: dict[str, Any] = field(default_factory=dict)
    setting: str | None = None
    baselines: bool = True

    def __post_init__(self) -> None:
        # a JSON list (a config file, --set evidence='["failure"]') or a bare comma list
        # (--set evidence=failure,self); check() says what is wrong with the kinds
        self.evidence = as_tuple(self.evidence)
        self.eval_splits = as_tuple(self.eval_splits)

    @property
    def active_teacher(self) -> str:
        """The teacher the loop plays: ``teacher``, or "none" where ``evidence`` leaves the
        teacher's episodes out."""
        return self.teacher if "teacher" in self.evidence else "none"

    def check(self) -> None:
        """Every field that cannot work, before anything runs."""
        from digirl_lite.harness.darwinx import ACCEPT_MODES
        from digirl_lite.harness.teachers import TEACHERS

        def bad(name: str, why: str) -> None:
            raise ConfigError(f"{name}: {why}")

        if self.world not in ("webshop", "general"):
            bad("world", f"{self.world!r} is not 'webshop' or 'general'")
        if self.agent not in ("policy", "prompted"):
            bad("agent", f"{self.agent!r} is not 'policy' or 'prompted'")
        if self.agent == "prompted" and not self.agent_backend:
            bad("agent_backend", "a prompted agent needs a backend ({\"backend\": \"gemini\" "
                "| \"openai\", ...})")
        if self.proposer not in PROPOSERS:
            bad("proposer", f"{self.proposer!r} is not one of {PROPOSERS}")
        if self.proposer == "llm" and not self.proposer_backend:
            bad("proposer_backend", "the LLM proposer needs a backend")
        if self.teacher not in TEACHERS:
            bad("teacher", f"{self.teacher!r} is not one of {TEACHERS}")
        from digirl_lite.harness.evidence import EVIDENCE_KINDS

        ev = self.evidence
        if not isinstance(ev, tuple) or not ev or not all(isinstance(k, str) for k in ev):
            bad("evidence", f"{ev!r} is not a non-empty list of kinds from {EVIDENCE_KINDS}")
        unknown = [k for k in ev if k not in EVIDENCE_KINDS]
        if unknown:
            bad("evidence", f"{unknown} not among the kinds {EVIDENCE_KINDS}")
        if len(set(ev)) != len(ev):
            bad("evidence", f"{list(ev)} names a kind twice")
        if ev == ("teacher",) and self.teacher == "none":
            bad("evidence", "['teacher'] alone with teacher 'none' gives the proposer nothing")
        if self.accept not in ACCEPT_MODES:
            bad("accept", f"{self.accept!r} is not one of {ACCEPT_MODES}")
        for name in ("budget", "evo_tasks", "k_screen", "k_confirm", "probe_k", "eval_tasks",
                     "eval_split_tasks", "n_envs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(name, f"must be an int >= 1, got {v!r}")
        if not 0 <= self.beta <= 1:
            bad("beta", f"must be in [0, 1], got {self.beta}")
        if isinstance(self.merges, bool) or not isinstance(self.merges, int) or self.merges < 0:
            bad("merges", f"must be an int >= 0, got {self.merges!r}")
        if self.delta < 0:
            bad("delta", f"must be >= 0, got {self.delta}")
        check_frozen_setting(self)
        if self.copy_typed_text and self.agent != "policy":
            bad("copy_typed_text", "the copy mask is the policy agent's (agent 'policy'); a "
                "prompted agent writes its own text")
        if self.fleet not in ("sync", "process"):
            bad("fleet", f"{self.fleet!r} is not 'sync' or 'process'")
        for name in ("agent_backend", "proposer_backend"):
            b = getattr(self, name)
            if b:
                from digirl_lite.judge.backends import make_backend

                try:
                    make_backend(dict(b))
                except ValueError as e:
                    bad(name, str(e))

    def resolved(self) -> tuple[dict[str, Any], Path, bool]:
        """The phones' SimPhoneEnv fields, the frozen policy's directory and the copy mask
        (:func:`~digirl_lite.harness.frozen.frozen_setting`)."""
        return frozen_setting(self.world, self.setting, self.env, self.starting_policy,
                              self.copy_typed_text)


def _agent_view(cfg: EvolveConfig, policy_path: str | None) -> tuple[frozenset[str], str]:
    """What the frozen agent reads of the system prompt and psi, and its name for refusals
    (DarwinX refuses edits to what it cannot read; issue 48, item 3)."""
    from digirl_lite.harness.harness import PolicyAgent

    if getattr(cfg, "agent", "policy") == "prompted":
        from digirl_lite.harness.llm import PromptedAgent

        return PromptedAgent.reads, f"prompted agent ({cfg.agent_backend.get('model')})"
    return PolicyAgent.reads, (f"policy agent ({Path(policy_path).name}: a trained policy "
                               "reads its own prompt and the screen, not the system prompt "
                               "or psi)")


def _proposer(cfg: EvolveConfig, out: Path, reads: frozenset[str] = frozenset()):
    if cfg.proposer == "llm":
        from digirl_lite.harness.harness import AGENT_COMPONENTS, EDIT_TARGETS
        from digirl_lite.harness.llm import LLMProposer

        backend = dict(cfg.proposer_backend)
        if backend.get("backend") == "openai":
            # the backend's default reply budget (512 tokens, sized for the judge's three
            # lines) cuts a reply of three edits with their rules and rationales short: a
            # reply that is not JSON, every generation
            backend.setdefault("max_tokens", 2048)
        kinds = [k for k, c in EDIT_TARGETS.items() if c in reads or c not in AGENT_COMPONENTS]
        return LLMProposer(backend, cache_path=out / "proposer.jsonl", kinds=kinds)
    if cfg.proposer == "induction":
        from digirl_lite.harness.induction import InductionProposer

        return InductionProposer(kinds=cfg.evidence)
    from digirl_lite.harness.proposers import ScriptedProposer

    return ScriptedProposer()


def run_label(config: dict[str, Any]) -> str:
    """How the log, the report's title and the recipe name a run's evidence: its kinds and
    its teacher (the privileged one says so; issue 48). ``config``: ``EvolveConfig.as_dict()``
    (a summary's ``config``; one written before ``evidence`` existed had all three kinds)."""
    from digirl_lite.harness.teachers import teacher_label

    kinds = list(config.get("evidence") or ("failure", "self", "teacher"))
    teacher = config.get("teacher", "screen") if "teacher" in kinds else "none"
    return f"evidence: {' + '.join(kinds)}; {teacher_label(teacher)}"


def lineage_lines(archive: Any) -> list[str]:
    """The archive as an indented tree, one line per node (accepted ones marked *)."""
    kids: dict[str | None, list[Any]] = {}
    for n in archive.nodes:
        kids.setdefault(n.parent, []).append(n)
    lines: list[str] = []

    def walk(n: Any, depth: int) -> None:
        mark = "*" if n.accepted else " "
        what = "; ".join(f"{e['kind']}: {e['content'][:70]}" for e in n.edits) or "H0"
        conf = (f", confirm {sum(n.confirm.values()) / len(n.confirm):.2f}"
                if n.confirm else "")
        lines.append(f"{'  ' * depth}{mark} {n.id} g{n.generation} {n.kind} g={n.g:+.2f} "
                     f"R={n.R:.2f} G={n.G:.2f}{conf} | {what} | {n.reason[:60]}")
        for c in kids.get(n.id, []):
            walk(c, depth + 1)

    for root in kids.get(None, []):
        walk(root, 0)
    return lines


def _draw(archive: Any, path: Path, gens: list[dict[str, Any]]) -> None:
    """lineage.png: the tree (accepted nodes filled) and the screening avg@k per
    generation with the best accepted variant's so far. A bare Figure, not pyplot: the
    process's backend (a notebook's inline one) and pyplot's figure list stay as they were;
    ``savefig`` renders the png itself."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5))
    a1, a2 = fig.subplots(1, 2)
    depth: dict[str, int] = {}
    for n in archive.nodes:
        depth[n.id] = 0 if n.parent is None else depth.get(n.parent, 0) + 1
    pos = {n.id: (n.generation, depth[n.id]) for n in archive.nodes}
    for n in archive.nodes:
        if n.parent is not None and n.parent in pos:
            (x0, y0), (x1, y1) = pos[n.parent], pos[n.id]
            a1.plot([x0, x1], [y0, y1], color="0.7", lw=1, zorder=1)
    for n in archive.nodes:
        x, y = pos[n.id]
        a1.scatter([x], [y], s=60, zorder=2,
                   c="tab:green" if n.accepted else "white",
                   edgecolors={"improver": "tab:green", "neutral": "tab:blue",
                               "stepping_stone": "tab:orange", "root": "k"}.get(n.kind, "0.5"))
    a1.set_xlabel("generation")
    a1.set_ylabel("depth in the lineage")
    a1.set_title("archive (filled: accepted)")
    xs = [g["generation"] for g in gens]
    a2.plot(xs, [g["screen_mean"] for g in gens], "o", color="0.6", label="child avg@k")
    best, ys = None, []
    for g in gens:
        if g["accepted"]:
            best = g["screen_mean"] if best is None else max(best, g["screen_mean"])
        ys.append(best)
    a2.plot(xs, ys, "-", color="tab:green", label="best accepted so far")
    a2.set_xlabel("generation")
    a2.set_ylabel("avg@k on the evolution set")
    a2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def run_evolution(cfg: EvolveConfig, out: str | Path, resume: bool = False,
                  log: Any = print) -> dict[str, Any]:
    """The whole run; returns (and writes) ``summary.json``'s content."""
    cfg.check()
    with run_folder(out, resume) as folder:  # a resume while the first process runs: refused
        return _evolve(cfg, folder, resume, log)


def _evolve(cfg: EvolveConfig, out: Path, resume: bool, log: Any) -> dict[str, Any]:
    from digirl_lite.envs.sim.env import SimEnvFactory, SimPhoneEnv
    from digirl_lite.harness.darwinx import Archive, DarwinX, select_parent
    from digirl_lite.harness.harness import H0_COMPONENTS, Harness
    from digirl_lite.harness.runner import HarnessRunner, evolution_tasks
    from digirl_lite.harness.teachers import make_teacher, reads_state
    from digirl_lite.rollout.factory import make_fleet

    t0 = time.time()
    log(f"harness evolution on {cfg.world}, seed {cfg.seed}: {run_label(cfg.as_dict())}")
    held, splits, kinds = held_out_sets(cfg)
    test = [t.text for t in SimPhoneEnv._load_task_list(f"{cfg.world}_test")]
    evo = evolution_tasks(cfg.world, cfg.evo_tasks, seed=cfg.seed, exclude=test)
    make, make_constrained, policy_path = agent_factory(cfg)
    # the phones give obs.state only to the privileged teacher: a run without it sees what
    # a real device shows (issue 48, "Done when")
    env, _, _ = cfg.resolved()
    fleet = make_fleet(cfg.fleet, SimEnvFactory(
        tasks=cfg.world, ui_tree=True, **env,
        privileged_state=reads_state(cfg.active_teacher)), cfg.n_envs)
    metrics = out / "metrics.jsonl"
    from digirl_lite.redaction import redact

    # a backend's base_url may carry credentials: never written (issue 32, item 6)
    summary: dict[str, Any] = {"config": redact(cfg.as_dict()), "stages": {},
                               "evolution_tasks": evo,
                               "policy": policy_path, "kind": "evolve_harness"}
    prev = out / "summary.partial.json"
    if resume and prev.is_file():
        summary["stages"] = json.loads(prev.read_text()).get("stages", {})

    def stage(name: str, maker, components) -> None:
        if name in summary["stages"]:
            return
        rep = measure(fleet, maker, components, held, splits, kinds, cfg.seed)
        summary["stages"][name] = rep
        prev.write_text(json.dumps(summary, indent=1, default=float))
        with open(metrics, "a") as f:
            f.write(json.dumps({"stage": f"eval:{name}", "success_rate": rep["success_rate"],
                                "ci95": rep["ci95"], "truth": rep["truth"],
                                "true_success_rate": rep["true_success_rate"],
                                "decided": rep["decided"],
                                "online_trajectories": 0, "t": time.time()}) + "\n")
        from digirl_lite.train.evaluate import stage_rates

        log(f"{name}: {stage_rates(rep)} held-out "
            f"({rep['successes']}/{rep['judged_episodes']}), steps decided by rules "
            f"{100 * rep['decided']['rule']:.1f}%, by xi {100 * rep['decided']['xi']:.1f}%"
            + "".join(f"; {sp} {stage_rates(r)}" for sp, r in rep.get("splits", {}).items()))

    base = dict(H0_COMPONENTS)
    if cfg.baselines:
        stage("frozen", make, base)
        if make_constrained is not None:
            stage("frozen_constrained", make_constrained, base)
    (out / "checkpoints").mkdir(exist_ok=True)
    (out / "checkpoints" / "latest").write_text("darwinx/archive.json\n")  # for grid.py
    runner = HarnessRunner(make, fleet, out / "darwinx" / "episodes.jsonl",
                           make_teacher(cfg.active_teacher))

    def on_gen(line: dict[str, Any]) -> None:
        log(f"generation {line['generation']}: {'accepted' if line['accepted'] else 'rejected'}"
            f" ({line['kind']}; g {line['g']:+.2f}, R {line['R']:.2f}; {line['reason'][:70]})"
            f" episodes {line['episodes']}/{cfg.budget}")

    reads, agent_name = _agent_view(cfg, policy_path)
    dx = DarwinX(runner, _proposer(cfg, out, reads), evo, out / "darwinx", budget=cfg.budget,
                 k_screen=cfg.k_screen, k_confirm=cfg.k_confirm, delta=cfg.delta,
                 beta=cfg.beta, accept=cfg.accept, probe_k=cfg.probe_k, seed=cfg.seed,
                 on_generation=on_gen, merges=cfg.merges, agent_reads=reads,
                 agent_name=agent_name, evidence=cfg.evidence)
    archive: Archive = dx.run()
    import random

    best = select_parent(archive, 0.0, random.Random(0))
    evolved = Harness.from_dict(best.harness)
    stage("evolved", make, evolved.components)
    gens = [json.loads(line) for line in (out / "darwinx" / "generations.jsonl").read_text()
            .splitlines() if line.strip()]
    root = archive.nodes[0]
    root_solved = {t for t, p in (root.confirm or {}).items() if p >= 0.5}
    best_solved = {t for t, p in (best.confirm or {}).items() if p >= 0.5}
    frozen_pt = summary["stages"].get("frozen", {}).get("per_task", {})
    evolved_pt = summary["stages"]["evolved"]["per_task"]
    summary["evolution"] = {
        "best": best.id, "best_G": best.G, "generations": len(gens),
        "accepted": sum(g["accepted"] for g in gens), "episodes": dx.episodes,
        "invalid_proposals": dx.invalid_proposals,
        "kinds": {k: sum(g["kind"] == k for g in gens) for k in
                  ("improver", "neutral", "stepping_stone", "archived")},
        "root_confirm_mean": _mean(root.confirm), "best_confirm_mean": _mean(best.confirm),
        "root_solved_lost": sorted(root_solved - best_solved),
        "held_out_lost": sorted(t for t, v in frozen_pt.items() if v and evolved_pt.get(t)
                                is False),
        "held_out_gained": sorted(t for t, v in evolved_pt.items() if v and frozen_pt.get(t)
                                  is False),
        "edits": [e.as_dict() for e in evolved.edits],
        "curve": [{"generation": g["generation"], "screen_mean": g["screen_mean"],
                   "accepted": g["accepted"]} for g in gens],
    }
    summary["wall_s"] = round(time.time() - t0, 1)
    from digirl_lite.provenance import environment

    summary["environment"] = environment()  # its CPU kernels and library versions
    lines = lineage_lines(archive)
    (out / "report.md").write_text(_report(summary, lines))
    try:
        _draw(archive, out / "lineage.png", gens)
    except Exception as e:  # a drawing is not worth the run
        log(f"lineage.png not drawn: {type(e).__name__}: {e}")
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    prev.unlink(missing_ok=True)
    fleet.close()
    return summary


def _mean(d: dict[str, float] | None) -> float | None:
    return sum(d.values()) / len(d) if d else None


def _report(summary: dict[str, Any], lines: list[str]) -> str:
    ev = summary["evolution"]
    rows = ["| stage | held-out (judge) | true | 95% CI | decided by rules | by xi |",
            "|---|---|---|---|---|---|"]
    for name, r in summary["stages"].items():
        true = (f"{100 * r['true_success_rate']:.1f}%" if r.get("truth") == "environment"
                else "no ground truth")
        rows.append(f"| {name} | {100 * r['success_rate']:.1f}% ({r['successes']}/"
                    f"{r['judged_episodes']}) | {true} | {100 * r['ci95'][0]:.1f}-"
                    f"{100 * r['ci95'][1]:.1f} | {100 * r['decided']['rule']:.1f}% | "
                    f"{100 * r['decided']['xi']:.1f}% |")
        for sp, x in (r.get("splits") or {}).items():
            rows.append(f"| {name} on {sp} | {100 * x['success_rate']:.1f}% ({x['successes']}/"
                        f"{x['judged_episodes']}) | {100 * x['true_success_rate']:.1f}% | "
                        f"{100 * x['ci95'][0]:.1f}-{100 * x['ci95'][1]:.1f} | "
                        f"{100 * x['decided']['rule']:.1f}% | "
                        f"{100 * x['decided']['xi']:.1f}% |")
    kind_rows = ["| stage | task kind | episodes | successes | decided by rules | by xi |",
                 "|---|---|---|---|---|---|"]
    for name, r in summary["stages"].items():
        for k, d in (r.get("decided_by_kind") or {}).items():
            kind_rows.append(f"| {name} | {k} | {d['episodes']} | {d['successes']} | "
                             f"{100 * d['rule']:.1f}% | {100 * d['xi']:.1f}% |")
    return "\n".join([
        f"# Harness evolution ({run_label(summary['config'])})", "",
        f"Config: `{json.dumps(summary['config'])}`", "", *rows, "",
        f"{ev['generations']} generations, {ev['accepted']} accepted, "
        f"{ev.get('invalid_proposals', 0)} invalid proposals skipped, {ev['episodes']} "
        f"episodes; kinds {ev['kinds']}. Evolution set avg@k_confirm: H0 "
        f"{ev['root_confirm_mean']}, evolved {ev['best_confirm_mean']}; the root's solved tasks "
        f"the evolved variant lost: {ev['root_solved_lost']}.", "",
        *(["## Steps decided by rules, per task kind (test list)", "", *kind_rows, ""]
          if len(kind_rows) > 2 else []),
        "## Lineage (* accepted)", "", "```", *lines, "```", ""])
