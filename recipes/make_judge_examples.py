"""Write the simulator's few-shot judge examples (assets/judge_examples/{webshop,general}).

    python recipes/make_judge_examples.py --seed 0    # -> digirl_lite/assets/judge_examples
"""

from __future__ import annotations

import argparse
from pathlib import Path

from digirl_lite.envs.sim.judge_examples import EXAMPLE_COUNTS, write_examples
from digirl_lite.paths import data_dir


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(data_dir() / "judge_examples"),
                    help="default: judge_examples/ in the package's assets (or "
                         "$DIGIRL_LITE_DATA)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for world in EXAMPLE_COUNTS:
        path = write_examples(world, Path(args.out) / world, seed=args.seed)
        print(path, sum(f.stat().st_size for f in path.iterdir()) // 1024, "kB")


if __name__ == "__main__":
    main()
