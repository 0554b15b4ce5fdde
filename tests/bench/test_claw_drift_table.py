"""benchmarks/claw_drift.py's table (issue 48, item 5): the ``both`` arm's policy evaluated
with its units off beside it with them, so that what units add at evaluation shows apart
from what they added in collection."""

from __future__ import annotations

from benchmarks import claw_drift


def _rate(k: int, n: int = 48, rule: float = 0.0) -> dict:
    return {"success_rate": k / n, "ci95": [0.1, 0.9], "successes": k, "judged_episodes": n,
            "decided": {"agent": 1 - rule, "rule": rule, "xi": 0.0}}


def test_the_table_shows_both_with_its_units_off(tmp_path):
    unit = {"id": "tap-consent-accept", "S": 0.3, "e": 0.25, "c": 0.4}
    days = [{"day": 1, "arms": {"frozen": _rate(30), "both": _rate(30)},
             "both_units_off": dict(_rate(30), same_as_with_units=True),
             "active_at_eval": {"both": []},
             "cycles": {"both": {"promoted": ["tap-consent-accept"], "evicted": []}},
             "updates": {"both": {"collect_success": 0.5}}},
            {"day": 2, "arms": {"frozen": _rate(7), "both": _rate(25, rule=0.02)},
             "both_units_off": _rate(21), "active_at_eval": {"both": [unit]},
             "cycles": {"both": {"promoted": [], "evicted": []}},
             "updates": {"both": {"collect_success": 0.35}}}]
    res = {"args": {"arms": ["frozen", "both"], "n_test": 48, "n_train": 20},
           "command": "c", "commit": "x", "seeds": [{"seed": 0, "days": days}]}
    path = tmp_path / "t.md"
    claw_drift.write_md(res, path)
    md = path.read_text()
    assert "| day | frozen | both | both, units off at evaluation | both: steps by rules |" in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| 1 |") or ln.startswith("| 2 |")]
    assert "(30/48) (no unit active) |" in rows[0]
    assert rows[1].split(" | ")[3].endswith("(21/48)") and "(25/48)" in rows[1].split(" | ")[2]
