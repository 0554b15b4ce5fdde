"""Why GRPO collapses on the simulator (issue 17, item 5): the balance of its token-mean loss.

    python benchmarks/grpo_token_balance.py runs/grid/learners_webshop/grpo/seed0

For every few online iterations of a GRPO run's store: the success rate, tokens per
trajectory, and the token-weighted mean of the group advantages
(:func:`digirl_lite.ppo.grpo_advantages`, population std) that the token-mean loss of
:func:`digirl_lite.policy.updates.ppo_update` applies. Negative means the update pushes the
tokens of failures down more than it pushes those of successes up (failures are longer).
"""

from __future__ import annotations

import argparse
import collections

import numpy as np


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", help="a GRPO run folder (its store/)")
    ap.add_argument("--every", type=int, default=3)
    args = ap.parse_args(argv)

    from digirl_lite import ppo
    from digirl_lite.data.store import TrajectoryStore

    trajs, _ = TrajectoryStore.open(f"{args.run}/store").load(with_images=False)
    by_it: dict[int, list] = collections.defaultdict(list)
    for t in trajs:
        if t.traj_id.startswith("online-"):
            by_it[int(t.traj_id.split("-it")[1].split("-")[0])].append(t)
    for it in sorted(by_it)[::args.every]:
        groups: dict[str, list] = collections.defaultdict(list)
        for t in by_it[it]:
            groups[t.task].append(t)
        weighted = tokens = pos = neg = 0.0
        for g in groups.values():
            for t, a in zip(g, ppo.grpo_advantages([t.final_reward for t in g])):
                n = sum(len(s.action_token_ids or ()) for s in t.steps)
                weighted += a * n
                tokens += n
                pos += n * (a > 0)
                neg += n * (a < 0)
        succ = np.mean([t.is_success for t in by_it[it]])
        print(f"iteration {it:2d}: success {succ:.2f}, tokens per trajectory "
              f"{tokens / len(by_it[it]):6.1f}, token-weighted mean advantage "
              f"{weighted / max(tokens, 1):+.3f} (tokens with A > 0: {pos:.0f}, A < 0: {neg:.0f})")


if __name__ == "__main__":
    main()
