"""benchmarks/harness_merge_table.py: the rates over seeds take Student's t quantile for
n - 1 degrees of freedom (the grid's :func:`~digirl_lite.viz.curves.mean_ci95`), at any
number of seeds (it took t = 2.262, 9 degrees of freedom, for every n above 5)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.harness_merge_table import table  # noqa: E402


def _record(seed: int, h0: float, merged: float) -> dict:
    family = {"solved": ["t1"], "tasks": ["t1", "t2"]}
    rate = {"success_rate": 0.5, "ci95": [0.3, 0.7]}
    return {"git": {"commit": "abc", "dirty": False}, "teacher": "privileged_expert",
            "command": f"python benchmarks/harness_merge.py --seed {seed}",
            "families": {"A": family, "B": family},
            "merge": {"union": ["t1"], "kept": True, "reason": ""},
            "held_out": {"H0": {"success_rate": h0, "ci95": [0.0, 1.0]},
                         "v1_family_A": rate, "v2_family_B": rate,
                         "merged": {"success_rate": merged, "ci95": [0.0, 1.0]}}}


def _row(text: str, arm: str) -> str:
    [row] = [line for line in text.splitlines() if line.startswith(f"| {arm} | ")]
    return row


def test_six_seeds_take_t_for_five_degrees_of_freedom():
    # H0: 10, 20, ..., 60 (%): mean 35, sd 18.708287; t(0.975, 5) = 2.570582
    # -> half 2.570582 * 18.708287 / sqrt(6) = 19.633 (2.262 gave 17.276: [17.7, 52.3])
    # merged - H0: 5, 5, 5, 5, 5, 35 (%): mean 10, sd 12.247449 -> half 12.853
    h0 = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    merged = [x + 0.05 for x in h0[:5]] + [0.95]
    text = table([_record(s, a, b) for s, (a, b) in enumerate(zip(h0, merged))])
    assert _row(text, "H0") == ("| H0 | 35.0 [15.4, 54.6] (n = 6) | +10.0 [-2.9, +22.9] "
                                "(+5.0, +5.0, +5.0, +5.0, +5.0, +35.0) |")


def test_three_seeds_keep_their_interval():
    # H0: 20, 40, 60 (%): mean 40, sd 20; t(0.975, 2) = 4.302653 -> half 49.683 (clipped)
    text = table([_record(s, a, a) for s, a in enumerate([0.2, 0.4, 0.6])])
    assert _row(text, "H0").startswith("| H0 | 40.0 [0.0, 89.7] (n = 3) | +0.0 [+0.0, +0.0]")
