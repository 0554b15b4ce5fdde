"""The main job's two hot loops on this machine, with the shipped starting policy: one
actor update (batch 128 of expert steps, the paper's gradient cap 0.01, AdamW) and one
batched sampling call (16 phones, temperature 1), plus a pile of attempts through the
Trainer's own fleet (phones, features, sampling, recording).

    python benchmarks/bench_actor.py --out benchmarks/results/bench_actor.json

``--profile`` prints torch's operator table for three updates and the share of their time
spent on vocabulary-wide tensors (``vocab_share``; issue 28's 6-minute analysis). Issue 16
(item 1) quotes it before and after the changes to :meth:`AutoUIPolicy.log_prob` (length
buckets, the head on real tokens only, no second loss) and :mod:`digirl_lite.policy.sampling`
(inverse-transform sampling in place of ``torch.multinomial``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--updates", type=int, default=10)
    ap.add_argument("--sample", type=int, default=16)
    ap.add_argument("--pile", type=int, default=64, help="pile attempts (0: skip)")
    ap.add_argument("--bf16", action="store_true",
                    help="the updates under actor_precision('bf16'), as the Trainer runs them")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from digirl_lite.envs.sim.demos import generate_demos
    from digirl_lite.paths import data_dir
    from digirl_lite.policy import AutoUIPolicy
    from digirl_lite.policy.updates import actor_precision, text_mle_update

    trajs, _, _ = generate_demos("webshop", n=60, seed=0)
    steps = [s for t in trajs for s in t.steps]
    p = AutoUIPolicy.load(data_dir() / "policies" / "sft-webshop")
    opt = torch.optim.AdamW(p.parameters(), lr=1e-4)
    rng = np.random.default_rng(0)
    feats = torch.from_numpy(np.random.default_rng(1).standard_normal(
        (len(steps), p.img_dim)).astype(np.float32))

    def batch(b: int):
        idx = rng.integers(0, len(steps), b)
        return ([steps[i].prompt for i in idx], feats[idx], [steps[i].action_text for i in idx])

    def update():
        return text_mle_update(p, opt, *batch(args.batch), 0.01)

    with actor_precision(p, "bf16" if args.bf16 else "fp32"):  # one region, as a phase
        for _ in range(2):
            update()
        t0 = time.perf_counter()
        for _ in range(args.updates):
            update()
        update_s = (time.perf_counter() - t0) / args.updates
        vocab_share = None
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                for _ in range(3):
                    update()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
            # the share of the update spent on the vocabulary: every op with a vocabulary-
            # wide input (the tied head's matmuls, log_softmax and its backward, their fills)
            v = str(p.model.config.vocab_size)
            times = [(v in str(e.input_shapes), e.self_cpu_time_total)
                     for e in prof.key_averages(group_by_input_shape=True)]
            vocab_share = sum(t for on, t in times if on) / max(1e-9, sum(t for _, t in times))

    pr, f, _ = batch(args.sample)
    p.act(pr, f, max_new_tokens=64)
    t0 = time.perf_counter()
    for k in range(5):
        p.act(pr, f, max_new_tokens=64, generator_seed=k)
    act_s = (time.perf_counter() - t0) / 5

    out = {"batch": args.batch, "bf16": args.bf16, "update_s": round(update_s, 3),
           "sample_batch": args.sample, "act_s": round(act_s, 3),
           "threads": torch.get_num_threads()}
    if vocab_share is not None:
        out.update(vocab=p.model.config.vocab_size, vocab_share=round(vocab_share, 3))
    if args.pile:
        from digirl_lite.train.config import sim_webshop
        from digirl_lite.train.trainer import Trainer

        tr = Trainer(sim_webshop(pile_size=args.pile), tempfile.mkdtemp(), cache_dir="")
        tr.build_starting_policy()
        t0 = time.perf_counter()
        pile = tr.build_pile()
        out.update(pile=args.pile, pile_s=round(time.perf_counter() - t0, 2),
                   pile_steps=sum(len(t) for t in pile),
                   pile_success=round(float(np.mean([t.is_success for t in pile])), 3))
    print(json.dumps(out))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
