"""E4 of issue 30: merge two harness variants evolved on different task families.

The shipped Web Shopping starting policy, frozen. DarwinX (scripted proposer, the gate)
evolves one harness on family A (tasks that go to a site or search it: "Go to X", "Go to X,
search for Y") and another on family B ("..., and select the first entry"), both from H0,
each for ``--budget`` episodes on tasks written from the simulator's site descriptions.
Their final variants v1 and v2 are merged (H0 (+) Delta_1 (+) Delta_2,
:func:`digirl_lite.harness.darwinx.merge`) and the merged child is kept only if it solves
the union of their solved sets (avg@k >= 1/2 on each task of it, both families' evolution
tasks at fresh seeds). Held-out pass@1 on the first ``--eval-tasks`` test tasks is measured
for H0, v1, v2 and the merged child (the same seeds and sampling noise for all four).
``--teacher`` picks DarwinX's teacher (:mod:`digirl_lite.harness.teachers`); the committed
``merge_seed*.json`` ran before the option, with the simulator's expert: rerun them with
``--teacher privileged_expert``.

    python benchmarks/harness_merge.py --seed S --out benchmarks/results/harness/merge_seedS.json
    python benchmarks/harness_merge_table.py benchmarks/results/harness/merge_seed*.json
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

from digirl_lite.harness.teachers import TEACHERS

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/harness/merge_seed0.json")
    ap.add_argument("--work", default="runs/harness_merge", help="the DarwinX run folders")
    ap.add_argument("--budget", type=int, default=400)
    ap.add_argument("--tasks", type=int, default=10, help="evolution tasks per family")
    ap.add_argument("--eval-tasks", type=int, default=96)
    ap.add_argument("--k", type=int, default=3, help="avg@k of the merge check")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-envs", type=int, default=16)
    ap.add_argument("--teacher", choices=TEACHERS, default="screen",
                    help="DarwinX's teacher (privileged_expert reads the simulator's state)")
    args = ap.parse_args(argv)

    from digirl_lite.envs.sim.env import SimEnvFactory, SimPhoneEnv
    from digirl_lite.envs.sim.tasks import parse_task
    from digirl_lite.harness.darwinx import DarwinX, avg_at_k, merge, select_parent, solved_set
    from digirl_lite.harness.evolve import EvolveConfig
    from digirl_lite.harness.frozen import agent_factory, held_out
    from digirl_lite.harness.harness import Harness
    from digirl_lite.harness.proposers import ScriptedProposer
    from digirl_lite.harness.runner import HarnessRunner, evolution_tasks
    from digirl_lite.harness.teachers import make_teacher, teacher_label
    from digirl_lite.rollout.factory import make_fleet

    t0 = time.time()
    test = [t.text for t in SimPhoneEnv._load_task_list("webshop_test")]
    pool = evolution_tasks("webshop", 200, seed=args.seed, exclude=test)
    fam = {"A": [t for t in pool if parse_task(t).level in (1, 2)][:args.tasks],
           "B": [t for t in pool if parse_task(t).level == 3][:args.tasks]}
    make, _, policy = agent_factory(EvolveConfig())
    fleet = make_fleet("sync", SimEnvFactory(tasks="webshop", ui_tree=True), args.n_envs)
    teacher = make_teacher(args.teacher)
    print(f"E4 merge, seed {args.seed}: {teacher_label(args.teacher)}", flush=True)
    work = ROOT / args.work
    variants, solved, runs = {}, {}, {}
    for name, tasks in fam.items():
        out = work / f"family_{name}"
        runner = HarnessRunner(make, fleet, out / "episodes.jsonl", teacher)
        dx = DarwinX(runner, ScriptedProposer(), tasks, out, budget=args.budget,
                     delta=1.0, beta=0.2, seed=args.seed)
        archive = dx.run()
        best = select_parent(archive, 0.0, random.Random(0))
        variants[name] = Harness.from_dict(best.harness)
        solved[name] = {t for t, p in (best.confirm or {}).items() if p >= 0.5}
        root = archive.nodes[0]
        runs[name] = {"tasks": tasks, "best": best.id, "G": best.G,
                      "generations": len(archive.nodes) - 1,
                      "accepted": sum(n.accepted for n in archive.nodes[1:]),
                      "episodes": dx.episodes, "stopped": dx.stopped,
                      "edits": [e.as_dict() for e in variants[name].edits],
                      "solved": sorted(solved[name]),
                      "root_solved": sorted(solved_set(root.confirm or {}))}
        print(f"family {name}: {runs[name]['generations']} generations, best {best.id} "
              f"(G {best.G:+.2f}), solves {len(solved[name])}/{len(tasks)}", flush=True)
    union_tasks = fam["A"] + fam["B"]
    runner = HarnessRunner(make, fleet, work / "merge_episodes.jsonl", None)
    result = merge(runner, [variants["A"], variants["B"]], union_tasks,
                   [solved["A"], solved["B"]], k=args.k, seed=7_000_000 + args.seed)
    # each parent on the other family at the same fresh seeds: what the merge adds
    cross = {}
    for name, v in variants.items():
        outs = []
        for j in range(args.k):
            outs += runner.run(v.components, union_tasks, 7_000_000 + args.seed + 1000 * j)
        cross[name] = sorted(solved_set(avg_at_k(outs)))
    held = {}
    held_tasks = test[:args.eval_tasks]
    for name, comps in [("H0", Harness().components), ("v1_family_A",
                                                        variants["A"].components),
                        ("v2_family_B", variants["B"].components)] + (
            [("merged", Harness.from_dict(result["child"]).components)]
            if result.get("child") else []):
        rep = held_out(fleet, make, comps, held_tasks, 20_000 + args.seed)
        held[name] = {k: rep[k] for k in ("success_rate", "ci95", "successes",
                                          "judged_episodes", "decided")}
        print(f"held-out {name}: {100 * rep['success_rate']:.1f}%", flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "digirl_lite",
                                 "benchmarks/harness_merge.py"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip())
    record = {"command": "python benchmarks/harness_merge.py " + " ".join(argv or sys.argv[1:]),
              "git": {"commit": commit, "dirty": dirty}, "policy": policy,
              "teacher": args.teacher, "families": runs,
              "merge": {k: v for k, v in result.items() if k != "child"},
              "merged_edits": (result["child"] or {}).get("edits"),
              "parents_on_the_union": cross, "held_out": held,
              "wall_s": round(time.time() - t0, 1)}
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, default=float))
    print(f"merged child kept: {result['kept']} ({result['reason']}); wrote {out}")
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
