"""Critic costs and the CE-vs-MSE toy of spec/DIGIRL.md section 5; prints one JSON object::

    python benchmarks/bench_critics.py [--batch 128] [--tokens 64] [--recompute-iters 3] ...

(a) ``update``: one step-critic update (two paper-size heads 3584 -> 768 -> 768 -> 2, batch 128,
    cross-entropy, Adam lr 1e-4) on cached text embeddings, against the same update that first
    re-encodes the batch's 128 prompts (64 tokens) with a roberta-base-shaped encoder (random
    weights from ``RobertaConfig()``: 12 layers, 768 wide), as the released code does on every
    update. Same batch, same loss; the ratio (of medians) is what caching the frozen encoder
    buys (notes/MEASURED.md: 10.0 s vs 37 ms, 273x on 2 CPUs). On a shared machine the cached
    update is the one that suffers most from other processes; the load average is reported.
    Prompts are tokenized with the MiniLM package's WordPiece tokenizer (roberta-base's BPE
    files are not available offline; the token count, not the vocabulary, decides the cost).
(b) ``toy``: a head at V = 0.99 whose truth is 0.5: the pull on the logit (CE 0.49, MSE
    0.0097) and the updates of step size 1 on the logit needed to get below 0.6 (CE 12,
    MSE 124), first computed directly on the logit in float64, then on a real
    ``ValueHead(3584, 768, init_value=0.99)`` by SGD on its output bias with an equal mix of
    0 and 1 labels (lr 0.5 on [b0, b1] moves the logit b1 - b0 by one gradient).
(c) ``minilm``: load time and encode speed of :class:`MiniLMEncoder` (the laptop encoder).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time

import numpy as np
import torch

from digirl_lite.actions import Action, format_action
from digirl_lite.critics import (
    EmbeddingCache,
    HFTextEncoder,
    MiniLMEncoder,
    StepBatch,
    StepCritic,
    ValueHead,
    minilm_dir,
    step_critic_loss,
    value_loss,
)
from digirl_lite.critics.heads import PAPER_IMAGE_DIM, PAPER_TEXT_DIM
from digirl_lite.prompts import build_prompt

TASKS = (
    'Go to costco.com, search for "bose soundsport free", and select the first entry',
    "Go to ebay.com, search for 'apple airpods', and select the first entry",
    "Go to walmart.com, search for 'logitech g903'",
    "What's the news in India?",
    "Open the settings and turn on airplane mode",
)


def make_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct policy prompts (``Previous Actions: <action string> Goal: <task></s>``)."""
    rng = np.random.default_rng(seed)
    out: list[str] = []
    while len(out) < n:
        y, x = (float(v) for v in np.round(rng.random(2), 4))
        p = build_prompt(TASKS[len(out) % len(TASKS)], format_action(Action.tap(x=x, y=y)))
        if p not in out:
            out.append(p)
    return out


def _time(fn, warmup: int, iters: int) -> dict:
    """Median and min seconds per call (the median resists other processes' bursts)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median": float(np.median(times)), "min": min(times)}


def bench_update(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir()), local_files_only=True)
    t0 = time.perf_counter()
    roberta = RobertaModel(RobertaConfig())  # roberta-base shape, random weights
    build_s = time.perf_counter() - t0
    encoder = HFTextEncoder.from_modules(roberta, tokenizer, device="cpu",
                                         max_length=args.tokens, batch_size=args.batch)
    prompts = make_prompts(args.batch, args.seed)
    n_tok = tokenizer(prompts, truncation=True, max_length=args.tokens)["input_ids"]

    critic = StepCritic(PAPER_TEXT_DIM, PAPER_IMAGE_DIM)
    opt = torch.optim.Adam(critic.parameters(), lr=1e-4)
    img2 = torch.randn(args.batch, 2 * PAPER_IMAGE_DIM)  # (B, 2816)
    label = torch.randint(0, 2, (args.batch,)).float()

    def update(text: torch.Tensor) -> None:
        opt.zero_grad()
        step_critic_loss(critic, StepBatch(text, img2, label)).backward()
        opt.step()

    cache = EmbeddingCache(encoder)
    t0 = time.perf_counter()
    cache.warm(prompts)
    first_encode_s = time.perf_counter() - t0
    cached_s = _time(lambda: update(cache.get(prompts)), args.warmup, args.cached_iters)
    recompute_s = _time(lambda: update(encoder.encode(prompts)), 1, args.recompute_iters)
    return {
        "batch": args.batch,
        "tokens_per_prompt_mean": float(np.mean([len(t) for t in n_tok])),
        "encoder_params": sum(p.numel() for p in roberta.parameters()),
        "head_params": sum(p.numel() for p in critic.parameters()),
        "build_encoder_s": round(build_s, 3),
        "first_encode_s": round(first_encode_s, 3),
        "cached_update_s": round(cached_s["median"], 5),
        "cached_update_min_s": round(cached_s["min"], 5),
        "recompute_update_s": round(recompute_s["median"], 3),
        "recompute_update_min_s": round(recompute_s["min"], 3),
        "ratio": round(recompute_s["median"] / cached_s["median"], 1),
        "ratio_of_mins": round(recompute_s["min"] / cached_s["min"], 1),
        "cached_iters": args.cached_iters,
        "recompute_iters": args.recompute_iters,
        "cache": {"hits": cache.hits, "misses": cache.misses},
    }


def bench_minilm(args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    enc = MiniLMEncoder(device="cpu")
    load_s = time.perf_counter() - t0
    prompts = make_prompts(args.batch, args.seed + 1)
    enc.encode(prompts[:8])  # warm-up
    t0 = time.perf_counter()
    enc.encode(prompts)
    encode_s = time.perf_counter() - t0
    return {"load_s": round(load_s, 3), "dim": enc.dim, "texts": len(prompts),
            "encode_s": round(encode_s, 3), "texts_per_s": round(len(prompts) / encode_s, 1)}


def _logit_steps(loss: str, v0: float = 0.99, truth: float = 0.5, stop: float = 0.6) -> int:
    """Updates z <- z - dL/dz (step size 1 on the logit z) until sigmoid(z) < stop."""
    z, n = math.log(v0 / (1 - v0)), 0
    while 1 / (1 + math.exp(-z)) >= stop:
        v = 1 / (1 + math.exp(-z))
        z -= (v - truth) if loss == "ce" else 2 * (v - truth) * v * (1 - v)
        n += 1
    return n


def _head_run(loss: str, seed: int, d_in: int, hidden: int, max_steps: int = 10_000) -> dict:
    torch.manual_seed(seed)
    head = ValueHead(d_in, hidden, init_value=0.99)
    x = torch.randn(2, d_in)
    y = torch.tensor([0.0, 1.0])  # truth 0.5: an equal mix of labels
    bias = head.output_layer.bias
    opt = torch.optim.SGD([bias], lr=0.5)  # step size 1 on the logit b1 - b0
    value_loss(head(x), y, loss).backward()
    pull = float(bias.grad[1])
    n = 0
    while n < max_steps:
        with torch.no_grad():
            if float(head.value(x).max()) < 0.6:
                break
        opt.zero_grad()
        value_loss(head(x), y, loss).backward()
        opt.step()
        n += 1
    return {"pull": pull, "steps_below_0.6": n}


def bench_toy(args: argparse.Namespace) -> dict:
    v = 0.99
    ce_pull, mse_pull = v - 0.5, 2 * (v - 0.5) * v * (1 - v)
    d_in = PAPER_TEXT_DIM + 2 * PAPER_IMAGE_DIM
    head = {k: _head_run(k, args.seed, d_in, 768) for k in ("ce", "mse")}
    return {
        "logit": {"ce_pull": round(ce_pull, 4), "mse_pull": round(mse_pull, 6),
                  "pull_ratio": round(ce_pull / mse_pull, 2),
                  "ce_steps_below_0.6": _logit_steps("ce"),
                  "mse_steps_below_0.6": _logit_steps("mse")},
        "value_head": {"ce_pull": round(head["ce"]["pull"], 6),
                       "mse_pull": round(head["mse"]["pull"], 6),
                       "pull_ratio": round(head["ce"]["pull"] / head["mse"]["pull"], 2),
                       "ce_steps_below_0.6": head["ce"]["steps_below_0.6"],
                       "mse_steps_below_0.6": head["mse"]["steps_below_0.6"]},
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128, help="critic batch (released: 128)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens kept per prompt")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up updates (cached path)")
    ap.add_argument("--cached-iters", type=int, default=20, help="timed cached updates")
    ap.add_argument("--recompute-iters", type=int, default=3,
                    help="timed re-encoding updates (about 10 s each on 2 CPUs)")
    ap.add_argument("--skip-update", action="store_true", help="skip (a), the slow part")
    ap.add_argument("--skip-minilm", action="store_true", help="skip (c)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    result: dict = {
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(), "machine": platform.machine(),
        "load_avg_1m_before": round(os.getloadavg()[0], 2),
    }
    result["toy"] = bench_toy(args)
    if not args.skip_minilm:
        result["minilm"] = bench_minilm(args)
    if not args.skip_update:
        result["update"] = bench_update(args)
    result["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    result["total_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
