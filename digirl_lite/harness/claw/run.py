"""Darwin-Claw as a library feature (issue 48, item 5): a frozen agent grows an experience
bank over cycles of practice, chosen by config (:class:`ClawRunConfig`) and run by
:func:`run_claw` (``recipes/claw.py`` on the command line).

Where the frozen policy acts comes from the same fields as a DarwinX run
(:func:`~digirl_lite.harness.frozen.frozen_setting`): today's phone and the shipped policy by
default, or ``setting`` (a training run's config: its live phone, its shipped starting
policy, its copy mask), so that a frozen agent adapting to a phone that changed is one
``--set setting=recipes/configs/paper_setting.json``.

A run:

1. **frozen**: held-out pass@1 of the policy alone (the H0 harness), on the first
   ``eval_tasks`` test tasks and the first ``eval_split_tasks`` of each of ``eval_splits``
   (:func:`~digirl_lite.harness.frozen.measure`: the same env seeds and common random
   numbers at every stage, so the stages pair task by task).
2. ``cycles`` cycles: the agent, with the bank's active units as its harness's skills
   (:func:`~digirl_lite.harness.claw.skill_rules`), plays ``train_tasks`` tasks drawn from
   the world's training list (never a test task); the traces go through triage
   (``triage``: :class:`~digirl_lite.harness.claw.ScriptedTriage`, or an LLM behind
   ``triage_backend``) into the nursery, every live unit is validated causally on the same
   tasks and seeds with and without it (:class:`~digirl_lite.harness.claw.FleetRunner`),
   and the lifecycle promotes, evicts and expires (:meth:`ExperienceBank.cycle`). The agent
   sees what a deployed agent sees: screens, the UI tree, its own episodes and the verdicts;
   no phone puts the simulator's state on an observation.
3. **claw**: held-out pass@1 with the bank's active units, on the same tasks and seeds.

It writes ``summary.json`` (both stages, each cycle's report, the units), ``metrics.jsonl``
(a line per stage and per cycle), ``bank.json`` and ``skills/<skill>/SKILL.md`` after every
cycle. A run killed during a cycle resumes from the last finished one (``resume``): the
samples are drawn from the seed, so the cycles it replays are the same.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from digirl_lite.errors import ConfigError
from digirl_lite.harness.claw.bank import check_claw_fields, cycle_record, make_triage, units_record
from digirl_lite.harness.frozen import RunFields

QUICK = {"cycles": 2, "train_tasks": 8, "eval_tasks": 16, "eval_split_tasks": 8,
         "n_envs": 8}


@dataclass
class ClawRunConfig(RunFields):
    """A Darwin-Claw run around a frozen policy.

    Attributes:
        world, seed: the simulated phone's task sets; the seed draws each cycle's training
            tasks and every env seed.
        setting, env, starting_policy, copy_typed_text: where the frozen policy acts
            (:func:`~digirl_lite.harness.frozen.frozen_setting`, as in DarwinX's
            :class:`~digirl_lite.harness.evolve.EvolveConfig`).
        constrained_decoding: the policy's action-format grammar on every step (the E3
            setting); off: the grammar only on a retry.
        triage: "scripted" (mechanical, CPU) or "llm" (``triage_backend``, the judge's
            backends: ``{"backend": "gemini" | "openai", ...}``).
        claw: :class:`~digirl_lite.harness.claw.ClawConfig` fields (weights, nursery
            capacity, TTL, slots, eviction).
        cycles: practice cycles; train_tasks: tasks played per cycle.
        eval_tasks, eval_splits, eval_split_tasks: the held-out sets (as DarwinX's).
        n_envs: simulated phones; temperature: the policy's sampling temperature.
    """

    world: str = "webshop"
    seed: int = 0
    setting: str | None = None
    env: dict[str, Any] = field(default_factory=dict)
    starting_policy: str | None = None
    copy_typed_text: bool = False
    constrained_decoding: bool = False
    triage: str = "scripted"
    triage_backend: dict[str, Any] | None = None
    claw: dict[str, Any] = field(default_factory=dict)
    cycles: int = 6
    train_tasks: int = 24
    eval_tasks: int = 96
    eval_splits: tuple[str, ...] = ()
    eval_split_tasks: int = 48
    n_envs: int = 16
    temperature: float = 1.0

    def __post_init__(self) -> None:
        from digirl_lite.harness.frozen import as_tuple

        self.eval_splits = as_tuple(self.eval_splits)

    def resolved(self) -> tuple[dict[str, Any], Path, bool]:
        from digirl_lite.harness.frozen import frozen_setting

        return frozen_setting(self.world, self.setting, self.env, self.starting_policy,
                              self.copy_typed_text)

    def check(self) -> None:
        """Every field that cannot work, before anything runs (ConfigError naming it)."""
        from digirl_lite.harness.frozen import check_frozen_setting

        def bad(name: str, why: str) -> None:
            raise ConfigError(f"{name}: {why}")

        if self.world not in ("webshop", "general"):
            bad("world", f"{self.world!r} is not 'webshop' or 'general'")
        check_frozen_setting(self)
        if not isinstance(self.constrained_decoding, bool):
            bad("constrained_decoding", f"must be true or false, got "
                f"{self.constrained_decoding!r}")
        check_claw_fields(self.claw, self.triage, self.triage_backend)
        for name in ("cycles", "train_tasks", "eval_tasks", "eval_split_tasks", "n_envs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(name, f"must be an int >= 1, got {v!r}")
        if self.temperature < 0:
            bad("temperature", f"must be >= 0, got {self.temperature}")


def training_tasks(world: str) -> list[str]:
    """The world's training list less every test task (a cycle never practises on one)."""
    from digirl_lite.envs.sim.env import SimPhoneEnv

    test = {t.text for t in SimPhoneEnv._load_task_list(f"{world}_test")}
    return [t.text for t in SimPhoneEnv._load_task_list(world) if t.text not in test]


def run_claw(cfg: ClawRunConfig, out: str | Path, resume: bool = False,
             log: Any = print) -> dict[str, Any]:
    """The whole run; returns (and writes) ``summary.json``'s content.

    Raises:
        ConfigError: a field that cannot work, or a non-empty ``out`` without ``resume``.
    """
    from digirl_lite.harness.frozen import run_folder

    cfg.check()
    with run_folder(out, resume) as folder:
        return _run(cfg, folder, resume, log)


def _run(cfg: ClawRunConfig, out: Path, resume: bool, log: Any) -> dict[str, Any]:
    from digirl_lite.data.records import ScreenTable, Source
    from digirl_lite.envs.sim.env import SimEnvFactory
    from digirl_lite.harness.claw import (
        ClawConfig,
        ExperienceBank,
        FleetRunner,
        skill_rules,
        traces_from_episodes,
        write_skill_md,
    )
    from digirl_lite.harness.frozen import agent_factory, held_out_sets, measure
    from digirl_lite.harness.harness import H0_COMPONENTS
    from digirl_lite.provenance import environment
    from digirl_lite.redaction import redact
    from digirl_lite.rollout.factory import make_fleet
    from digirl_lite.train.evaluate import stage_rates

    t0 = time.time()
    held, splits, kinds = held_out_sets(cfg)
    make, make_constrained, policy_path = agent_factory(cfg)
    maker = make_constrained if cfg.constrained_decoding else make
    env, _, _ = cfg.resolved()
    fleet = make_fleet("sync", SimEnvFactory(tasks=cfg.world, ui_tree=True, **env),
                       cfg.n_envs)
    train = training_tasks(cfg.world)
    rng = random.Random(1_000 + cfg.seed)  # every cycle's sample, drawn up front: a resumed
    samples = [rng.sample(train, min(cfg.train_tasks, len(train)))  # run replays the same
               for _ in range(cfg.cycles)]
    partial, bank_file, metrics = out / "summary.partial.json", out / "bank.json", \
        out / "metrics.jsonl"
    summary: dict[str, Any] = {"kind": "claw", "config": redact(cfg.as_dict()),
                               "policy": str(policy_path), "stages": {}, "cycles": []}
    bank = ExperienceBank(ClawConfig.from_dict(cfg.claw))
    if resume and partial.is_file():
        summary = json.loads(partial.read_text())
        if bank_file.is_file():
            bank = ExperienceBank.load(bank_file)
        log(f"resuming after cycle {len(summary['cycles'])}")

    def save() -> None:
        tmp = partial.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=1, default=float))
        tmp.replace(partial)

    def line(rec: dict[str, Any]) -> None:
        with open(metrics, "a") as f:
            f.write(json.dumps({**rec, "t": time.time()}, default=float) + "\n")

    def stage(name: str, rules: str) -> None:
        if name in summary["stages"]:
            return
        comps = {**H0_COMPONENTS, "skills": rules}
        rep = measure(fleet, maker, comps, held, splits, kinds, cfg.seed)
        rep["rules"] = rules
        summary["stages"][name] = rep
        save()
        line({"stage": f"eval:{name}", "success_rate": rep["success_rate"],
              "true_success_rate": rep.get("true_success_rate"), "decided": rep["decided"]})
        log(f"{name}: {stage_rates(rep)} held-out ({rep['successes']}/"
            f"{rep['judged_episodes']}), steps decided by units "
            f"{100 * rep['decided']['rule']:.1f}%"
            + "".join(f"; {sp} {stage_rates(r)}" for sp, r in rep.get("splits", {}).items()))

    (out / "checkpoints").mkdir(exist_ok=True)  # what a grid's runner resumes by
    (out / "checkpoints" / "latest").write_text("summary.partial.json\n")
    try:
        stage("frozen", "")
        triage = make_triage(cfg.triage, cfg.triage_backend)
        for c in range(len(summary["cycles"]) + 1, cfg.cycles + 1):
            seed = 50_000 + 10_000 * cfg.seed + 100 * c
            rules = skill_rules(bank)
            screens = ScreenTable()
            agent = maker({**H0_COMPONENTS, "skills": rules}, screens)
            agent.crn_salt = seed
            eps = fleet.collect(agent, samples[c - 1], screens, id_prefix=f"claw-c{c}",
                                seed=seed, source=Source.ONLINE, iteration=c)
            traces = traces_from_episodes(eps)
            runner = FleetRunner(fleet, lambda sc: maker(dict(H0_COMPONENTS), sc).agent,
                                 id_prefix=f"val-c{c}", crn_salt=seed)
            rep = bank.cycle(traces, runner, [(t.task, t.seed) for t in traces], triage)
            rec = {"cycle": c, "rules_in_collection": rules,
                   **cycle_record(rep, traces, bank, runner)}
            bank.save(bank_file)
            write_skill_md(bank, out / "skills")
            summary["cycles"].append(rec)
            save()
            line({"stage": "cycle", **{k: rec[k] for k in (
                "cycle", "collected", "collected_successes", "promoted", "evicted")},
                "active": [u["id"] for u in rec["active_after"]]})
            log(f"cycle {c}: {rec['collected_successes']}/{rec['collected']} solved; "
                f"promoted {rec['promoted']}, evicted {[e['eu'] for e in rec['evicted']]}, "
                f"active {[u['id'] for u in rec['active_after']]}")
        stage("claw", skill_rules(bank))
    finally:
        fleet.close()
    f_pt = summary["stages"]["frozen"]["per_task"]
    c_pt = summary["stages"]["claw"]["per_task"]
    summary["claw"] = {
        "active": units_record(bank),
        "held_out_lost": sorted(t for t, v in f_pt.items() if v and c_pt.get(t) is False),
        "held_out_gained": sorted(t for t, v in c_pt.items() if v and f_pt.get(t) is False),
        "same_as_frozen": not summary["stages"]["claw"]["rules"].strip(),
    }
    summary["wall_s"] = round(time.time() - t0, 1) + summary.get("wall_s", 0.0)
    summary["environment"] = environment()
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    partial.unlink(missing_ok=True)
    return summary
