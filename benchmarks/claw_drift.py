"""E3 of issue 30: what Darwin-Claw's experience units keep of a frozen policy under drift.

The shipped Web Shopping starting policy, FROZEN, with grammar-constrained decoding
(``PolicyAgent(..., constrained=True)``; the setting of ``benchmarks/grids/
drift_webshop_constrained.json``, where the frozen policy falls to 0% by day 6), is run on
simulated drift days d (default 1, 2, 3, 4, 6, 8). On each day:

1. **Held-out evaluation** (pass@1 on the first ``--n-test`` ``webshop_test`` tasks, one
   episode each, env seed ``10_000 + 10_000 * seed + 100 * d``, the same CRN salt for both
   arms), two arms:

   - ``frozen``: the H0 harness (no rules): the policy alone;
   - ``claw``: H0 plus the skills of the experience bank's active units
     (:func:`~digirl_lite.harness.claw.skill_rules`) as they stand at the start of the day.
     With no active unit the arm *is* H0 on the same seeds and salt (identical episodes),
     so the frozen arm's record is reused and marked ``same_as_frozen``.

2. **The day's Darwin-Claw cycle** (after the evaluation: units learned on day d act from
   the next evaluated day on): the claw harness plays a fresh sample of ``--n-train``
   training tasks (the ``webshop`` train list minus the test tasks) on that day's phones;
   :class:`~digirl_lite.harness.claw.ScriptedTriage` turns the traces into units;
   :meth:`ExperienceBank.cycle` validates every live unit causally (the same training tasks
   and seeds, H0 without it and H0 with it alone, the same CRN salt) and applies promotion
   (e > 0 into a slot by S), eviction (persistently negative e, TTL) and the nursery's TTL.

Per day and arm the result holds the success rate, its Wilson 95% interval, successes /
judged, who decided the steps (:func:`decision_shares`), the active units (id, S, e, c) and
what the cycle did (admitted, promoted, evicted, validations). ``--seed`` changes the
training-task sample and every env seed (the tasks evaluated stay the first N test tasks).

Run (CPU, about 10-25 minutes a seed on two busy cores)::

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


class Setup:
    """The frozen policy (loaded once) and the agents built around it."""

    def __init__(self, temperature: float) -> None:
        from digirl_lite.paths import data_dir
        from digirl_lite.policy.factory import load_policy
        from digirl_lite.vision import FeatureCache, SimScreenEncoder

        self.path = data_dir() / "policies" / "sft-webshop"
        self.policy = load_policy(self.path)
        self.features = FeatureCache(SimScreenEncoder(dim=self.policy.img_dim, seed=0))
        self.temperature = temperature

    def agent(self, rules_text: str, screens: Any, salt: int) -> Any:
        from digirl_lite.harness.harness import H0_COMPONENTS, HarnessAgent, PolicyAgent

        comps = dict(H0_COMPONENTS)
        comps["skills"] = rules_text
        a = HarnessAgent(comps, PolicyAgent(self.policy, self.features, screens,
                                            self.temperature, constrained=True),
                         where="claw_drift")
        a.crn_salt = salt
        return a


class DayRunner:
    """A Darwin-Claw :data:`~digirl_lite.harness.claw.Runner` on one day's phones: H0 plus
    ``extra_rules_text`` around the frozen constrained policy, every call with the same CRN
    salt (so a run with a unit and one without draw the same noise where they see the same
    screen); each (task, seed) one episode at that env seed."""

    def __init__(self, setup: Setup, fleet: Any, salt: int) -> None:
        self.setup, self.fleet, self.salt = setup, fleet, salt
        self.calls = self.episodes = 0

    def __call__(self, extra_rules_text: str, tasks_seeds):
        from digirl_lite.data.records import ScreenTable
        from digirl_lite.harness.claw import outcomes_from_episodes

        runs: list[list[tuple[str, int]]] = []
        for t, s in tasks_seeds:
            if runs and runs[-1][-1][1] + 1 == s:
                runs[-1].append((t, s))
            else:
                runs.append([(t, s)])
        out = []
        for k, run in enumerate(runs):
            screens = ScreenTable()
            agent = self.setup.agent(extra_rules_text.strip(), screens, self.salt)
            eps = self.fleet.collect(agent, [t for t, _ in run], screens,
                                     id_prefix=f"val-{self.calls}-{k}", seed=run[0][1])
            out += outcomes_from_episodes(eps)
        self.calls += 1
        self.episodes += len(out)
        return out


def held_out(setup: Setup, fleet: Any, rules_text: str, tasks: list[str], seed: int
             ) -> dict[str, Any]:
    import torch

    from digirl_lite.data.records import ScreenTable
    from digirl_lite.harness.harness import decision_shares
    from digirl_lite.train.evaluate import evaluate

    screens = ScreenTable()
    torch.manual_seed(seed)
    agent = setup.agent(rules_text, screens, seed)
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


def _units(bank: Any, state: str) -> list[dict[str, Any]]:
    us = bank.active() if state == "active" else bank.nursery()
    return [{"id": u.id, "subtype": u.subtype, "trigger": u.trigger, "strategy": u.strategy,
             "S": u.S, "e": u.e, "c": u.c, "eta": u.eta, "born": u.born} for u in us]


def run_seed(args: argparse.Namespace, seed: int, setup: Setup, train: list[str],
             test: list[str], log) -> Iterator[dict[str, Any]]:
    from digirl_lite.data.records import ScreenTable
    from digirl_lite.envs.sim.env import SimEnvFactory
    from digirl_lite.harness.claw import (
        ClawConfig,
        ExperienceBank,
        ScriptedTriage,
        skill_rules,
        traces_from_episodes,
    )
    from digirl_lite.rollout.factory import make_fleet

    bank = ExperienceBank(ClawConfig())
    rng = random.Random(1_000 + seed)
    days_out: list[dict[str, Any]] = []
    for d in args.days:
        t0 = time.time()
        fleet = make_fleet("sync", SimEnvFactory(tasks="webshop", ui_tree=True, day=d),
                           args.n_envs)
        ev_seed = 10_000 + 10_000 * seed + 100 * d
        rules = skill_rules(bank)
        active_at_eval = _units(bank, "active")
        frozen = held_out(setup, fleet, "", test, ev_seed)
        if rules.strip():
            claw = held_out(setup, fleet, rules, test, ev_seed)
            claw["same_as_frozen"] = False
        else:
            claw = dict(frozen, same_as_frozen=True)
        t_eval = time.time() - t0
        # the day's cycle, on training tasks
        sample = rng.sample(train, args.n_train)
        col_seed = 50_000 + 10_000 * seed + 100 * d
        screens = ScreenTable()
        eps = fleet.collect(setup.agent(rules, screens, col_seed), sample, screens,
                            id_prefix=f"day{d}", seed=col_seed)
        traces = traces_from_episodes(eps)
        runner = DayRunner(setup, fleet, col_seed)
        rep = bank.cycle(traces, runner, [(t.task, t.seed) for t in traces],
                         ScriptedTriage())
        ev = rep["events"]
        cycle = {
            "collected": len(traces), "collected_successes": sum(t.success for t in traces),
            "triage": {"kept": rep["triage"].get("kept", {}),
                       "discarded": len(rep["triage"].get("discarded", {}))},
            "admitted": rep["admitted"], "merged": rep["merged"], "archived": rep["archived"],
            "refused": rep["refused"], "errors": rep["errors"],
            "promoted": [e["eu"] for e in ev if e["event"] == "promoted"],
            "evicted": [{"eu": e["eu"], "why": e["why"]} for e in ev if e["event"] == "evicted"],
            "events": ev, "validations": rep["validations"],
            "runner_calls": runner.calls, "runner_episodes": runner.episodes,
            "active_after": _units(bank, "active"), "nursery_after": _units(bank, "nursery"),
        }
        dt = time.time() - t0
        days_out.append({"day": d, "eval_seed": ev_seed, "collect_seed": col_seed,
                         "train_tasks": sample, "rules_at_eval": rules,
                         "active_at_eval": active_at_eval,
                         "arms": {"frozen": frozen, "claw": claw}, "cycle": cycle,
                         "wall_s": {"eval": round(t_eval, 1), "day": round(dt, 1)}})
        log(f"seed {seed} day {d}: frozen {frozen['successes']}/{frozen['judged_episodes']}, "
            f"claw {claw['successes']}/{claw['judged_episodes']} (rule steps "
            f"{100 * claw['decided']['rule']:.1f}%); cycle: admitted {rep['admitted']}, "
            f"promoted {cycle['promoted']}, evicted {[e['eu'] for e in cycle['evicted']]}, "
            f"active {[u['id'] for u in cycle['active_after']]}; {dt:.0f}s "
            f"(eval {t_eval:.0f}s, {runner.episodes} validation episodes)")
        yield days_out[-1]


def _fmt_rate(r: dict[str, Any]) -> str:
    lo, hi = r["ci95"]
    return (f"{100 * r['success_rate']:.1f}% [{100 * lo:.0f}, {100 * hi:.0f}] "
            f"({r['successes']}/{r['judged_episodes']})")


def _n(x: Any, fmt: str = ".2f") -> str:
    return "-" if x is None else format(float(x), fmt)


def write_md(res: dict[str, Any], path: Path, findings: str = "") -> None:
    lines = ["# E3: Darwin-Claw experience units under drift (issue 30)", "",
             f"Frozen shipped Web Shopping policy, grammar-constrained decoding; pass@1 on the "
             f"first {res['args']['n_test']} test tasks per day; Wilson 95% intervals. "
             f"Command: `{res['command']}`; code at commit `{res['commit']}`.", ""]
    for s in res["seeds"]:
        lines += [f"## seed {s['seed']}", "",
                  "| day | frozen | claw | claw steps by rules | active units at eval "
                  "(S, e, c) | cycle: promoted / evicted | cycle: e of each unit validated |",
                  "|---|---|---|---|---|---|---|"]
        for d in s["days"]:
            fr, cl = d["arms"]["frozen"], d["arms"]["claw"]
            act = ", ".join(f"{u['id']} ({_n(u['S'])}, {_n(u['e'], '+.2f')}, {_n(u['c'])})"
                            for u in d["active_at_eval"]) or "none"
            cy = d["cycle"]
            ev = ", ".join(e["eu"] for e in cy["evicted"]) or "-"
            lines.append(f"| {d['day']} | {_fmt_rate(fr)} | {_fmt_rate(cl)}"
                         f"{' (= frozen)' if cl.get('same_as_frozen') else ''} | "
                         f"{100 * cl['decided']['rule']:.1f}% | {act} | "
                         f"{', '.join(cy['promoted']) or '-'} / {ev} | " + (", ".join(
                             f"{k} {_n(v['e'], '+.2f')} ({v['pairs']})" if v["relevant"]
                             else f"{k} n/r" for k, v in cy["validations"].items()) or "-")
                         + " |")
        lines.append("")
    if len(res["seeds"]) > 1:
        lines += ["## pooled over seeds", "", "| day | frozen | claw |", "|---|---|---|"]
        from digirl_lite.judge.calibration import wilson_interval

        days = [d["day"] for d in res["seeds"][0]["days"]]
        for i, day in enumerate(days):
            row = [str(day)]
            for arm in ("frozen", "claw"):
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
