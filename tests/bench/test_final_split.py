"""benchmarks/final_split.py: a report read into a row (true rates, gaps), the last checkpoint
of a run folder, and the commands planned for a grid arm (its settings, the checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import final_split

ROOT = Path(__file__).resolve().parents[2]


def test_a_report_becomes_a_row_of_true_rates_and_gaps():
    report = {"success_rate": 0.95, "true_success_rate": 0.90, "episodes": 96,
              "splits": {"final_phrasings": {"success_rate": 0.80, "true_success_rate": 0.75,
                                             "episodes": 48},
                         "unseen_phrasings": {"success_rate": 0.5, "episodes": 48}}}
    row = final_split.row_of(report, ("unseen_phrasings", "final_phrasings"))
    assert row["test"] == 90.0  # the truth, not the judge, where there is one
    assert row["final_phrasings"] == 75.0 and row["gap_final_phrasings"] == -15.0
    assert row["unseen_phrasings"] == 50.0 and row["gap_unseen_phrasings"] == -40.0
    assert row["episodes"] == {"test": 96, "unseen_phrasings": 48, "final_phrasings": 48}
    with pytest.raises(KeyError, match="no split 'unseen_products'"):
        final_split.row_of(report, ("unseen_products",))


def test_the_plan_evaluates_the_arms_start_and_its_last_checkpoint(tmp_path):
    spec = tmp_path / "g.json"
    spec.write_text(json.dumps({"seeds": [0, 1], "world": "webshop", "set": {"eval_every": 5},
                                "arms": [{"name": "a", "set": {"starting_policy": "sft",
                                                                "copy_typed_text": True}},
                                         {"name": "b"}]}))
    ck = tmp_path / "runs" / "g" / "a" / "seed1" / "checkpoints"
    for name in ("ckpt-00040", "ckpt-00041"):
        (ck / name / "policy").mkdir(parents=True)
    (ck / "latest").write_text("ckpt-00040\n")  # the run's own pointer wins over the names
    todo = final_split.plan(str(spec), ["a"], [1], {"a": tmp_path / "runs"},
                            ("start", "after"), ("final_phrasings",), tmp_path / "w")
    assert [(e["arm"], e["seed"], e["stage"]) for e in todo] == [("a", 1, "start"),
                                                                  ("a", 1, "after")]
    start, after = (e["command"] for e in todo)
    assert start[start.index("--policy") + 1] == "sft"
    assert after[after.index("--policy") + 1] == str(ck / "ckpt-00040" / "policy")
    for cmd in (start, after):
        assert cmd[cmd.index("--seed") + 1] == "1"
        sets = cmd[cmd.index("--set") + 1:]
        assert "copy_typed_text=true" in sets and "eval_every=5" in sets
        assert not any(s.startswith("starting_policy") for s in sets)
        assert cmd[cmd.index("--splits") + 1] == "final_phrasings"
    (ck / "latest").unlink()
    assert final_split.last_checkpoint(ck.parent) == ck / "ckpt-00041" / "policy"
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        final_split.last_checkpoint(tmp_path / "runs" / "g" / "a" / "seed0")
    with pytest.raises(SystemExit, match="no arm 'c'"):
        final_split.plan(str(spec), ["c"], None, {}, ("start",), (), tmp_path)
