"""How often a TRL-trained tool-calling model solves its own training tasks when it samples
(issue 51): K episodes at temperature 1 of each of the first N train tasks in the GRPO
recipe's order (``task_dataset(world, n=N, seed=SEED)``), and how many tasks it solves
sometimes but not always, the only ones whose GRPO groups have an advantage to learn from.
It is the measurement ``recipes/trl_grpo.py --grpo-filter K`` makes before GRPO
(``task_pass_counts``), on a saved model.

    python benchmarks/trl_pass_rate.py runs/p51_gen/sft general 48 4 100 --max-nodes 20

Prints a JSON summary (success rate, valid tool calls, tasks by how often they were solved,
failure causes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a tool-calling model directory (e.g. a run's sft/)")
    ap.add_argument("world", choices=["webshop", "general"])
    ap.add_argument("tasks", type=int, help="the first N train tasks in GRPO's order")
    ap.add_argument("k", type=int, help="sampled episodes per task")
    ap.add_argument("seed", type=int, help="the recipe's --seed (orders the tasks)")
    ap.add_argument("--max-nodes", type=int, default=40, help="as the model's run (--max-nodes)")
    ap.add_argument("--envs", type=int, default=8, help="phones at once (--eval-envs)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "recipes"))
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl_grpo import task_pass_counts

    from digirl_lite.envs.sim.trl_tools import task_dataset
    from digirl_lite.envs.sim.trl_warmup import check_tool_template

    tok = check_tool_template(AutoTokenizer.from_pretrained(args.model))
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tasks = list(task_dataset(args.world, n=args.tasks, seed=args.seed)["task"])
    wins, report = task_pass_counts(model, tok, args.world, tasks, args.k, seed=args.seed,
                                    n_envs=args.envs, max_nodes=args.max_nodes)
    out = {"success_rate": report["true_success_rate"], "episodes": report["episodes"],
           "valid_tool_call_share": report["valid_tool_call_share"],
           "seconds": report["seconds"],
           "tasks_solved_sometimes": sum(w is not None and 0 < w < args.k for w in wins),
           "tasks_solved_always": sum(w == args.k for w in wins),
           "tasks_solved_never": sum(w == 0 for w in wins),
           "tasks_not_measured": sum(w is None for w in wins),
           "solved_sometimes": [t for t, w in zip(tasks, wins)
                                if w is not None and 0 < w < args.k],
           "failure_causes": report.get("failure_causes")}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
