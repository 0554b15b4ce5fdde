"""The TRL recipe's held-out evaluation (``evaluate_tool_model``): wall time and the prompt
tokens it encoded against those it read from each slot's key-value cache (issue 51).

    python benchmarks/trl_eval_speed.py --tasks 8 --envs 8 --max-nodes 20

Builds the recipe's tiny chat model (``make_tiny_chat_lm``, ``--tiny-set``-style sizes below,
untrained: it writes long invalid replies, the evaluation's worst case: every step answered
with a note, every episode to the phone's horizon) and evaluates it on the first ``--tasks``
Web Shopping test tasks. Writes ``benchmarks/results/trl_eval_speed.json`` with the commit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--max-nodes", type=int, default=20)
    ap.add_argument("--hidden-size", type=int, default=128)
    ap.add_argument("--vocab-size", type=int, default=2048)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "trl_eval_speed.json"))
    args = ap.parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "recipes"))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl_grpo import evaluate_tool_model

    from benchmarks.gridlib.provenance import tree_state
    from digirl_lite.envs.sim.demos import sim_corpus
    from digirl_lite.envs.sim.trl_warmup import check_tool_template
    from digirl_lite.policy.tiny_vlm import make_tiny_chat_lm

    with tempfile.TemporaryDirectory() as tmp:
        path = make_tiny_chat_lm(Path(tmp), seed=0, corpus=sim_corpus(seed=0, n_demos=20),
                                 hidden_size=args.hidden_size, vocab_size=args.vocab_size)
        tok = check_tool_template(AutoTokenizer.from_pretrained(path))
        model = AutoModelForCausalLM.from_pretrained(path)
        t0 = time.perf_counter()
        report = evaluate_tool_model(model, tok, "webshop", n_tasks=args.tasks,
                                     n_envs=args.envs, max_nodes=args.max_nodes)
        wall = time.perf_counter() - t0
    result = {
        "what": "recipes/trl_grpo.py's evaluate_tool_model on an untrained tiny chat model: "
                "wall time, replies, prompt tokens encoded and read from the slots' caches",
        "code": tree_state(["digirl_lite", "recipes"], ["digirl_lite", "recipes"]),
        "command": "python benchmarks/trl_eval_speed.py " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        "settings": vars(args) | {"out": None},
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "omp_threads": os.environ.get("OMP_NUM_THREADS"),
        "wall_s": round(wall, 1),
        "episodes": report["episodes"],
        "mean_length": report["mean_length"],
        "valid_tool_call_share": report["valid_tool_call_share"],
        "prompt_tokens": report.get("prompt_tokens"),
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
