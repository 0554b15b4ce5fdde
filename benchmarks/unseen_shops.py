"""Where Web Shopping's unseen-products gap comes from: the split's tasks at shops no train
task names (issue 47, item 1).

For each run folder given (a grid's ``runs/grid/NAME/ARM/seedS``), each evaluation stage and
each list (the test list and the held-out splits), success is split by whether the task's
shop (its web address) is one the world's train list names. Pooled over the folders of
each arm (the folder's parent's name).

    python benchmarks/unseen_shops.py runs/grid/main_phrasestart_webshop/*/seed? \\
        --json benchmarks/results/unseen_shops_phrasestart.json
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

_SHOP = re.compile(r"[a-z0-9-]+\.(?:com|org|net)", re.I)


def shop(text: str) -> str | None:
    """The first web address of an instruction (lower case), None without one."""
    m = _SHOP.search(text)
    return m.group(0).lower() if m else None


def train_shops() -> set[str]:
    """The shops the Web Shopping train list names."""
    from digirl_lite.paths import data_dir

    lines = (data_dir() / "tasks" / "webshop_train.txt").read_text().splitlines()
    return {s for s in map(shop, lines) if s}


def tally(run_dirs: list[str], seen: set[str]) -> dict[str, Any]:
    """arm -> stage -> list -> {"train shop" | "new shop": [successes, episodes]}."""
    from digirl_lite.data.store import TrajectoryStore

    out: dict[str, Any] = defaultdict(lambda: defaultdict(lambda: defaultdict(
        lambda: defaultdict(lambda: [0, 0]))))
    for r in map(Path, run_dirs):
        for ev in sorted((r / "eval").iterdir()):
            stage, _, split = ev.name.partition("-")
            trajs, _ = TrajectoryStore.open(ev).load(with_images=False)
            for t in trajs:
                if t.true_success is None:  # no ground truth: not counted
                    continue
                where = shop(t.task)
                cell = out[r.parent.name][stage][split or "test"][
                    "no shop" if where is None else "train shop" if where in seen
                    else "new shop"]
                cell[0] += bool(t.true_success)
                cell[1] += 1
    return json.loads(json.dumps(out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders (runs/grid/NAME/ARM/seedS)")
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args(argv)
    seen = train_shops()
    report = {"train_shops": sorted(seen), "run_folders": args.runs,
              "arms": tally(args.runs, seen)}
    for arm, stages in report["arms"].items():
        for stage, lists in stages.items():
            print(f"{arm} {stage}: " + "; ".join(
                f"{lst} " + ", ".join(f"{k} {s}/{n} ({100 * s / n:.1f}%)"
                                     for k, (s, n) in sorted(cells.items()))
                for lst, cells in sorted(lists.items())))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
