"""How often a TRL-trained tool-calling model solves its own training tasks when it samples
(issue 51): K episodes at temperature 1 of each of the first N train tasks in the GRPO
recipe's order (``task_dataset(world, n=N, seed=SEED)``), and how many tasks it solves
sometimes but not always, the only ones whose GRPO groups have an advantage to learn from
(``recipes/trl_grpo.py --grpo-filter`` keeps those).

    python benchmarks/trl_pass_rate.py runs/p51_gen/sft general 48 4 100

Prints a JSON summary (success rate, valid tool calls, tasks with spread, failure causes).
"""
import sys, json, time, collections
from transformers import AutoTokenizer, AutoModelForCausalLM
from digirl_lite.envs.sim.env import SimEnvFactory
from digirl_lite.envs.sim.trl_warmup import ToolCallAgent, check_tool_template
from digirl_lite.envs.sim.trl_tools import task_dataset
from digirl_lite.rollout.fleet import SyncFleet
from digirl_lite.train.evaluate import evaluate
mdir, world, n, k, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
tok = check_tool_template(AutoTokenizer.from_pretrained(mdir))
model = AutoModelForCausalLM.from_pretrained(mdir).eval()
tasks = task_dataset(world, n=n, seed=seed)["task"]
fleet = SyncFleet(SimEnvFactory(seed=seed, tasks=world, ui_tree=True), n_envs=8, backend="local", parallel_steps=False)
agent = ToolCallAgent(model, tok, max_nodes=20, sample=True)
t0 = time.time()
rep, eps = evaluate(fleet, agent, [t for t in tasks for _ in range(k)], seed=20_000 + seed, n_tasks=None)
fleet.close()
succ = collections.Counter()
for e in eps:
    succ[e.trajectory.task] += bool(e.trajectory.true_success)
per = {t: succ.get(t, 0) for t in tasks}
spread = [t for t, s in per.items() if 0 < s < k]
print(json.dumps({"success_rate": rep["success_rate"], "valid": agent.valid_share, "seconds": round(time.time()-t0),
  "tasks_with_spread": len(spread), "all": sum(1 for s in per.values() if s == k), "none": sum(1 for s in per.values() if s == 0),
  "spread_tasks": spread[:20], "failure_causes": rep.get("failure_causes")}, indent=1))
