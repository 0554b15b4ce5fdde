"""How far a policy has got, step by step (issue 18, item 5): its greedy action (constrained
decoding) on held-out steps of the expert's demonstrations (new products, a seed SFT never
saw), compared with the expert's: the action type, a tap within 0.05 of the expert's (both
coordinates, normalised), a TYPE with the same text.

    python benchmarks/policy_steps.py --policy DIR [--policy DIR ...] [--base VLM_DIR] \\
        --steps 120 --json benchmarks/results/vlm_steps.json

A policy directory is anything :func:`digirl_lite.policy.base.load_policy` opens (a saved
Auto-UI or VLM policy: e.g. the shipped ``policies/sft-webshop`` and a VLM run's cached
``sft-<key>``); ``--base``: a VLM policy's base model, if it moved. Auto-UI reads the
simulator encoder's 512-d features, a VLM the screenshot.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def match(pred, gold) -> dict[str, bool]:
    from digirl_lite.actions import ActionType

    same_type = pred.action_type == gold.action_type
    if not same_type:
        return {"type": False, "exact": False}
    if gold.action_type is ActionType.DUAL_POINT:
        ok = all(abs(a - b) <= 0.05 for a, b in zip(pred.touch_yx, gold.touch_yx))
    elif gold.action_type is ActionType.TYPE:
        ok = pred.typed_text == gold.typed_text
    else:
        ok = True
    return {"type": True, "exact": ok}


def main(argv: list[str] | None = None) -> dict:
    import numpy as np

    from digirl_lite.actions import parse_action
    from digirl_lite.envs.sim.demos import generate_demos
    from digirl_lite.policy.base import policy_inputs, policy_kind
    from digirl_lite.policy.factory import load_policy
    from digirl_lite.vision import FeatureCache, SimScreenEncoder

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", action="append", required=True)
    ap.add_argument("--base", default=None)
    ap.add_argument("--world", default="webshop")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    demos, screens, _ = generate_demos(args.world, n=max(4, args.steps // 6), seed=args.seed,
                                       varied_products=True)
    steps = [s for t in demos for s in t.steps][:args.steps]
    FeatureCache(SimScreenEncoder(dim=512, seed=0)).fill(screens)
    out = {"steps": len(steps), "seed": args.seed, "world": args.world, "policies": {}}
    for d in args.policy:
        kind = policy_kind(d)
        policy = load_policy(d, **({"base": args.base} if kind == "vlm" and args.base else {}))
        t0 = time.perf_counter()
        rows = []
        for a in range(0, len(steps), 8):
            chunk = steps[a:a + 8]
            inputs = policy_inputs(policy, [s.screen_id for s in chunk], screens)
            texts = policy.act([s.prompt for s in chunk], inputs, temperature=0.0,
                               max_new_tokens=64, constrained=True)
            rows += [match(parse_action(t), s.action) for t, s in zip(texts, chunk)]
        by_kind: dict[str, list[bool]] = {}
        for s, r in zip(steps, rows):
            by_kind.setdefault(s.action.action_type.value, []).append(r["exact"])
        res = {"kind": kind, "type_accuracy": float(np.mean([r["type"] for r in rows])),
               "exact_accuracy": float(np.mean([r["exact"] for r in rows])),
               "exact_by_expert_action": {k: [int(sum(v)), len(v)] for k, v in by_kind.items()},
               "seconds": round(time.perf_counter() - t0, 1)}
        out["policies"][str(d)] = res
        print(f"{d} ({kind}): type {res['type_accuracy']:.1%}, exact {res['exact_accuracy']:.1%}"
              f" of {len(steps)} held-out expert steps; by the expert's action "
              f"{res['exact_by_expert_action']}; {res['seconds']} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
