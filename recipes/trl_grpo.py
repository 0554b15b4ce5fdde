"""TRL's GRPOTrainer trains a language model on the simulated phone, through the OpenEnv
server (issue 31, item 3).

The phone is served as an OpenEnv environment (``python -m digirl_lite.envs.sim.openenv``,
started here as a child process unless ``--env-url`` names a running one); TRL's
``GRPOTrainer(environment_factory=...)`` drives it: each rollout holds a session on the server
(:func:`~digirl_lite.envs.sim.trl_tools.phone_tools`), the model reads the screen's UI tree and
acts with tools (tap an element, type, back, home, enter, task complete), and the reward is the
environment's verdict (1 when the task is done: the simulator's ground-truth check, or the
server's judge). The prompts are the world's training instructions
(:func:`~digirl_lite.envs.sim.trl_tools.task_dataset`), each with its own env seed.

    python recipes/trl_grpo.py --tiny --max-steps 2            # a tiny random Qwen3, CPU
    python recipes/trl_grpo.py --model /path/to/Qwen3-0.6B --max-steps 200 \\
        --num-generations 8 --batch 8 --max-completion-length 2048

``--model`` is a local checkpoint directory (nothing is downloaded; any causal LM whose chat
template TRL knows how to parse tool calls from: Qwen2.5, Qwen3, Llama 3.1/3.2, ...);
``--tiny`` writes a tiny random Qwen3 with Qwen3's chat template
(:func:`~digirl_lite.policy.tiny_vlm.make_tiny_chat_lm`) and trains that: it writes noise and
learns nothing, but every part of the loop runs and its cost is measured. The run writes
``summary.json`` (the command, seconds per training step, the rewards TRL logged, episodes
served) and TRL's own output into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/trl_grpo")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a local causal LM checkpoint directory")
    src.add_argument("--tiny", action="store_true", help="a tiny random Qwen3 (CPU smoke run)")
    ap.add_argument("--env-url", default=None,
                    help="a running server (python -m digirl_lite.envs.sim.openenv --ui-tree); "
                         "default: start one here")
    ap.add_argument("--world", choices=["webshop", "general"], default="webshop")
    ap.add_argument("--tasks", type=int, default=64, help="training instructions (prompts)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=2, help="GRPO training steps")
    ap.add_argument("--batch", type=int, default=2, help="per-device train batch size")
    ap.add_argument("--num-generations", type=int, default=2, help="rollouts per prompt (G)")
    ap.add_argument("--max-completion-length", type=int, default=256,
                    help="tokens of the whole multi-turn episode (model turns + screens)")
    ap.add_argument("--max-tool-calls", type=int, default=20,
                    help="tool calls per episode (the phone's own budget H ends it too)")
    ap.add_argument("--max-nodes", type=int, default=40, help="screen lines shown per step")
    ap.add_argument("--learning-rate", type=float, default=1e-6)
    args = ap.parse_args(argv)

    try:
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        raise SystemExit("recipes/trl_grpo.py needs TRL and openenv-core: pip install "
                         "'digirl-lite[trl,openenv]'") from None
    from transformers import AutoTokenizer

    from digirl_lite.envs.sim.openenv import LocalServer
    from digirl_lite.envs.sim.trl_tools import phone_tools, task_dataset

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = args.model
    if args.tiny:
        from digirl_lite.envs.sim.demos import sim_corpus
        from digirl_lite.policy.tiny_vlm import make_tiny_chat_lm

        model = str(make_tiny_chat_lm(out / "tiny_model", seed=args.seed,
                                      corpus=sim_corpus(seed=args.seed, n_demos=20)))
    elif not Path(model).expanduser().is_dir():
        raise SystemExit(f"--model {model!r} is not a directory (nothing is downloaded: give a "
                         "local checkpoint)")
    tok = AutoTokenizer.from_pretrained(model)
    tok.padding_side = "left"
    server = None
    url = args.env_url
    if url is None:
        server = LocalServer(["--world", args.world, "--ui-tree", "--no-screenshot",
                              "--max-sessions", str(max(8, 2 * args.batch)),
                              "--log-level", "warning"], log=str(out / "openenv_server.log"))
        url = server.url
    try:
        tools = phone_tools(url, ui_tree_options={"max_nodes": args.max_nodes})
        data = task_dataset(args.world, n=args.tasks, seed=args.seed)
        cfg = GRPOConfig(
            output_dir=str(out / "trl"), max_steps=args.max_steps,
            per_device_train_batch_size=args.batch, num_generations=args.num_generations,
            max_completion_length=args.max_completion_length,
            max_tool_calling_iterations=args.max_tool_calls, learning_rate=args.learning_rate,
            logging_steps=1, save_strategy="no", report_to="none", seed=args.seed,
            use_cpu=not _cuda(), bf16=False, chat_template_kwargs={"enable_thinking": False},
            log_completions=False, dataloader_num_workers=0)
        trainer = GRPOTrainer(model=model, processing_class=tok, args=cfg, train_dataset=data,
                              environment_factory=tools)
        t0 = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - t0
    finally:
        if server is not None:
            server.stop()
    logs = [r for r in trainer.state.log_history if "reward" in r]
    summary = {
        "command": "python recipes/trl_grpo.py " + " ".join(argv if argv is not None
                                                           else sys.argv[1:]),
        "model": model, "env_url": url if args.env_url else "a local server (this run's)",
        "world": args.world, "steps": trainer.state.global_step,
        "train_seconds": round(seconds, 1),
        "seconds_per_step": round(seconds / max(trainer.state.global_step, 1), 1),
        "episodes_served": tools.resets,
        "rollouts_per_step": args.batch,
        "rewards": [{k: r[k] for k in r if k.startswith("reward") or k.startswith("rewards/")
                     or k in ("step", "loss", "tools/call_frequency", "tools/failure_frequency")}
                    for r in logs],
        "omp_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    print(json.dumps({k: summary[k] for k in ("steps", "train_seconds", "seconds_per_step",
                                              "episodes_served")}))
    return summary


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
