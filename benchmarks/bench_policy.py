"""The simulator preset policy on this machine: parameters, update time, sampling time.

    python benchmarks/bench_policy.py --batch 64 --updates 10

Uses real prompts and action strings from the scripted expert's demonstrations (random
image features of the preset's size: the cost does not depend on their values).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from digirl_lite.envs.sim.demos import generate_demos
from digirl_lite.policy import AutoUIPolicy


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--updates", type=int, default=10)
    ap.add_argument("--sample", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    trajs, _, _ = generate_demos("webshop", n=40, seed=0)
    steps = [s for t in trajs for s in t.steps]
    p = AutoUIPolicy.sim_preset(seed=0)
    opt = torch.optim.AdamW(p.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    lens = [len(p.tokenizer.encode(s.action_text)) for s in steps]

    def batch():
        idx = torch.randint(0, len(steps), (args.batch,), generator=g).tolist()
        return ([steps[i].prompt for i in idx], torch.randn(args.batch, p.img_dim),
                [steps[i].action_text for i in idx])

    for _ in range(2):  # warm-up
        pr, f, a = batch()
        loss = -p.log_prob(pr, f, a).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    t0 = time.perf_counter()
    for _ in range(args.updates):
        pr, f, a = batch()
        loss = -p.log_prob(pr, f, a).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(p.parameters(), 0.01)
        opt.step()
    update_s = (time.perf_counter() - t0) / args.updates
    pr, f, _ = batch()
    p.act(pr[: args.sample], f[: args.sample], max_new_tokens=48)
    t0 = time.perf_counter()
    for _ in range(3):
        p.act(pr[: args.sample], f[: args.sample], max_new_tokens=48)
    act_s = (time.perf_counter() - t0) / 3
    out = {"parameters": p.num_parameters(), "vocab": p.tokenizer.vocab_size,
           "action_tokens_mean": round(sum(lens) / len(lens), 1), "batch": args.batch,
           "update_s": round(update_s, 3), "sample_batch": args.sample,
           "act_s": round(act_s, 3), "threads": torch.get_num_threads()}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
