"""``python -m digirl_lite.judge calibrate``: a judge against human labels.

    python -m digirl_lite.judge calibrate --store runs/piles/webshop-seed0/pile \\
        --labels labels.csv --judge gemini --model gemini-1.5-pro \\
        --examples digirl_lite/assets/judge_examples/webshop --out report.json

The labels file is a CSV with columns ``id`` (a trajectory id of the store) and ``label``
(1/0, success/failure). Each labelled trajectory's final screen is judged (the screen before
it is the previous screenshot) and compared with its label. ``--judge stored`` compares
the verdicts already in the store (the judge that ran during collection) instead.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from digirl_lite.data import Verdict, load_trajectories
from digirl_lite.judge.calibration import calibrate


def _make_judge(args):
    from digirl_lite.judge.backends import GeminiBackend, OpenAIBackend
    from digirl_lite.judge.paper import FewShotSet, PaperJudge

    if args.judge == "gemini":
        backend = GeminiBackend(model=args.model or "gemini-1.5-pro",
                                api_key_env=args.api_key_env or "GEMINI_API_KEY",
                                base_url=args.base_url)
    else:
        if not args.model:
            raise SystemExit("--judge openai needs --model (the served model's name)")
        backend = OpenAIBackend(model=args.model, base_url=args.base_url,
                                api_key_env=args.api_key_env)
    examples = FewShotSet.load(args.examples) if args.examples else None
    # Guards off: each labelled trajectory is judged once, on its own.
    return PaperJudge(backend, examples, guards=False)


def read_labels(path: str | Path) -> dict[str, str]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or not {"id", "label"} <= set(reader.fieldnames):
            raise SystemExit(f"{path}: needs a header with the columns 'id' and 'label'")
        return {row["id"]: row["label"] for row in reader}


def cmd_calibrate(args) -> dict:
    labels = read_labels(args.labels)
    trajs, screens = load_trajectories(args.store)
    by_id = {t.traj_id: t for t in trajs}
    missing = [i for i in labels if i not in by_id]
    if missing:
        raise SystemExit(f"{len(missing)} labelled ids are not in {args.store}, "
                         f"e.g. {missing[0]!r}")
    judge = None if args.judge == "stored" else _make_judge(args)
    preds, ys, rows = [], [], []
    for tid, label in labels.items():
        t = by_id[tid]
        if not t.steps:
            continue
        last = t.steps[-1]
        if judge is None:
            verdict = last.verdict or (Verdict.SUCCESS if t.final_reward > 0 else Verdict.FAILURE)
            reply = last.judge_reply
        else:
            cur = screens.image(last.next_screen_id)
            prev = screens.image(last.screen_id)
            if cur is None:
                raise SystemExit(f"{args.store}: trajectory {tid!r} has no stored final screen")
            r = judge.judge(t.task, prev, cur)
            verdict, reply = r.verdict, r.reply
        preds.append(None if verdict is Verdict.UNJUDGED else verdict.value)
        ys.append(label)
        rows.append({"id": tid, "label": label, "verdict": verdict.value, "reply": reply})
    report = calibrate(preds, ys)
    report["judge"] = args.judge if judge is None else judge.config()
    report["store"] = str(args.store)
    out = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(out)
        Path(args.out).with_suffix(".verdicts.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))
    print(out)
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m digirl_lite.judge")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("calibrate", help="compare a judge with human labels")
    c.add_argument("--store", required=True, help="trajectory store directory")
    c.add_argument("--labels", required=True, help="CSV with columns id,label")
    c.add_argument("--judge", choices=["stored", "gemini", "openai"], default="stored")
    c.add_argument("--model")
    c.add_argument("--base-url")
    c.add_argument("--api-key-env", help="name of the environment variable with the key")
    c.add_argument("--examples", help="few-shot folder (images + labels.jsonl)")
    c.add_argument("--out", help="write the report (JSON) here")
    args = ap.parse_args(argv)
    if args.cmd == "calibrate":
        cmd_calibrate(args)


if __name__ == "__main__":
    main(sys.argv[1:])
