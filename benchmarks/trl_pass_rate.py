"""How often a TRL-trained tool-calling model solves its own training tasks when it samples
(issue 51): K episodes at temperature 1 of each of the first N train tasks in the GRPO
recipe's order (``task_dataset(world, n=N, seed=SEED)``), and how many tasks it solves
sometimes but not always, the only ones whose GRPO groups have an advantage to learn from
(``recipes/trl_grpo.py --grpo-filter`` keeps those).

    python benchmarks/trl_pass_rate.py runs/p51_gen/sft general 48 4 100

Prints a JSON summary (success rate, valid tool calls, tasks with spread, failure causes).
"""
from __future__ import annotations

import argparse
import collections
import json
import time


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a tool-calling model directory (e.g. a run's sft/)")
    ap.add_argument("world", choices=["webshop", "general"])
    ap.add_argument("tasks", type=int, help="the first N train tasks in GRPO's order")
    ap.add_argument("k", type=int, help="sampled episodes per task")
    ap.add_argument("seed", type=int, help="the recipe's --seed (orders the tasks)")
    ap.add_argument("--max-nodes", type=int, default=20)
    args = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from digirl_lite.envs.sim.env import SimEnvFactory
    from digirl_lite.envs.sim.trl_tools import task_dataset
    from digirl_lite.envs.sim.trl_warmup import ToolCallAgent, check_tool_template
    from digirl_lite.rollout.fleet import SyncFleet
    from digirl_lite.train.evaluate import evaluate

    tok = check_tool_template(AutoTokenizer.from_pretrained(args.model))
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    tasks = task_dataset(args.world, n=args.tasks, seed=args.seed)["task"]
    fleet = SyncFleet(SimEnvFactory(seed=args.seed, tasks=args.world, ui_tree=True), n_envs=8,
                      backend="local", parallel_steps=False)
    agent = ToolCallAgent(model, tok, max_nodes=args.max_nodes, sample=True)
    t0 = time.time()
    try:
        report, episodes = evaluate(fleet, agent, [t for t in tasks for _ in range(args.k)],
                                    seed=20_000 + args.seed, n_tasks=None)
    finally:
        fleet.close()
    wins = collections.Counter(e.trajectory.task for e in episodes
                               if e.trajectory.true_success)
    spread = [t for t in tasks if 0 < wins[t] < args.k]
    out = {"success_rate": report["true_success_rate"], "episodes": len(episodes),
           "valid_tool_call_share": agent.valid_share, "seconds": round(time.time() - t0),
           "tasks_solved_sometimes": len(spread),
           "tasks_solved_always": sum(wins[t] == args.k for t in tasks),
           "tasks_solved_never": sum(wins[t] == 0 for t in tasks),
           "solved_sometimes": spread, "failure_causes": report.get("failure_causes")}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
