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
    python recipes/trl_grpo.py --tiny --warmup                 # SFT warm-up, then GRPO (issue 51)
                                                    # (the measured setting: about 25 min)
    python recipes/trl_grpo.py --model /path/to/Qwen3-0.6B --max-steps 200 \\
        --num-generations 8 --batch 8 --max-completion-length 2048

``--model`` is a local checkpoint directory (nothing is downloaded; any causal LM whose chat
template TRL knows how to parse tool calls from: Qwen2.5, Qwen3, Llama 3.1/3.2, ...);
``--tiny`` writes a tiny random Qwen3 with Qwen3's chat template
(:func:`~digirl_lite.policy.tiny_vlm.make_tiny_chat_lm`) and trains that: it writes noise and
learns nothing, but every part of the loop runs and its cost is measured. The run writes
``summary.json`` (the command, seconds per training step, the rewards TRL logged, episodes
served) and TRL's own output into ``--out``.

``--warmup`` (issue 51) first trains the model with TRL's ``SFTTrainer`` on the scripted
expert's episodes written as tool calls in this recipe's chat format
(:func:`~digirl_lite.envs.sim.trl_warmup.expert_conversations`), so that it writes the tool
calls GRPO's parser reads; then measures held-out success with the package's evaluation
(:func:`evaluate_tool_model` below: the first ``--eval-tasks`` test
tasks, true rate beside the judged one, the share of valid tool calls), runs GRPO from there
and measures again, and prints both in the main job's table (stages ``sft`` and ``grpo``).
``--grpo-filter K`` first samples K episodes of each training task with the SFT model and
keeps for GRPO only the tasks it solves sometimes but not always (the others' groups have no
advantage to learn from; their counts are in ``summary.json``).
An episode an infrastructure fault ended (server error, lost session) gets no reward: TRL
leaves it out of its group (a start is retried once on a new connection); ``summary.json``
counts them. A ``--model`` whose chat template cannot write tool calls is refused first.
``--tiny --warmup`` runs the setting measured on 3 seeds (:data:`TINY_WARMUP`: General, a
wider tiny model, 256 expert episodes with ways back, 600 SFT steps, ``--grpo-filter 4``, 10
GRPO steps of 8 x 8 rollouts); any argument given replaces its entry. Every other run starts
from :data:`BASE` (a smoke run's sizes; a ``--model``'s settings are the user's to give).
With ``--tiny --warmup`` the tiny model's tokenizer is also trained on the SFT chats' text,
and ``--tiny-set`` changes its sizes (e.g. ``--tiny-set vocab_size=2048 hidden_size=128
intermediate_size=512``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BASE: dict = {
    "world": "webshop", "tasks": 64, "max_steps": 2, "batch": 2, "num_generations": 2,
    "max_completion_length": 256, "max_nodes": 40, "learning_rate": 1e-6, "beta": 0.0,
    "sft_episodes": 64, "sft_steps": 200, "sft_batch": 4, "sft_learning_rate": 1e-3,
    "sft_recovery": 0.0, "grpo_filter": 0, "tiny_set": []}
"""Defaults of every run but ``--tiny --warmup`` (a smoke run's; ``--model``'s start)."""

TINY_WARMUP: dict = {
    "world": "general", "tasks": 48, "max_steps": 10, "batch": 8, "num_generations": 8,
    "max_completion_length": 2560, "max_nodes": 20, "learning_rate": 1e-4, "beta": 0.04,
    "sft_episodes": 256, "sft_steps": 600, "sft_batch": 1, "sft_learning_rate": 3e-3,
    "sft_recovery": 0.5, "grpo_filter": 4, "tiny_set": ["hidden_size=128", "vocab_size=2048"]}
"""``--tiny --warmup``'s defaults: the setting measured on 3 seeds
(``benchmarks/results/trl_grpo.json``, docs/ecosystem.md), chosen by the pilots there; an
argument given on the command line replaces its entry."""


def parse_args(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser,
                                                        argparse.Namespace]:
    """The parser and the arguments, each unset one filled from :data:`TINY_WARMUP` (with
    ``--tiny --warmup``) or :data:`BASE`; ``args.defaults`` names which."""
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=f"Unset arguments: with --tiny --warmup {TINY_WARMUP}; otherwise {BASE}.")
    ap.add_argument("--out", default="runs/trl_grpo")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a local causal LM checkpoint directory")
    src.add_argument("--tiny", action="store_true", help="a tiny random Qwen3 (CPU smoke run)")
    ap.add_argument("--env-url", default=None,
                    help="a running server (python -m digirl_lite.envs.sim.openenv --ui-tree); "
                         "default: start one here")
    ap.add_argument("--world", choices=["webshop", "general"], default=None,
                    help="default webshop (--tiny --warmup: general)")
    ap.add_argument("--tasks", type=int, default=None, help="training instructions (prompts)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=None, help="GRPO training steps")
    ap.add_argument("--batch", type=int, default=None, help="per-device train batch size")
    ap.add_argument("--num-generations", type=int, default=None, help="rollouts per prompt (G)")
    ap.add_argument("--max-completion-length", type=int, default=None,
                    help="tokens of the whole multi-turn episode (model turns + screens)")
    ap.add_argument("--max-tool-calls", type=int, default=20,
                    help="tool calls per episode (the phone's own budget H ends it too)")
    ap.add_argument("--max-nodes", type=int, default=None, help="screen lines shown per step")
    ap.add_argument("--learning-rate", type=float, default=None)
    ap.add_argument("--beta", type=float, default=None,
                    help="KL coefficient against the start (TRL's default 0.0)")
    ap.add_argument("--temperature", type=float, default=1.0, help="GRPO's sampling temperature")
    w = ap.add_argument_group("SFT warm-up and held-out evaluation (--warmup)")
    w.add_argument("--warmup", action="store_true",
                   help="SFT on the expert's tool calls first; evaluate before and after GRPO")
    w.add_argument("--sft-episodes", type=int, default=None, help="expert episodes to imitate")
    w.add_argument("--sft-steps", type=int, default=None, help="SFT optimizer steps")
    w.add_argument("--sft-batch", type=int, default=None)
    w.add_argument("--sft-learning-rate", type=float, default=None)
    w.add_argument("--sft-recovery", type=float, default=None,
                   help="share of expert episodes with one mistake put in; SFT trains on the "
                        "expert's way back from it, never on the mistake")
    w.add_argument("--sft-varied", type=float, default=0.0,
                   help="share of expert episodes on a train task with a made-up product "
                        "(General: made-up names), so SFT teaches copying the task's words "
                        "rather than typing the train list's; a task drawn without a product "
                        "or name stays as it is (summary.json counts the varied ones)")
    w.add_argument("--grpo-filter", type=int, default=None, metavar="K",
                   help="before GRPO, sample K episodes of each of the --tasks train tasks with "
                        "the SFT model (temperature 1) and train GRPO only on the tasks it "
                        "solved sometimes but not always: a group whose rollouts all fail (or "
                        "all succeed) has no advantage and teaches nothing (with none such, it "
                        "trains on all and says so)")
    w.add_argument("--eval-tasks", type=int, default=32, help="held-out test tasks evaluated")
    w.add_argument("--eval-envs", type=int, default=8, help="phones the evaluation runs at once")
    w.add_argument("--tiny-set", nargs="*", default=None, metavar="SIZE=VALUE",
                   help="--tiny model sizes to change (of make_tiny_chat_lm's TINY_LM: "
                        "hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, "
                        "num_key_value_heads, vocab_size); with --warmup its tokenizer is also "
                        "trained on the SFT chats' text")
    args = ap.parse_args(argv)
    args.defaults = "tiny_warmup" if args.tiny and args.warmup else "base"
    for k, v in (TINY_WARMUP if args.defaults == "tiny_warmup" else BASE).items():
        if getattr(args, k) is None:  # what the command line gave wins
            setattr(args, k, v)
    if args.grpo_filter and (args.grpo_filter < 2 or not args.warmup):
        ap.error("--grpo-filter K: K >= 2 episodes per task, and with --warmup (it samples "
                 f"the SFT model), got {args.grpo_filter}")
    return ap, args


def main(argv: list[str] | None = None) -> dict:
    ap, args = parse_args(argv)
    from digirl_lite.train.cli import parse_assignments

    tiny_sizes = parse_assignments(args.tiny_set, "--tiny-set", "SIZE")

    try:
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        raise SystemExit("recipes/trl_grpo.py needs TRL and openenv-core: pip install "
                         "'digirl-lite[trl,openenv]'") from None
    from transformers import AutoTokenizer

    from digirl_lite.envs.sim.openenv import LocalServer
    from digirl_lite.envs.sim.trl_tools import phone_tools, task_dataset
    from digirl_lite.envs.sim.trl_warmup import ToolTemplateError, check_tool_template

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = args.model
    if args.tiny:
        from digirl_lite.envs.sim.demos import sim_corpus
        from digirl_lite.policy.tiny_vlm import make_tiny_chat_lm

        corpus = sim_corpus(seed=args.seed, n_demos=20)
        if args.warmup:  # the chats it will read and write: shorter sequences, same model
            from digirl_lite.envs.sim.trl_warmup import chat_text

            corpus += chat_text(_sft_data(args)[0])
        try:
            model = str(make_tiny_chat_lm(out / "tiny_model", seed=args.seed, corpus=corpus,
                                          **tiny_sizes))
        except ValueError as e:
            ap.error(str(e))
    elif not Path(model).expanduser().is_dir():
        raise SystemExit(f"--model {model!r} is not a directory (nothing is downloaded: give a "
                         "local checkpoint)")
    tok = AutoTokenizer.from_pretrained(model)
    try:  # before any training: a model that cannot write tool calls TRL reads learns nothing
        tok = check_tool_template(tok)
    except ToolTemplateError as e:
        raise SystemExit(f"--model {model}: {e}") from None
    tok.padding_side = "left"
    stages: dict[str, dict] = {}
    phases: dict[str, dict] = {}
    if args.warmup:
        model = _sft(args, model, tok, out, phases)
        from transformers import AutoModelForCausalLM

        sft_model = AutoModelForCausalLM.from_pretrained(model)  # read once: evaluation, filter
        stages["sft"] = _evaluate(args, sft_model, tok)
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
        if args.grpo_filter:
            data = _filter_tasks(args, sft_model, tok, data, phases)
        if args.warmup:
            del sft_model  # GRPO trains its own copy, read from the SFT directory
        cfg = GRPOConfig(
            output_dir=str(out / "trl"), max_steps=args.max_steps,
            per_device_train_batch_size=args.batch, num_generations=args.num_generations,
            max_completion_length=args.max_completion_length,
            max_tool_calling_iterations=args.max_tool_calls, learning_rate=args.learning_rate,
            beta=args.beta, temperature=args.temperature,
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
    steps = trainer.state.global_step
    phases["grpo"] = {"steps": steps, "wall_s": round(seconds, 1),
                      "steps_per_s": round(steps / seconds, 4) if seconds else None}
    if args.warmup:
        stages["grpo"] = _evaluate(args, trainer.model, tok)
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
                     or k in ("step", "loss", "kl", "entropy", "tools/call_frequency",
                              "tools/failure_frequency")}
                    for r in logs],
        "infrastructure": {"faults": tools.faults, "retried_starts": tools.retries,
                           "note": "episodes an infrastructure fault ended got no reward "
                                   "(None: TRL leaves them out of their group)"},
        "phases": phases,
        "settings": {k: getattr(args, k) for k in (
            "world", "tasks", "seed", "max_steps", "batch", "num_generations",
            "max_completion_length", "max_tool_calls", "max_nodes", "learning_rate", "beta",
            "temperature", "warmup", "sft_episodes", "sft_steps", "sft_batch",
            "sft_learning_rate", "sft_recovery", "sft_varied", "grpo_filter", "eval_tasks",
            "tiny_set")},
        "defaults": args.defaults,
        "omp_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    if args.warmup:
        summary["stages"] = stages
        summary["before"] = _rates(stages["sft"])
        summary["after"] = _rates(stages["grpo"])
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    print(json.dumps({k: summary[k] for k in ("steps", "train_seconds", "seconds_per_step",
                                              "episodes_served")}))
    if args.warmup:
        from digirl_lite.train.cli import print_table

        print_table({f"seed {args.seed}": {"stages": stages}}, args.eval_tasks,
                    stages=("sft", "grpo"))
        print("valid tool calls: " + ", ".join(
            f"{k} {100 * r['valid_tool_call_share']:.1f}%" for k, r in stages.items()))
    return summary


def _sft(args: argparse.Namespace, model: str, tok, out: Path, phases: dict) -> str:
    """SFT on the expert's tool calls; returns the trained model's directory."""
    from trl import SFTConfig, SFTTrainer

    data, counts = _sft_data(args)
    cfg = SFTConfig(
        output_dir=str(out / "sft_trl"), max_steps=args.sft_steps,
        per_device_train_batch_size=args.sft_batch, learning_rate=args.sft_learning_rate,
        lr_scheduler_type="constant", assistant_only_loss=True, max_length=None,
        logging_steps=10, save_strategy="no", report_to="none", seed=args.seed,
        use_cpu=not _cuda(), bf16=False, dataloader_num_workers=0)
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=data, processing_class=tok)
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    trainer.save_model(str(out / "sft"))
    tok.save_pretrained(str(out / "sft"))
    steps = trainer.state.global_step
    phases["sft"] = {"steps": steps, "wall_s": round(seconds, 1),
                     "steps_per_s": round(steps / seconds, 4) if seconds else None,
                     "data": counts,
                     "loss": [{"step": r["step"], "loss": r["loss"]}
                              for r in trainer.state.log_history if "loss" in r]}
    return str(out / "sft")


_SFT_DATA: dict[tuple, tuple] = {}


def _sft_data(args: argparse.Namespace) -> tuple:
    """The expert's chats and their counts (built once per run's settings)."""
    from digirl_lite.envs.sim.trl_warmup import expert_conversations

    key = (args.world, args.sft_episodes, args.seed, args.max_nodes, args.sft_recovery,
           args.sft_varied)
    if key not in _SFT_DATA:
        for flag, share in (("--sft-recovery", args.sft_recovery),
                            ("--sft-varied", args.sft_varied)):
            if not 0.0 <= share <= 1.0:
                raise SystemExit(f"{flag}: a share in [0, 1], got {share}")
        _SFT_DATA[key] = expert_conversations(args.world, n=args.sft_episodes, seed=args.seed,
                                              max_nodes=args.max_nodes,
                                              recovery=args.sft_recovery,
                                              varied=args.sft_varied)
    return _SFT_DATA[key]


def evaluate_tool_model(model, tok, world: str = "webshop", n_tasks: int = 32,
                        seed: int = 0, n_envs: int = 8, max_nodes: int = 40,
                        max_new_tokens: int = 48, max_completion_length: int | None = None,
                        tasks: list[str] | None = None, sample: bool = False,
                        episodes: list | None = None) -> dict:
    """Held-out success of a tool-calling model: the package's evaluation
    (:func:`~digirl_lite.train.evaluate.evaluate`) on the first ``n_tasks`` of ``world``'s
    test list (or of ``tasks``, on the world's train phones), on in-process simulated phones
    (the ground-truth check as the judge, its truth beside it), with the model behind
    :class:`ToolCallAgent` (greedy, or ``sample``: temperature 1). The summary gains
    ``valid_tool_call_share``, ``prompt_tokens`` (encoded, and read from the slots' key-value
    caches) and ``seconds``; ``episodes``, when given, receives the episodes."""
    from digirl_lite.envs.sim.env import SimEnvFactory, SimPhoneEnv
    from digirl_lite.envs.sim.trl_warmup import ToolCallAgent
    from digirl_lite.rollout.fleet import SyncFleet
    from digirl_lite.train.evaluate import evaluate

    split = f"{world}_test" if tasks is None else world
    if tasks is None:
        tasks = list(SimPhoneEnv._load_task_list(split))
    fleet = SyncFleet(SimEnvFactory(seed=seed, tasks=split, ui_tree=True),
                      n_envs=min(n_envs, n_tasks), backend="local", parallel_steps=False)
    agent = ToolCallAgent(model, tok, max_nodes=max_nodes, max_new_tokens=max_new_tokens,
                          max_completion_length=max_completion_length, sample=sample)
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    try:
        report, got = evaluate(fleet, agent, tasks, seed=10_000 + seed, n_tasks=n_tasks)
    finally:
        fleet.close()
        model.train(was_training)
    report["valid_tool_call_share"] = agent.valid_share
    report["prompt_tokens"] = {"encoded": agent.encoded, "from_cache": agent.reused}
    report["seconds"] = round(time.perf_counter() - t0, 1)
    if episodes is not None:
        episodes.extend(got)
    return report


def task_pass_counts(model, tok, world: str, tasks: list[str], k: int, seed: int = 0,
                     n_envs: int = 8, max_nodes: int = 40) -> tuple[list[int | None], dict]:
    """``k`` episodes of each of ``tasks`` (train tasks, on the world's train phones) with the
    model sampling at temperature 1: the successes per task
    (:func:`~digirl_lite.envs.sim.trl_warmup.pass_counts`; None: not measured) and the
    evaluation's summary."""
    from digirl_lite.envs.sim.trl_warmup import pass_counts

    episodes: list = []
    report = evaluate_tool_model(model, tok, world, n_tasks=k * len(tasks), seed=seed,
                                 n_envs=n_envs, max_nodes=max_nodes, sample=True,
                                 tasks=[t for t in tasks for _ in range(k)], episodes=episodes)
    return pass_counts(episodes, len(tasks), k), report


def _filter_tasks(args: argparse.Namespace, model, tok, data, phases: dict):
    """``data``'s rows whose task the SFT model solved in some but not all of
    ``--grpo-filter`` sampled episodes (true success), the rest dropped and counted in
    ``phases["grpo_filter"]``. With none left, every row is kept and the phase says so:
    GRPO then gets no gradient (every group's advantage is 0), which the run reports rather
    than hides."""
    k, tasks = args.grpo_filter, list(data["task"])
    wins, report = task_pass_counts(model, tok, args.world, tasks, k, seed=args.seed,
                                    n_envs=args.eval_envs, max_nodes=args.max_nodes)
    keep = [i for i, w in enumerate(wins) if w is not None and 0 < w < k]
    phases["grpo_filter"] = {
        "episodes_per_task": k, "tasks": len(tasks), "kept": len(keep),
        "solved_always": sum(w == k for w in wins), "solved_never": sum(w == 0 for w in wins),
        "not_measured": sum(w is None for w in wins),
        "success_rate": report["true_success_rate"], "seconds": report["seconds"],
        "kept_tasks": [tasks[i] for i in keep]}
    f = phases["grpo_filter"]
    print(f"[trl_grpo] --grpo-filter {k}: {len(keep)} of {len(tasks)} train tasks solved "
          f"sometimes ({f['solved_never']} never, {f['solved_always']} always, "
          f"{f['not_measured']} not measured)", flush=True)
    if not keep:
        f["note"] = ("no train task was solved sometimes but not always: GRPO trains on all "
                     "of them and gets no gradient")
        print(f"[trl_grpo] --grpo-filter: {f['note']}", flush=True)
        return data
    return data.select(keep)


def _evaluate(args: argparse.Namespace, model, tok) -> dict:
    """Held-out success through the package's evaluation, on whole episodes: the phone's
    horizon ends them, not ``--max-completion-length`` (GRPO's token budget for its training
    episodes; at its default of 256 tokens an evaluated episode was cut after its first
    turns, every later step an invalid one)."""
    report = evaluate_tool_model(model, tok, args.world, n_tasks=args.eval_tasks,
                                 seed=args.seed, n_envs=args.eval_envs,
                                 max_nodes=args.max_nodes)
    report.pop("not_evaluated", None)
    return report


def _rates(report: dict) -> dict:
    return {k: report[k] for k in ("success_rate", "true_success_rate", "ci95", "true_ci95",
                                   "valid_tool_call_share", "invalid_step_rate", "mean_length",
                                   "episodes", "seconds")}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
