"""Darwin-Claw as a library feature (issue 48, item 5): ClawRunConfig's checks, and a run
around the frozen policy end to end, killed after a cycle and resumed to the same result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from digirl_lite.errors import ConfigError
from digirl_lite.harness.claw.run import ClawRunConfig, run_claw, training_tasks

ROOT = Path(__file__).resolve().parents[2]
TINY = {"cycles": 2, "train_tasks": 4, "eval_tasks": 4, "n_envs": 4}


def test_fields_that_cannot_work_are_named_before_anything_runs():
    ClawRunConfig().check()
    for d, why in (({"triage": "oracle"}, "triage: 'oracle' is not one of"),
                   ({"triage": "llm"}, "triage_backend: the LLM triage needs a backend"),
                   ({"claw": {"ttl": 0}}, "claw: ClawConfig.ttl must be an int >= 1"),
                   ({"claw": {"slots": 2}}, "claw: unknown ClawConfig key"),
                   ({"cycles": 0}, "cycles: must be an int >= 1"),
                   ({"world": "maps"}, "world: 'maps' is not"),
                   ({"constrained_decoding": "yes"}, "constrained_decoding: must be true"),
                   ({"eval_splits": ["unseen_names"]}, "eval_splits: no split 'unseen_names'"),
                   ({"setting": "recipes/configs/paper_setting.json", "env": {"day": 2}},
                    "setting: a setting gives the phones"),
                   ({"env": {"privileged_state": True}}, "env: privileged_state")):
        with pytest.raises(ConfigError, match=why):
            ClawRunConfig.from_dict(d).check()
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['cycle'\]"):
        ClawRunConfig.from_dict({"cycle": 2})
    assert ClawRunConfig(eval_splits="unseen_products").eval_splits == ("unseen_products",)


def test_practice_never_draws_a_test_task():
    from digirl_lite.envs.sim.env import SimPhoneEnv

    for world in ("webshop", "general"):
        test = {t.text for t in SimPhoneEnv._load_task_list(f"{world}_test")}
        train = training_tasks(world)
        assert train and not test & set(train)


@pytest.mark.slow
def test_a_run_killed_after_a_cycle_resumes_to_the_same_result(tmp_path):
    """The frozen and claw stages on the same tasks and seeds, each cycle's report, the bank
    and its SKILL.md files; a run stopped after its first cycle and resumed gives the
    uninterrupted run's stages, cycles and units."""
    cfg = ClawRunConfig.from_dict(TINY)
    whole = run_claw(cfg, tmp_path / "whole", log=lambda *a: None)
    assert set(whole["stages"]) == {"frozen", "claw"}
    f, c = whole["stages"]["frozen"], whole["stages"]["claw"]
    assert f["judged_episodes"] == c["judged_episodes"] == 4
    assert set(f["per_task"]) == set(c["per_task"])  # the same held-out tasks
    assert f["decided"]["rule"] == 0.0 and f["rules"] == ""
    assert [r["cycle"] for r in whole["cycles"]] == [1, 2]
    for r in whole["cycles"]:
        assert r["collected"] == 4 and 0 <= r["collected_successes"] <= 4
    active = {u["id"] for u in whole["claw"]["active"]}
    assert len(c["rules"].splitlines()) == len(active)
    assert all(u in c["rules"] for u in active)
    bank = json.loads((tmp_path / "whole" / "bank.json").read_text())
    assert bank["format"] and (tmp_path / "whole" / "metrics.jsonl").read_text().count(
        '"stage": "cycle"') == 2
    if active:
        assert any((tmp_path / "whole" / "skills").rglob("SKILL.md"))
    assert whole["environment"]["packages"]["torch"]

    class Killed(Exception):
        pass

    def stop_after_cycle_1(msg: str) -> None:
        if msg.startswith("cycle 1:"):
            raise Killed

    with pytest.raises(Killed):
        run_claw(cfg, tmp_path / "cut", log=stop_after_cycle_1)
    assert not (tmp_path / "cut" / "summary.json").exists()
    with pytest.raises(ConfigError, match="not empty"):
        run_claw(cfg, tmp_path / "cut")
    again = run_claw(cfg, tmp_path / "cut", resume=True, log=lambda *a: None)
    for key in ("success_rate", "per_task", "rules"):
        assert again["stages"]["claw"][key] == c[key]
        assert again["stages"]["frozen"][key] == f[key]
    assert [r["promoted"] for r in again["cycles"]] == [r["promoted"] for r in whole["cycles"]]
    assert again["claw"]["active"] == whole["claw"]["active"]


@pytest.mark.slow
def test_the_recipe_runs_in_another_runs_setting(tmp_path):
    """``setting``: the paper setting's live phone and shipped starting policy, by config on
    the recipe's command line; a bad field is a one-line error, not a traceback."""
    import sys

    sys.path.insert(0, str(ROOT / "recipes"))
    try:
        from claw import main
    finally:
        sys.path.pop(0)
    s = main(["--out", str(tmp_path / "b"), "--quiet", "--set", "cycles=1", "train_tasks=4",
              "eval_tasks=4", "n_envs=4", f"setting={ROOT}/recipes/configs/paper_setting.json"])
    assert s["config"]["setting"].endswith("paper_setting.json")
    assert Path(s["policy"]).name == "sft-webshop" and s["stages"]["claw"]["episodes"] == 4
    with pytest.raises(SystemExit, match="config error: triage: 'x' is not one of"):
        main(["--out", str(tmp_path / "c"), "--set", "triage=x"])
