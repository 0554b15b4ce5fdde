"""E3 of issue 30: what Darwin-Claw's experience units, DigiRL online, and both together
keep of the shipped policy under drift.

The shipped Web Shopping starting policy with grammar-constrained decoding (the setting of
``benchmarks/grids/drift_webshop_constrained.json``, where the frozen policy falls to 0% by
day 6) on simulated drift days d (default 1, 2, 3, 4, 6, 8). Four arms, all starting from
that policy:

- ``frozen``: the policy alone (the H0 harness, no rules);
- ``claw``: the frozen policy in H0 plus the skills of its experience bank's active units
  (:func:`~digirl_lite.harness.claw.skill_rules`);
- ``digirl``: the policy learning online with DigiRL (its own
  :class:`~digirl_lite.train.trainer.Trainer`, the main job's settings: critics, the
  paper's filters, 20 actor updates per iteration), one online iteration a day on that
  day's trajectories, no offline phase (the critics start from their initial values);
- ``both``: DigiRL online as ``digirl``, with a Darwin-Claw bank around the learning
  policy: the library's ``claw`` option (:class:`~digirl_lite.train.claw.ClawLoop`, the
  trainer's own bank and cycle): the day's trajectories train the policy and feed the
  bank's cycle, whose units are validated with the updated policy. Its policy is also
  evaluated with its units off (``both_units_off``, issue 48 item 5): units at evaluation
  apart from units in collection.

On each day, for each arm:

1. **Held-out evaluation** (pass@1 on the first ``--n-test`` ``webshop_test`` tasks, one
   episode each, env seed ``10_000 + 10_000 * seed + 100 * d``, the same CRN salt for every
   arm). With no active unit the ``claw`` arm *is* H0 on the frozen policy with the same
   seeds and salt (identical episodes), so the frozen arm's record is reused
   (``same_as_frozen``).
2. **The day's experience** (every arm but ``frozen``): the arm's agent plays the day's
   sample of ``--n-train`` training tasks (the ``webshop`` train list minus the test tasks;
   the same tasks, env seeds and salt for every arm); ``digirl`` and ``both`` take one
   online iteration on them (:meth:`Trainer.online_iteration`); ``claw`` and ``both`` run
   the bank's cycle on them: :class:`~digirl_lite.harness.claw.ScriptedTriage` turns the
   traces into units, :meth:`ExperienceBank.cycle` validates every live unit causally (the
   same training tasks and seeds with and without it, the same CRN salt, through
   :class:`~digirl_lite.harness.claw.FleetRunner`) and applies promotion (e > 0 into a slot
   by S), eviction (persistently negative e, TTL) and the nursery's TTL. What is learned on
   day d acts from the next evaluated day on.

Per day and arm the result holds the success rate, its Wilson 95% interval, successes /
judged, who decided the steps (:func:`decision_shares`), the active units (id, S, e, c), what
the cycle did and the DigiRL iteration's metrics. ``--seed`` changes the training-task sample,
every env seed and the learning arms' seeds (the tasks evaluated stay the first N test tasks).

Run (CPU, about 30-40 minutes a seed on one core)::

    OMP_NUM_THREADS=1 python benchmarks/claw_drift.py --seeds 0 1 2 \\
        --out benchmarks/results/harness/claw_drift.json

or one process per seed (``--seeds 0 --out s0.json`` ...) and then
``--merge s0.json s1.json s2.json --out .../claw_drift.json [--findings notes.md]``.

It writes ``claw_drift.json`` (everything, the command and the git commit) and
``claw_drift.md`` (a table day x arm) next to it, after every day (a killed run keeps the
days it finished).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _git_commit() -> str:
    try:
        sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                                "digirl_lite", "benchmarks/claw_drift.py"],
                               capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except Exception:  # noqa: BLE001 - not a checkout
        return "unknown"


ARMS = ("frozen", "claw", "digirl", "both")


class Setup:
    """The shipped policy (loaded once, frozen) and its feature cache."""

    def __init__(self, temperature: float) -> None:
        from digirl_lite.paths import data_dir
        from digirl_lite.policy.factory import load_policy
        from digirl_lite.vision import FeatureCache, SimScreenEncoder

        self.path = data_dir() / "policies" / "sft-webshop"
        self.policy = load_policy(self.path)
        self.features = FeatureCache(SimScreenEncoder(dim=self.policy.img_dim, seed=0))
        self.temperature = temperature


class Arm:
    """One arm's agent: a policy (the frozen one, or a learning arm's own
    :class:`~digirl_lite.train.trainer.Trainer`'s) and, for ``claw`` and ``both``, an
    experience bank whose active units' skills the harness around the policy carries."""

    def __init__(self, name: str, setup: Setup, seed: int, work: Path) -> None:
        from digirl_lite.harness.claw import ClawConfig, ExperienceBank

        self.name, self.setup = name, setup
        self._bank = ExperienceBank(ClawConfig()) if name == "claw" else None
        self.trainer = None
        if name in ("digirl", "both"):
            from digirl_lite.train.config import sim_webshop
            from digirl_lite.train.trainer import Trainer

            # the main job's DigiRL settings, from the same shipped policy as the frozen arm,
            # no offline phase: the critics start from their initial values and learn from
            # the days' trajectories only (the same data the claw arm learns from)
            # both: the trainer's own experience bank (``claw``: its cycle, validated with
            # the updated policy) around the learning policy
            both = {"claw": True, "ui_tree": True} if name == "both" else {}
            cfg = sim_webshop(starting_policy=str(setup.path), constrained_decoding=True,
                              temperature=setup.temperature, seed=seed, n_envs=2,
                              eval_every=0, **both)
            self.trainer = Trainer(cfg, work / f"{name}-seed{seed}", cache_dir=None,
                                   progress=False)
        self.policy = self.trainer.policy if self.trainer else setup.policy
        self.features = self.trainer.features if self.trainer else setup.features
        self.updates = 0

    @property
    def bank(self) -> Any:
        """The arm's experience bank: its own (``claw``) or its trainer's (``both``)."""
        if self.trainer is not None and self.trainer.claw is not None:
            return self.trainer.claw.bank
        return self._bank

    def rules(self) -> str:
        from digirl_lite.harness.claw import skill_rules

        return skill_rules(self.bank) if self.bank is not None else ""

    def policy_agent(self, screens: Any) -> Any:
        from digirl_lite.harness.harness import PolicyAgent

        return PolicyAgent(self.policy, self.features, screens, self.setup.temperature,
                           constrained=True)

    def agent(self, rules_text: str, screens: Any, salt: int) -> Any:
        from digirl_lite.harness.harness import H0_COMPONENTS, HarnessAgent

        comps = dict(H0_COMPONENTS)
        comps["skills"] = rules_text
        a = HarnessAgent(comps, self.policy_agent(screens), where=f"claw_drift {self.name}")
        a.crn_salt = salt
        return a

    def update(self, episodes: list[Any], seed: int, day: int) -> dict[str, Any]:
        """One DigiRL online iteration (critics, filters, actor) on the day's trajectories,
        collected into the trainer's own screen table."""
        import torch

        self.updates += 1
        torch.manual_seed(7_000_000 + 10_000 * seed + day)  # both learning arms alike
        self.trainer.features.fill(self.trainer.screens)
        self.trainer.online_iteration(self.updates, collected=[e.trajectory for e in episodes])
        last = (self.trainer.out / "metrics.jsonl").read_text().strip().splitlines()[-1]
        rec = json.loads(last)
        return {k: v for k, v in rec.items() if k != "time"}


def held_out(arm: Arm, fleet: Any, rules_text: str, tasks: list[str], seed: int
             ) -> dict[str, Any]:
    import torch

    from digirl_lite.data.records import ScreenTable
    from digirl_lite.harness.harness import decision_shares
    from digirl_lite.train.evaluate import evaluate

    screens = ScreenTable()
    torch.manual_seed(seed)
    agent = arm.agent(rules_text, screens, seed)
    summary, episodes = evaluate(fleet, agent, tasks, seed=seed, screens=screens, n_tasks=None)
    hits: dict[str, int] = {}
    for e in episodes:
        for s in e.trajectory.steps:
            by = s.decided_by or "agent"
            if by.startswith("rule:"):
                hits[by[len("rule:"):]] = hits.get(by[len("rule:"):], 0) + 1
    keep = ("success_rate", "ci95", "successes", "judged_episodes", "episodes",
            "invalid_step_rate", "mean_length", "failure_kinds", "complete")
    rec = {k: summary[k] for k in keep}
    rec["decided"] = decision_shares([e.trajectory for e in episodes])
    rec["rule_steps"] = hits
    rec["per_task"] = {e.trajectory.task: (None if not e.trajectory.is_usable
                                           else bool(e.trajectory.is_success))
                       for e in episodes}
    return rec


def _cycle(arm: Arm, fleet: Any, eps: list[Any], salt: int, day: int) -> dict[str, Any]:
    """The day's Darwin-Claw cycle of ``arm``'s bank on its collected episodes, validated
    with ``arm``'s policy as it stands now (after the day's update, for ``both``: the
    trainer's own cycle, :meth:`~digirl_lite.train.claw.ClawLoop.cycle`)."""
    from digirl_lite.harness.claw import FleetRunner, ScriptedTriage, traces_from_episodes
    from digirl_lite.harness.claw.bank import cycle_record

    if arm.trainer is not None and arm.trainer.claw is not None:
        rec = arm.trainer.claw.cycle(eps, fleet, salt=salt, iteration=arm.updates)
        return {k: v for k, v in rec.items() if k != "iteration"}
    traces = traces_from_episodes(eps)
    runner = FleetRunner(fleet, arm.policy_agent, id_prefix=f"val-{arm.name}-d{day}",
                         crn_salt=salt)
    rep = arm.bank.cycle(traces, runner, [(t.task, t.seed) for t in traces],
                         ScriptedTriage())
    return cycle_record(rep, traces, arm.bank, runner)


def run_seed(args: argparse.Namespace, seed: int, setup: Setup, train: list[str],
             test: list[str], log) -> Iterator[dict[str, Any]]:
    from digirl_lite.data.records import ScreenTable, Source
    from digirl_lite.envs.sim.env import SimEnvFactory
    from digirl_lite.harness.claw.bank import units_record
    from digirl_lite.rollout.factory import make_fleet

    work = Path(args.work) / f"seed{seed}"
    arms = {name: Arm(name, setup, seed, work) for name in ARMS if name in args.arms}
    rng = random.Random(1_000 + seed)
    for d in args.days:
        t0 = time.time()
        fleet = make_fleet("sync", SimEnvFactory(tasks="webshop", ui_tree=True, day=d),
                           args.n_envs)
        ev_seed = 10_000 + 10_000 * seed + 100 * d
        col_seed = 50_000 + 10_000 * seed + 100 * d
        sample = rng.sample(train, args.n_train)  # the day's training tasks, every arm's
        day: dict[str, Any] = {"day": d, "eval_seed": ev_seed, "collect_seed": col_seed,
                               "train_tasks": sample, "arms": {}, "rules_at_eval": {},
                               "active_at_eval": {}, "cycles": {}, "updates": {},
                               "wall_s": {}}
        for name, arm in arms.items():
            ta = time.time()
            rules = arm.rules()
            day["rules_at_eval"][name] = rules
            if arm.bank is not None:
                day["active_at_eval"][name] = units_record(arm.bank)
            if name == "claw" and not rules.strip() and "frozen" in day["arms"]:
                # no active unit: the claw arm is H0 on the frozen policy, the same seeds and
                # salt: the frozen arm's episodes
                day["arms"][name] = dict(day["arms"]["frozen"], same_as_frozen=True)
            else:
                day["arms"][name] = held_out(arm, fleet, rules, test, ev_seed)
            if name == "both":  # the learned policy without its units (issue 48, item 5):
                # what the units add at evaluation, apart from what they added in collection
                day["both_units_off"] = (held_out(arm, fleet, "", test, ev_seed)
                                         if rules.strip() else
                                         dict(day["arms"][name], same_as_with_units=True))
            if name != "frozen":  # the day's experience: the training tasks, the same seeds
                screens = arm.trainer.screens if arm.trainer else ScreenTable()
                eps = fleet.collect(arm.agent(rules, screens, col_seed), sample, screens,
                                    id_prefix=f"{name}-day{d}", seed=col_seed,
                                    source=Source.ONLINE, iteration=arm.updates + 1)
                if arm.trainer is not None:
                    day["updates"][name] = arm.update(eps, seed, d)
                if arm.bank is not None:
                    day["cycles"][name] = _cycle(arm, fleet, eps, col_seed, d)
            day["wall_s"][name] = round(time.time() - ta, 1)
        day["wall_s"]["day"] = round(time.time() - t0, 1)
        msg = ", ".join(f"{n} {r['successes']}/{r['judged_episodes']}"
                        for n, r in day["arms"].items())
        for n, cy in day["cycles"].items():
            msg += (f"; {n} cycle: promoted {cy['promoted']}, evicted "
                    f"{[e['eu'] for e in cy['evicted']]}, active "
                    f"{[u['id'] for u in cy['active_after']]}")
        log(f"seed {seed} day {d}: {msg}; {day['wall_s']['day']:.0f}s")
        yield day


def _fmt_rate(r: dict[str, Any]) -> str:
    lo, hi = r["ci95"]
    return (f"{100 * r['success_rate']:.1f}% [{100 * lo:.0f}, {100 * hi:.0f}] "
            f"({r['successes']}/{r['judged_episodes']})")


def _n(x: Any, fmt: str = ".2f") -> str:
    return "-" if x is None else format(float(x), fmt)


def write_md(res: dict[str, Any], path: Path, findings: str = "") -> None:
    arms = list(res["args"].get("arms", ARMS))
    lines = ["# E3: Darwin-Claw experience units and DigiRL online under drift (issue 30)", "",
             f"The shipped Web Shopping policy, grammar-constrained decoding; arms: "
             f"{', '.join(arms)}. Pass@1 on the first {res['args']['n_test']} test tasks per "
             f"day, every arm on the same env seeds and CRN salt; Wilson 95% intervals. "
             f"Command: `{res['command']}`; code at commit `{res['commit']}`.", ""]
    off = "both" in arms and any("both_units_off" in d for s in res["seeds"]
                                 for d in s["days"])
    head = (["day"] + arms + (["both, units off at evaluation"] if off else [])
            + [f"{a}: steps by rules" for a in arms if a in ("claw", "both")]
            + [f"{a}: active units at eval (S, e, c)" for a in arms if a in ("claw", "both")]
            + [f"{a}: promoted / evicted" for a in arms if a in ("claw", "both")]
            + [f"{a}: collected successes" for a in arms if a in ("digirl", "both")])
    for s in res["seeds"]:
        lines += [f"## seed {s['seed']}", "", "| " + " | ".join(head) + " |",
                  "|" + "---|" * len(head)]
        for d in s["days"]:
            row = [str(d["day"])]
            for a in arms:
                r = d["arms"][a]
                row.append(_fmt_rate(r) + (" (= frozen)" if r.get("same_as_frozen") else ""))
            if off:
                r = d.get("both_units_off")
                row.append("-" if r is None else _fmt_rate(r) + (
                    " (no unit active)" if r.get("same_as_with_units") else ""))
            for a in arms:
                if a in ("claw", "both"):
                    row.append(f"{100 * d['arms'][a]['decided']['rule']:.1f}%")
            for a in arms:
                if a in ("claw", "both"):
                    row.append(", ".join(
                        f"{u['id']} ({_n(u['S'])}, {_n(u['e'], '+.2f')}, {_n(u['c'])})"
                        for u in d["active_at_eval"][a]) or "none")
            for a in arms:
                if a in ("claw", "both"):
                    cy = d["cycles"][a]
                    ev = ", ".join(e["eu"] for e in cy["evicted"]) or "-"
                    row.append(f"{', '.join(cy['promoted']) or '-'} / {ev}")
            for a in arms:
                if a in ("digirl", "both"):
                    u = d["updates"][a]
                    row.append(f"{round(u.get('collect_success', 0) * res['args']['n_train'])}"
                               f"/{res['args']['n_train']}")
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    if len(res["seeds"]) > 1:
        from digirl_lite.judge.calibration import wilson_interval

        lines += ["## pooled over seeds", "", "| day | " + " | ".join(arms) + " |",
                  "|---|" + "---|" * len(arms)]
        days = [d["day"] for d in res["seeds"][0]["days"]]
        for i, day in enumerate(days):
            row = [str(day)]
            for arm in arms:
                ds = [s["days"][i] for s in res["seeds"] if len(s["days"]) > i]
                k = sum(d["arms"][arm]["successes"] for d in ds)
                n = sum(d["arms"][arm]["judged_episodes"] for d in ds)
                lo, hi = wilson_interval(k, n)
                row.append(f"{100 * k / n:.1f}% [{100 * lo:.0f}, {100 * hi:.0f}] ({k}/{n})"
                           if n else "-")
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    if findings:
        lines += ["## findings", "", findings.strip(), ""]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--days", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--n-test", type=int, default=48, help="held-out test tasks per day")
    p.add_argument("--n-train", type=int, default=20, help="training tasks per day's cycle")
    p.add_argument("--n-envs", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--work", default="runs/claw_drift",
                   help="the learning arms' run folders (metrics.jsonl, checkpoints)")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/harness/claw_drift.json"))
    p.add_argument("--findings", default="", help="a file whose text is the md's findings")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="no run: merge these results (one seed or more each, e.g. seeds run "
                        "as parallel processes) into --out and its .md")
    args = p.parse_args(argv)
    findings = Path(args.findings).read_text() if args.findings else ""
    if args.merge:
        parts = [json.loads(Path(f).read_text()) for f in args.merge]
        res = dict(parts[0])
        res["seeds"] = sorted((s for r in parts for s in r["seeds"]), key=lambda s: s["seed"])
        res["merged_from"] = [{"file": f, "command": r["command"], "commit": r["commit"],
                               "wall_s": r.get("wall_s")} for f, r in zip(args.merge, parts)]
        res["args"] = dict(parts[0]["args"], seeds=[s["seed"] for s in res["seeds"]])
        out = Path(args.out)
        out.write_text(json.dumps(res, indent=1, default=float) + "\n")
        write_md(res, out.with_suffix(".md"), findings)
        return 0

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from digirl_lite.envs.sim.env import SimPhoneEnv

    test_all = [t.text for t in SimPhoneEnv._load_task_list("webshop_test")]
    test = test_all[:args.n_test]
    held = set(test_all)
    train = [t.text for t in SimPhoneEnv._load_task_list("webshop") if t.text not in held]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    setup = Setup(args.temperature)
    res: dict[str, Any] = {
        "kind": "claw_drift", "issue": "30, item 5, E3",
        "command": "OMP_NUM_THREADS=1 python benchmarks/claw_drift.py " + " ".join(
            a for a in (argv if argv is not None else sys.argv[1:])),
        "commit": _git_commit(), "policy": str(setup.path), "constrained": True,
        "args": vars(args), "n_train_pool": len(train), "test_tasks": test, "seeds": [],
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    t_all = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t_all:6.0f}s] {msg}", flush=True)

    for seed in args.seeds:
        srec: dict[str, Any] = {"seed": seed, "days": []}
        res["seeds"].append(srec)
        t_seed = time.time()
        for day in run_seed(args, seed, setup, train, test, log):
            srec["days"].append(day)
            srec["wall_s"] = round(time.time() - t_seed, 1)
            res["wall_s"] = round(time.time() - t_all, 1)
            out.write_text(json.dumps(res, indent=1, default=float) + "\n")
            write_md(res, out.with_suffix(".md"), findings)
    res["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out.write_text(json.dumps(res, indent=1, default=float) + "\n")
    write_md(res, out.with_suffix(".md"), findings)
    log(f"done: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
