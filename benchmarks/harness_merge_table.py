"""E4's table over seeds: ``benchmarks/harness_merge.py``'s per-seed records side by side.

    python benchmarks/harness_merge_table.py benchmarks/results/harness/merge_seed*.json \\
        --out benchmarks/results/harness/merge.md

For each seed: the two families' variants (solved / tasks, held-out), whether the merged child
was kept (it must solve the union of their solved sets), what each parent alone solves of the
union at the merge check's seeds, and held-out pass@1 of H0, v1, v2 and the merge (Wilson 95%
intervals); then the held-out rates over seeds (mean with a 95% t-interval) and the merge's
difference from each parent, seed by seed. Refuses records from different commits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ARMS = ("H0", "v1_family_A", "v2_family_B", "merged")


def _on_union(cross: dict, union: list[str], name: str) -> str:
    got = set(cross.get(name, [])) & set(union)
    return f"{len(got)}/{len(union)}"


def _rate(record: dict, arm: str) -> str:
    h = record["held_out"].get(arm)
    if not h:
        return "-"
    lo, hi = h["ci95"]
    return f"{100 * h['success_rate']:.1f} [{100 * lo:.0f}, {100 * hi:.0f}]"


def table(records: list[dict]) -> str:
    commits = {r["git"]["commit"] + ("-dirty" if r["git"]["dirty"] else "") for r in records}
    if len(commits) > 1:
        raise SystemExit(f"the records come from different commits: {sorted(commits)}")
    from digirl_lite.harness.teachers import teacher_label
    from digirl_lite.viz.curves import mean_ci95  # the grid's: t(0.975, n - 1)

    # records from before the option ran with the simulator's expert
    teachers = {r.get("teacher", "privileged_expert") for r in records}
    lines = ["# E4: merging variants evolved on different task families (issue 30; "
             + ", ".join(teacher_label(t) for t in sorted(teachers)) + ")", "",
             f"Code: commit `{commits.pop()}`; one command per seed (`{records[0]['command']}`"
             " and its `--seed` siblings). Held-out: pass@1 on the first 96 Web Shopping test "
             "tasks, the same env seeds and sampling noise for the four harnesses of a seed.",
             "", "| seed | family A: solved | family B: solved | union | merge kept | v1 alone "
             "on the union | v2 alone on the union | H0 | v1 (A) | v2 (B) | merged |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        seed = r["command"].split("--seed ")[1].split()[0] if "--seed " in r["command"] else "0"
        fa, fb = r["families"]["A"], r["families"]["B"]
        union = r["merge"].get("union", [])
        cross = r.get("parents_on_the_union", {})

        lines.append(f"| {seed} | {len(fa['solved'])}/{len(fa['tasks'])} | "
                     f"{len(fb['solved'])}/{len(fb['tasks'])} | {len(union)} | "
                     f"{'yes' if r['merge']['kept'] else 'no: ' + r['merge']['reason']} | "
                     f"{_on_union(cross, union, 'A')} | {_on_union(cross, union, 'B')} | "
                     + " | ".join(_rate(r, a) for a in ARMS) + " |")
    lines += ["", "Over seeds (mean of the per-seed held-out rates, 95% t-interval, clipped to "
              "[0, 100]; a merge that was refused is still measured, so its row shows what "
              "keeping it would have given):", "",
              "| harness | held-out | merged minus it, seed by seed |", "|---|---|---|"]
    for a in ARMS:
        xs = [100 * r["held_out"][a]["success_rate"] for r in records if a in r["held_out"]]
        m, lo, hi = mean_ci95(xs)
        lo, hi = max(lo, 0.0), min(hi, 100.0)  # a rate's interval, clipped to [0, 100]
        diff = ""
        if a != "merged":
            ds = [100 * (r["held_out"]["merged"]["success_rate"] - r["held_out"][a]["success_rate"])
                  for r in records if a in r["held_out"] and "merged" in r["held_out"]]
            dm, dlo, dhi = mean_ci95(ds)
            diff = f"{dm:+.1f} [{dlo:+.1f}, {dhi:+.1f}] ({', '.join(f'{d:+.1f}' for d in ds)})"
        lines.append(f"| {a} | {m:.1f} [{lo:.1f}, {hi:.1f}] (n = {len(xs)}) | {diff} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+")
    ap.add_argument("--out", default="benchmarks/results/harness/merge.md")
    args = ap.parse_args(argv)
    records = [json.loads(Path(f).read_text()) for f in args.records]
    text = table(records)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
