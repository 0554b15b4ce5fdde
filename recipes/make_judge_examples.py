"""Write the simulator's few-shot judge examples (data/judge_examples/{webshop,general}).

    python recipes/make_judge_examples.py --out data/judge_examples --seed 0
"""

from __future__ import annotations

import argparse
from pathlib import Path

from digirl_lite.envs.sim.judge_examples import EXAMPLE_COUNTS, write_examples


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="data/judge_examples")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for world in EXAMPLE_COUNTS:
        path = write_examples(world, Path(args.out) / world, seed=args.seed)
        print(path, sum(f.stat().st_size for f in path.iterdir()) // 1024, "kB")


if __name__ == "__main__":
    main()
