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
from collections import defaultdict
from pathlib import Path
from typing import Any


def shop(text: str) -> str | None:
    """The shop an instruction names (a key of the simulator's ``catalog.SITES``), None for
    another kind of task."""
    from digirl_lite.envs.sim.tasks import parse_task

    return parse_task(text).site


def tally(run_dirs: list[str], seen: set[str]) -> dict[str, Any]:
    """arm -> stage -> list -> {"train shop" | "new shop" | "no shop": [successes,
    episodes]}."""
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
    from digirl_lite.envs.sim.catalog import TRAIN_SITES

    seen = set(TRAIN_SITES)  # the shops the train and test lists use
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
