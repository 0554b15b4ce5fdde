"""benchmarks/darwinx_evidence.py (issue 48, item 4): E1 by evidence kind from a DarwinX
grid's result files, on hand-made results whose numbers are counted by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import darwinx_evidence as de


def _stage(rates: dict[str, bool], rule: float = 0.0, splits: dict | None = None,
           kinds: dict | None = None) -> dict:
    k, n = sum(rates.values()), len(rates)
    st = {"success_rate": k / n, "n": n, "successes": k, "ci95": [0, 1], "mean_length": 5.0,
          "mean_length_success": 5.0, "failure_kinds": {}, "truth": "environment",
          "true_success_rate": k / n, "per_task": rates,
          "decided": {"agent": 1 - rule, "rule": rule, "xi": 0.0}}
    if splits:
        st["splits"] = splits
    if kinds:
        st["decided_by_kind"] = kinds
    return st


def _write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def test_gains_over_the_reference_arms_frozen_losses_and_rule_shares(tmp_path):
    """Arm ``all`` measures frozen (1 of 4 tasks, then 2 of 4); ``failure`` shares it at the
    same seeds. Gains: all +50 and +50 points, failure +25 and -25; failure lost t2 at
    seed 1 (frozen solved it); the split's gain is against the frozen stage's split."""
    spec = {"seeds": [0, 1], "recipe": "recipes/evolve_harness.py", "reference": "all",
            "stages": ["frozen", "evolved"],
            "arms": [{"name": "all"}, {"name": "failure", "set": {"baselines": False}}]}
    grids = tmp_path / "grids"
    _write(grids / "dx.json", spec)
    res = tmp_path / "results"
    T = ["t1", "t2", "t3", "t4"]

    def per(*won):
        return {t: t in won for t in T}

    sp_f = {"u": _stage({"a": False, "b": False})}
    frozen = {0: per("t1"), 1: per("t1", "t2")}
    evolved = {("all", 0): per("t1", "t2", "t3"), ("all", 1): per("t1", "t2", "t3", "t4"),
               ("failure", 0): per("t1", "t3"), ("failure", 1): per("t1")}
    for (arm, seed), ev in evolved.items():
        stages = {"evolved": _stage(ev, rule=0.2 if arm == "all" else 0.1,
                                    splits={"u": _stage({"a": True, "b": False})},
                                    kinds={"webshop level 1": {"agent": 0.5, "rule": 0.5,
                                                               "xi": 0.0, "episodes": 2,
                                                               "successes": 1}})}
        if arm == "all":
            stages["frozen"] = _stage(frozen[seed], splits=sp_f)
        _write(res / "dx" / f"{arm}-seed{seed}.json", {
            "grid": "dx", "arm": arm, "seed": seed, "stages": stages,
            "config": {"evidence": ["failure"] if arm == "failure" else
                       ["failure", "self", "teacher"], "accept": "gate"},
            "git": {"commit": "c" * 40},
            "evolution": {"edits": [{"kind": "skill", "id": "ind-dismiss-09769e"},
                                    {"kind": "skill", "id": "ind-tap-element-x-1a2b3c"}]}})
    t = de.evidence_table(str(grids / "dx.json"), res)
    a, f = t["arms"]["all"], t["arms"]["failure"]
    assert a["gain"]["per_seed"] == pytest.approx([0.5, 0.5])
    assert f["gain"]["per_seed"] == pytest.approx([0.25, -0.25])
    assert a["gain"]["mean"] == pytest.approx(0.5) and f["gain"]["mean"] == pytest.approx(0)
    assert a["frozen_solved_lost"] == [[], []] and f["frozen_solved_lost"] == [[], ["t2"]]
    assert a["split_gain"]["u"]["per_seed"] == pytest.approx([0.5, 0.5])
    assert a["rule_share"]["mean"] == pytest.approx(0.2)
    assert a["rule_share_by_kind"] == {"webshop level 1": 0.5}
    assert a["kept_edit_families"] == {"ind-dismiss": 2, "ind-tap-element-x": 2}
    md = de.markdown(t)
    assert "| failure | failure | gate | 2 | 37.5 | 37.5 | +0.0 [" in md
    assert "MIXED CODE" not in md


def test_edit_family_drops_only_the_hash():
    assert de.edit_family("ind-dismiss-09769e") == "ind-dismiss"
    assert de.edit_family("teach-type-search-box") == "teach-type-search-box"
    assert de.edit_family(None) == "(not a rule)"
