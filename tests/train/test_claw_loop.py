"""Darwin-Claw around the learning policy (``claw``, digirl_lite/train/claw.py): the units
act in collection and evaluation, a cycle follows each update, the bank survives a resume,
and a config that cannot work is refused naming its field."""

from __future__ import annotations

import json

import pytest

from digirl_lite.errors import ConfigError
from digirl_lite.harness.claw import ExperienceUnit
from digirl_lite.train.config import sim_quick

CLAW = {"claw": True, "ui_tree": True, "iterations": 1, "pile_size": 8,
        "rollouts_per_iteration": 6, "eval_tasks": 6, "offline_critic_updates": 2,
        "offline_actor_updates": 2, "actor_updates": 2, "critic_updates": 1,
        "sim_surprises": {"popup": 1.0}}


@pytest.mark.parametrize("overrides,field", [
    ({"claw": True}, "ui_tree"),
    ({"claw": True, "ui_tree": True, "claw_triage": "oracle"}, "claw_triage"),
    ({"claw": True, "ui_tree": True, "claw_triage": "llm"}, "claw_triage_backend"),
    ({"claw": True, "ui_tree": True, "claw_options": {"ttl": 0}}, "claw_options"),
    ({"claw": True, "ui_tree": True, "claw_options": {"slots": 3}}, "claw_options"),
    ({"claw_options": {"ttl": 2}}, "claw_options"),  # no effect without claw
    ({"claw": True, "ui_tree": True, "learner": "async", "fleet": "async"}, "claw"),
])
def test_a_claw_config_that_cannot_work_names_its_field(overrides, field):
    with pytest.raises(ConfigError, match=field):
        sim_quick(**overrides)


def _pin_popup_close(trainer) -> str:
    """A unit that taps a pop-up's close button, pinned active (as a user may pin one)."""
    u = ExperienceUnit("tap-popup-close", {"element": {"id": "popup:close"}},
                       {"tap": {"id": "popup:close"}}, "explore")
    trainer.claw.bank.admit(u, cycle=0)
    trainer.claw.bank.pin(u.id)
    return u.id


@pytest.mark.slow
def test_units_act_in_collection_and_evaluation_and_the_bank_resumes(tmp_path):
    from digirl_lite.data.store import load_trajectories
    from digirl_lite.train.trainer import Trainer

    cfg = sim_quick(**CLAW)
    out = tmp_path / "run"
    tr = Trainer(cfg, out, cache_dir=tmp_path / "cache", progress=False)
    uid = _pin_popup_close(tr)
    tr.run(online=True)

    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    cycles = [x for x in lines if x["stage"] == "claw"]
    assert [c["iteration"] for c in cycles] == [1]  # a cycle after the update
    assert all(c["collected"] >= 1 and uid in c["active"] for c in cycles)
    online = [x for x in lines if x["stage"] == "online"]
    assert all(x["unit_steps"] > 0 for x in online)  # pop-ups on every load: the unit acts
    assert all("claw" in x["time_split"] for x in online)

    trajs, _ = load_trajectories(out / "store")
    unit_steps = [s for t in trajs for s in t.steps if s.decided_by == f"rule:eu:{uid}"]
    assert unit_steps and all(s.action.is_valid for s in unit_steps)
    assert not any(s.decided_by for t in trajs if t.source.value == "offline"
                   for s in t.steps)  # the pile is the starting policy's own

    summary = json.loads((out / "summary.json").read_text())
    final = summary["stages"]["online"]
    assert final["decided"]["rule"] > 0  # units at evaluation
    off = final["units_off"]  # and the policy alone, on the same tasks
    assert off["decided"]["rule"] == 0 and off["episodes"] == final["episodes"]
    assert uid in [u["id"] for u in summary["claw"]["active"]]
    assert (out / "claw" / "bank.json").is_file()
    assert list((out / "claw" / "skills").glob("*/SKILL.md"))

    latest = (out / "checkpoints" / "latest").read_text().strip()
    assert (out / "checkpoints" / latest / "claw_bank.json").is_file()
    again = Trainer(cfg, out, cache_dir=tmp_path / "cache", progress=False)
    assert again.load_checkpoint()
    assert uid in [u.id for u in again.claw.bank.active()]
    again.close()


@pytest.mark.slow
def test_with_no_active_unit_the_run_is_the_run_without_claw(tmp_path):
    """An empty bank wraps nothing: the online collection is the same, step for step."""
    from digirl_lite.data.store import load_trajectories
    from digirl_lite.train.trainer import Trainer

    runs = {}
    for name, claw in (("off", False), ("on", True)):
        cfg = sim_quick(**{**CLAW, "claw": claw})
        tr = Trainer(cfg, tmp_path / name, cache_dir=tmp_path / "cache", progress=False)
        if claw:  # a triage that writes nothing: the bank stays empty
            tr.claw.triage = _NoUnits()
        tr.online_iteration(1)  # from the starting policy, no offline phase
        tr.close()
        trajs, _ = load_trajectories(tmp_path / name / "store")
        runs[name] = [(t.task, [s.action_text for s in t.steps]) for t in trajs]
    assert runs["on"] and runs["on"] == runs["off"]
    lines = (tmp_path / "on" / "metrics.jsonl").read_text()
    assert '"stage": "claw"' in lines and '"active": []' in lines


class _NoUnits:
    name = "none"

    def triage(self, traces, cycle, bank=None):
        from digirl_lite.harness.claw import TriageResult

        return TriageResult(discarded={t.id: "test: nothing" for t in traces})
