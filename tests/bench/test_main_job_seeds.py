"""benchmarks/main_job_seeds.py: the main job's stages over seeds, from run folders'
summary.json (true rates, splits, paired stage differences with t-intervals)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("main_job_seeds",
                                               ROOT / "benchmarks" / "main_job_seeds.py")
mjs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mjs)


def _summary(seed: int, rates: dict[str, tuple[float, float]]) -> dict:
    stages = {st: {"success_rate": 0.0, "true_success_rate": t,  # the true rate is read
                   "splits": {"unseen_products": {"success_rate": 0.0,
                                                  "true_success_rate": p}},
                   "success_with_recovery": 0.5}
              for st, (t, p) in rates.items()}
    return {"config": {"seed": seed}, "stages": stages, "wall_s": 1.0, "processes": 2}


def test_seeds_give_means_pairs_and_split_gaps(tmp_path):
    runs = []
    for seed, off in ((0, 0.5), (1, 0.6)):
        d = tmp_path / f"seed{seed}"
        d.mkdir()
        (d / "summary.json").write_text(json.dumps(_summary(seed, {
            "copier": (0.1, 0.05), "offline": (off, off - 0.1), "online": (0.8, 0.7)})))
        runs.append(d)
    out = tmp_path / "r.json"
    assert mjs.main([str(r) for r in runs] + ["--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["per_seed"]["1"]["offline"] == {"test": 60.0, "unseen_products": 50.0,
                                               "success_with_recovery": 0.5}
    assert res["mean_ci95"]["offline"]["test"][0] == 55.0
    lo, hi = res["mean_ci95"]["offline"]["test"][1:]
    assert lo < 55.0 < hi  # two different seeds: a real interval
    assert res["paired"]["online - offline"]["test"][0] == 25.0
    assert res["split_minus_test"]["online"]["unseen_products"] == [-10.0, -10.0, -10.0]


def test_a_folder_without_a_summary_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="summary.json"):
        mjs.main([str(tmp_path)])
