"""Darwin-Claw experience units (issue 30, item 4; spec/DARWIN.md section C): the score on
the spec's worked numbers, causal validation, the nursery / active / evicted state machine
(promotion, TTL, slot competition, persistent negative effect, pin, user evict), the bank's
JSON, SKILL.md blocks (and their errors, naming file and line), the scripted triage's
patterns, grounding, the LLM triage against a local OpenAI-protocol server, and a cycle on
the simulator with a scripted agent that ignores pop-ups.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from digirl_lite.actions import Action, ActionType, format_action
from digirl_lite.envs.uitree import UINode, tree_text
from digirl_lite.harness.claw import (
    ClawConfig,
    ClawError,
    ExperienceBank,
    ExperienceUnit,
    FleetRunner,
    LLMTriage,
    ScriptedTriage,
    Trace,
    Validation,
    ValidationEpisode,
    check_grounded,
    read_skill_md,
    score,
    scripted_triage,
    skill_edit,
    skill_rules,
    traces_from_episodes,
    validate,
    write_skill_md,
)
from digirl_lite.harness.evidence import EvidenceStep
from digirl_lite.harness.harness import H0_COMPONENTS, Harness, HarnessAgent

W, H = 1080, 2280


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------
def unit(uid: str, subtype: str = "exploit", el: str | None = None, **kw) -> ExperienceUnit:
    """A unit tapping element ``el`` (default: the id) when it is on screen."""
    el = el or uid
    return ExperienceUnit(uid, {"element": {"id": el}}, {"tap": {"id": el}}, subtype, **kw)


def verdict(eu_id: str, e: float, c: float = 0.5, eta: float = 0.0) -> Validation:
    return Validation(eu_id, True, e, c, eta, score(e, c, eta))


ROOT = UINode("", "android.widget.FrameLayout", "", (0, 0, W, H))
PAGE = (ROOT, UINode("search_box", "android.widget.EditText", "Search", (60, 400, 1020, 520),
                     clickable=True),
        UINode("result:0", "android.view.ViewGroup", "usb c cable", (0, 600, W, 800),
               clickable=True))
POPUP = PAGE + (
    UINode("popup:box", "android.widget.FrameLayout", "Sign up for deals!", (90, 700, 990, 1500)),
    UINode("popup:close", "android.widget.ImageButton", "X", (860, 720, 970, 830),
           clickable=True),
    UINode("popup:nothanks", "android.widget.Button", "No thanks", (190, 1300, 890, 1430),
           clickable=True))
VOICE = PAGE + (
    UINode("voice:box", "android.widget.FrameLayout", "Listening...", (0, 60, W, H)),
    UINode("voice:cancel", "android.widget.ImageButton", "X", (30, 110, 170, 250),
           clickable=True))


def tap(node: UINode) -> str:
    x, y = node.center
    return format_action(Action.tap(x=round(x / W, 4), y=round(y / H, 4)))


BACK = format_action(Action.key(ActionType.PRESS_BACK))
SEARCH = tap(PAGE[1])


def trace(tid: str, success: bool, screens, actions, changed=None, valid=None,
          with_nodes: bool = True) -> Trace:
    changed = changed or [True] * len(actions)
    valid = valid or [True] * len(actions)
    steps = tuple(EvidenceStep(i, tree_text(s), a, "agent", v, ch)
                  for i, (s, a, ch, v) in enumerate(zip(screens, actions, changed, valid)))
    return Trace(tid, 'Go to shop.example, search for "usb c cable"', success, steps,
                 tuple(screens) if with_nodes else ())


def worked_runner():
    """DARWIN.md C's numbers over 100 episodes of 10 steps. Without any unit: every other
    episode succeeds, 3 invalid steps in each of the first 40. Unit ``a`` acts in the first
    40 (28 succeed, 2 invalid steps each); unit ``b`` in the first 80 (32 succeed, the
    invalid steps unchanged); any other unit never acts."""
    def run(extra: str, tasks_seeds):
        rid = json.loads(extra)["id"] if extra.strip() else None
        out = []
        for k, (t, s) in enumerate(tasks_seeds):
            success, invalid, hits = k % 2 == 0, 3 if k < 40 else 0, ()
            if rid == "eu:a" and k < 40:
                success, invalid, hits = k < 28, 2, (rid,)
            if rid == "eu:b" and k < 80:
                success, hits = k < 32, (rid,)
            out.append(ValidationEpisode(t, s, success, 10, invalid, frozenset(hits)))
        return out
    return run


TS = [(f"task {k}", 1000 + k) for k in range(100)]


# ---------------------------------------------------------------------------------------
# score and causal validation (DARWIN.md C's worked numbers)
# ---------------------------------------------------------------------------------------
def test_score_worked_numbers():
    assert score(0.2, 0.4, 0.1) == pytest.approx(0.25)  # 0.12 + 0.12 + 0.01
    assert score(-0.1, 0.8, 0.0) == pytest.approx(0.18)  # -0.06 + 0.24
    assert score(0.2, 0.4, 0.1, (1, 0, 0)) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="weights"):
        score(0.1, 0.1, 0.1, (0.5, 0.5))


def test_validate_worked_numbers():
    """Hit in 40 of 100 episodes, completion 0.5 -> 0.7 and invalid actions 0.3 -> 0.2 per
    step on those: e = 0.2, c = 0.4, eta = 0.1, S = 0.25. The other: e = -0.1, c = 0.8,
    eta = 0: S = 0.18."""
    a, b = unit("a"), unit("b")
    runner = worked_runner()
    va = validate(a, runner, TS)
    assert va.relevant and (va.hits, va.episodes, va.pairs) == (40, 100, 40)
    assert (va.e, va.c, va.eta, va.S) == pytest.approx((0.2, 0.4, 0.1, 0.25))
    assert (va.rate_without, va.rate_with) == pytest.approx((0.5, 0.7))
    vb = validate(b, runner, TS)
    assert (vb.e, vb.c, vb.eta, vb.S) == pytest.approx((-0.1, 0.8, 0.0, 0.18))
    # relevance first: a unit whose rule never acts gets no verdict
    vc = validate(unit("c"), runner, TS)
    assert not vc.relevant and vc.c == 0.0 and vc.hits == 0
    with pytest.raises(ValueError, match="twice"):
        validate(a, runner, TS + TS[:1])


def test_validate_reads_runner_outcomes_with_decided_counts_and_skips_infra():
    """An outcome reporting who decided (``decided``: ``{"rule:eu:x": n}``) works like
    ``hits``; an episode cut by an infrastructure fault counts nowhere."""
    class Decided:
        def __init__(self, task, seed, success, decided):
            self.task, self.seed, self.success, self.decided = task, seed, success, decided
            self.steps, self.invalid = 5, 0

    def run(extra, ts):
        on = bool(extra.strip())
        return [Decided("t0", 0, on, {"rule:eu:x": 2} if on else {"agent": 5}),
                Decided("t1", 1, None, {"rule:eu:x": 1} if on else {}),  # infra: left out
                Decided("t2", 2, False, {"agent": 5})]

    v = validate(unit("x"), run, [("t0", 0), ("t1", 1), ("t2", 2)])
    assert (v.hits, v.episodes, v.pairs) == (1, 2, 1)
    assert (v.e, v.c) == pytest.approx((1.0, 0.5))


def test_worked_numbers_through_cycles_second_unit_never_promoted_then_ttl():
    """The S = 0.25 unit is promoted at once; the S = 0.18 one (larger coverage, negative
    effect) is never promoted and is evicted when its TTL runs out."""
    bank = ExperienceBank(ClawConfig(ttl=2))
    runner = worked_runner()
    r0 = bank.cycle([], runner, TS, triage=lambda traces, cycle: [unit("a"), unit("b")])
    assert r0["admitted"] == ["a", "b"] and r0["active"] == ["a"] and r0["nursery"] == ["b"]
    assert r0["validations"]["a"]["S"] == pytest.approx(0.25)
    assert r0["validations"]["b"]["S"] == pytest.approx(0.18)
    r1 = bank.cycle([], runner, TS, triage=lambda traces, cycle: [])
    b = bank.get("b")
    assert b.state == "evicted" and "TTL expired" in b.note and b.S == pytest.approx(0.18)
    assert r1["active"] == ["a"] and bank.cycle_no == 2
    assert not [e for e in bank.log if e["eu"] == "b" and e["event"] == "promoted"]
    assert [u.id for u in bank.archive()] == ["b"]


# ---------------------------------------------------------------------------------------
# the units and the state machine
# ---------------------------------------------------------------------------------------
def test_unit_to_rule_and_refusals():
    eu = unit("tap-popup-close", el="popup:close")
    rule = eu.to_rule()
    assert rule.id == "eu:tap-popup-close" and rule.do == {"tap": {"id": "popup:close"}}
    with pytest.raises(ClawError, match="do 'jump'"):
        ExperienceUnit("x", {}, "jump")
    with pytest.raises(ClawError, match="unknown condition"):
        ExperienceUnit("x", {"weather": "rain"}, "back")
    with pytest.raises(ClawError, match="subtype"):
        ExperienceUnit("x", {}, "back", "exploitative")
    with pytest.raises(ClawError, match="id"):
        ExperienceUnit("no spaces please", {}, "back")
    with pytest.raises(ClawError, match="unit 3: unknown key"):
        ExperienceUnit.from_dict({"id": "x", "trigger": {}, "strategy": "back", "colour": 1},
                                 "unit 3")


def test_promotion_needs_positive_effect():
    bank = ExperienceBank()
    for uid in ("up", "flat", "down"):
        assert bank.admit(unit(uid)) == ("admitted", uid)
    bank.judge(verdict("up", 0.1))
    bank.judge(verdict("flat", 0.0, c=0.9))
    bank.judge(verdict("down", -0.2, c=1.0))
    assert [u.id for u in bank.active()] == ["up"]
    assert {u.id for u in bank.nursery()} == {"flat", "down"}
    bank.judge(Validation("flat", False, 0.0, 0.0, 0.0, 0.0))  # not relevant: no verdict
    flat = bank.get("flat")  # its last relevant record stays whole (S agrees with e, c, eta)
    assert flat.state == "nursery" and flat.c == 0.9 and "not relevant" in flat.note


def test_ttl_evicts_nursery_units():
    bank = ExperienceBank(ClawConfig(ttl=2))
    bank.admit(unit("old"), cycle=0)
    bank.admit(unit("young"), cycle=1)
    assert bank.expire(0) == []
    out = bank.expire(1)  # "old" has been in the nursery for cycles 0 and 1
    assert [e["eu"] for e in out] == ["old"] and bank.get("old").state == "evicted"
    assert "TTL expired" in bank.get("old").note and bank.get("young").state == "nursery"
    bank.judge(verdict("young", 0.3), cycle=2)  # promoted: no TTL for active units
    assert bank.expire(5) == [] and bank.get("young").state == "active"


def test_slot_competition_on_s():
    bank = ExperienceBank(ClawConfig(exploit_slots=3, explore_slots=1))
    for uid, e in (("a", 0.1), ("b", 0.2), ("c", 0.3)):
        bank.admit(unit(uid))
        bank.judge(verdict(uid, e))
    assert {u.id for u in bank.active(subtype="exploit")} == {"a", "b", "c"}
    bank.admit(unit("d"))
    bank.judge(verdict("d", 0.15))  # S 0.24 beats a's 0.21: a is displaced and archived
    assert bank.get("d").state == "active" and bank.get("a").state == "evicted"
    assert "displaced" in bank.get("a").note and "'d'" in bank.get("a").note
    bank.admit(unit("weak"))
    bank.judge(verdict("weak", 0.01))  # e > 0 but S loses: waits in the nursery
    assert bank.get("weak").state == "nursery" and "does not beat" in bank.get("weak").note
    # explore slots are apart: one free explore slot, then a competition there too
    bank.admit(unit("x1", "explore"))
    bank.judge(verdict("x1", 0.05))
    bank.admit(unit("x2", "explore"))
    bank.judge(verdict("x2", 0.04))
    assert bank.get("x1").state == "active" and bank.get("x2").state == "nursery"
    assert len(bank.active(subtype="exploit")) == 3
    # slots are per skill
    bank.admit(unit("other", skill="webshop"))
    bank.judge(verdict("other", 0.01))
    assert bank.get("other").state == "active"


def test_active_unit_evicted_after_persistent_negative_effect():
    bank = ExperienceBank(ClawConfig(evict_after=2))
    bank.admit(unit("u"))
    bank.judge(verdict("u", 0.2))
    bank.judge(verdict("u", -0.1))
    assert bank.get("u").state == "active" and bank.get("u").negative == 1
    bank.judge(verdict("u", 0.0))  # the streak is broken
    bank.judge(verdict("u", -0.1))
    assert bank.get("u").state == "active"
    bank.judge(verdict("u", -0.3))
    assert bank.get("u").state == "evicted" and "negative effect in 2" in bank.get("u").note


def test_pin_keeps_a_unit_active_and_never_evicted():
    bank = ExperienceBank(ClawConfig(ttl=1, evict_after=1, exploit_slots=2))
    bank.admit(unit("p"))
    bank.pin("eu:p")  # the rule id works too
    assert bank.get("p").state == "active" and bank.get("p").pinned
    for _ in range(3):
        bank.judge(verdict("p", -0.5))
    bank.expire(10)
    assert bank.get("p").state == "active"
    # it holds its slot: one slot is left for the competition, and p is never displaced
    for uid, e in (("a", 0.1), ("b", 0.2)):
        bank.admit(unit(uid))
        bank.judge(verdict(uid, e))
    assert bank.get("a").state == "evicted" and "displaced" in bank.get("a").note
    assert {u.id for u in bank.active()} == {"p", "b"}
    # pinning a unit of a full slot set displaces the lowest unpinned one
    bank.admit(unit("q"))
    bank.pin("q")
    assert {u.id for u in bank.active()} == {"p", "q"} and bank.get("b").state == "evicted"
    bank.unpin("q")
    assert bank.get("q").state == "active" and not bank.get("q").pinned


def test_user_evict_and_pin_back():
    bank = ExperienceBank()
    bank.admit(unit("u"))
    bank.pin("u")
    bank.evict("u")  # the user may evict a pinned unit
    assert bank.get("u").state == "evicted" and not bank.get("u").pinned
    assert bank.log[-1]["event"] == "evicted" and bank.log[-1]["why"] == "by the user"
    assert bank.admit(unit("u2", el="u")) == ("archived", "u")  # not re-admitted on its own
    bank.pin("u")  # ... but the user may bring it back
    assert bank.get("u").state == "active"
    with pytest.raises(ClawError, match="no experience unit 'nope'"):
        bank.evict("nope")


def test_nursery_capacity_and_dedupe():
    bank = ExperienceBank(ClawConfig(nursery_capacity=2))
    assert bank.admit(unit("a", provenance={"traces": ["t1"]}))[0] == "admitted"
    st, eid = bank.admit(unit("again", el="a", provenance={"traces": ["t2"]},
                              keywords=["pop-up"]))
    assert (st, eid) == ("merged", "a")
    assert bank.get("a").provenance["traces"] == ["t1", "t2"]
    assert bank.get("a").keywords == ["pop-up"]
    bank.admit(unit("b"))
    with pytest.raises(ClawError, match="nursery is full"):
        bank.admit(unit("c"))
    # an id already taken by another unit is made unique
    bank.judge(verdict("a", 0.2))
    assert bank.admit(ExperienceUnit("a", {"last_action": "no_change"}, "back")) == \
        ("admitted", "a-2")


def test_bank_save_load_roundtrip_and_bad_files(tmp_path):
    bank = ExperienceBank(ClawConfig(ttl=4, weights=(0.5, 0.4, 0.1)))
    bank.admit(unit("a"))
    bank.admit(unit("b", "explore"))
    bank.judge(verdict("a", 0.2))
    bank.evict("b")
    bank.cycle_no = 3
    path = bank.save(tmp_path / "claw" / "bank.json")
    assert [p.name for p in path.parent.iterdir()] == ["bank.json"]  # no temp file left
    back = ExperienceBank.load(path)
    assert back.as_dict() == bank.as_dict()
    assert back.config.weights == (0.5, 0.4, 0.1) and back.get("b").state == "evicted"
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "digirl-claw-bank",\n "units": [}\n')
    with pytest.raises(ClawError, match=r"bad.json, line 2: not JSON"):
        ExperienceBank.load(bad)
    d = bank.as_dict()
    d["units"][1]["strategy"] = "fly"
    bad.write_text(json.dumps(d))
    with pytest.raises(ClawError, match=r"bad.json, unit 2: .*do 'fly'"):
        ExperienceBank.load(bad)


# ---------------------------------------------------------------------------------------
# SKILL.md
# ---------------------------------------------------------------------------------------
def small_bank() -> ExperienceBank:
    bank = ExperienceBank()
    bank.admit(unit("tap-popup-close", el="popup:close", keywords=["sign up for deals!"],
                    provenance={"cycle": 0, "traces": ["t1", "t2"], "triage": "scripted",
                                "pattern": "recovery"}))
    bank.admit(ExperienceUnit("unstick-back", {"last_action": "repeated_no_change"}, "back",
                              "explore"))
    bank.admit(unit("waiting", "explore", el="popup:nothanks"))
    bank.admit(unit("shop-only", skill="webshop", el="consent:accept"))
    bank.judge(Validation("tap-popup-close", True, 0.2, 0.4, 0.1, score(0.2, 0.4, 0.1)))
    bank.judge(verdict("unstick-back", 0.1))
    bank.judge(verdict("shop-only", 0.3))
    bank.cycle_no = 1
    return bank


def test_skill_md_round_trip_and_harness_loads_it(tmp_path):
    bank = small_bank()
    paths = write_skill_md(bank, tmp_path / "skills")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in paths) == [
        "skills/phone/SKILL.md", "skills/webshop/SKILL.md"]
    text = (tmp_path / "skills" / "phone" / "SKILL.md").read_text()
    assert "### eu:tap-popup-close (exploit, active, S=0.25)" in text
    assert "### eu:waiting (explore, nursery, S=n/a)" in text
    assert "When an element `popup:close` is on screen: tap `popup:close`." in text
    assert "from traces t1, t2 (scripted triage, pattern recovery)" in text
    assert text.index("## Active") < text.index("eu:tap-popup-close") < \
        text.index("## Nursery") < text.index("eu:waiting")
    back = read_skill_md(tmp_path / "skills" / "phone" / "SKILL.md")
    assert [u.as_dict() for u in back] == [
        bank.get(i).as_dict() for i in ("tap-popup-close", "unstick-back", "waiting")]
    # the harness loads the active units (best S first), never the nursery
    from_files = skill_rules(tmp_path / "skills")
    assert from_files == skill_rules(bank)
    ids = [json.loads(line)["id"] for line in from_files.splitlines()]
    assert ids == ["eu:shop-only", "eu:tap-popup-close", "eu:unstick-back"]
    agent = HarnessAgent({**H0_COMPONENTS, "skills": from_files}, agent=None)
    assert [r.id for r in agent.rules] == ids
    child = Harness().extend([skill_edit(bank)])
    assert child.components["skills"] == from_files
    # a unit pinned or evicted is re-written: the file never keeps a stale active unit
    bank.evict("shop-only")
    write_skill_md(bank, tmp_path / "skills")
    assert "eu:shop-only" not in skill_rules(tmp_path / "skills")
    assert "No active unit." in (tmp_path / "skills" / "webshop" / "SKILL.md").read_text()


def test_skill_md_bad_blocks_name_file_and_line(tmp_path):
    good = json.dumps(unit("ok").as_dict(), indent=2).splitlines()
    lines = ["# Skill: phone", "", "### eu:ok", "```json", *good, "```", "",
             "### eu:broken", "```json", "{", '  "id": "broken"', '  "trigger": {}', "}", "```",
             "", "### eu:bad-do", "```json",
             '{"id": "bad-do", "trigger": {}, "strategy": "teleport"}', "```"]
    path = tmp_path / "phone" / "SKILL.md"
    path.parent.mkdir()
    path.write_text("\n".join(lines) + "\n")
    broken_line = lines.index('  "trigger": {}') + 1  # 1-based: where the comma is missing
    with pytest.raises(ClawError, match=rf"SKILL.md, line {broken_line}: not JSON"):
        read_skill_md(path)
    errors: list[ClawError] = []
    units = read_skill_md(path, errors)  # the rest goes on
    assert [u.id for u in units] == ["ok"] and units[0].skill == "phone"
    assert len(errors) == 2
    fence = lines.index('{"id": "bad-do", "trigger": {}, "strategy": "teleport"}')  # 1-based
    assert f"SKILL.md, line {fence}:" in str(errors[1]) and "teleport" in str(errors[1])
    path.write_text("```json\n{}\n")
    with pytest.raises(ClawError, match=r"line 1: a ```json block that is never closed"):
        read_skill_md(path)
    errs: list[ClawError] = []
    assert skill_rules(tmp_path, errs) == "" and len(errs) == 1


# ---------------------------------------------------------------------------------------
# triage
# ---------------------------------------------------------------------------------------
def test_scripted_triage_keeps_learnable_patterns_only():
    close = POPUP[4]
    recovered = trace("t-recovered", True, [POPUP, PAGE, PAGE], [tap(close), SEARCH, SEARCH])
    stuck = trace("t-stuck", False, [POPUP] * 3, [SEARCH] * 3, changed=[False] * 3)
    voice = trace("t-voice", True, [VOICE, PAGE], [BACK, SEARCH])
    garbled = trace("t-garbled", False, [PAGE, PAGE], ["tap the thing", SEARCH],
                    changed=[False, True], valid=[False, True])
    clean = trace("t-clean", True, [PAGE, PAGE], [SEARCH, SEARCH])
    res = ScriptedTriage().triage([recovered, stuck, voice, garbled, clean], cycle=4)
    assert res.discarded == {"t-clean": "clean success"}
    assert res.kept == {"t-recovered": ["recovery"], "t-stuck": ["overlay", "stuck"],
                        "t-voice": ["recovery"], "t-garbled": ["unparseable"]}
    by = {u.id: u for u in res.units}
    assert set(by) == {"tap-popup-close", "unstick-back", "back-on-voice-box"}
    pc = by["tap-popup-close"]  # seen working in t-recovered, guessed in t-stuck: one unit
    assert pc.trigger == {"element": {"id": "popup:close"}}
    assert pc.strategy == {"tap": {"id": "popup:close"}} and pc.subtype == "exploit"
    assert pc.provenance == {"cycle": 4, "traces": ["t-recovered", "t-stuck"],
                             "triage": "scripted", "pattern": "recovery"}
    assert "sign up for deals!" in pc.keywords and pc.born == 4
    assert by["unstick-back"].trigger == {"last_action": "repeated_no_change"}
    assert by["unstick-back"].strategy == "back" and by["unstick-back"].subtype == "explore"
    assert by["back-on-voice-box"].trigger == {"element": {"id": "voice:box"}}
    assert by["back-on-voice-box"].strategy == "back"
    # a failure on a pop-up alone: the control that reads as a dismissal, explore
    only = scripted_triage([stuck], 0)
    assert {u.id: u.subtype for u in only} == {"tap-popup-close": "explore",
                                                "unstick-back": "explore"}
    # unparseable actions: no unit unless a strategy is given for them
    [u] = scripted_triage([garbled], 0, unparseable="back")
    assert (u.trigger, u.strategy, u.subtype) == ({"last_action": "unparseable"}, "back",
                                                  "explore")


def test_scripted_triage_reads_tree_text_when_no_nodes_were_kept():
    stuck = trace("t", False, [POPUP] * 2, [SEARCH] * 2, changed=[False] * 2,
                  with_nodes=False)
    assert {u.id for u in scripted_triage([stuck], 0)} == {"tap-popup-close", "unstick-back"}


def test_triage_refuses_units_naming_nothing_on_screen():
    seen = trace("t1", False, [POPUP], [SEARCH], changed=[False])
    check_grounded(unit("ok", el="popup:close"), [seen])
    check_grounded(ExperienceUnit("any", {"last_action": "unparseable"}, "back"), [seen])
    check_grounded(ExperienceUnit("txt", {"text": "deals"}, "back"), [seen])
    with pytest.raises(ClawError, match=r"'gear'.*trigger element \{'id': 'settings:gear'\} "
                                        r"names nothing that was on any of the 1 screens"):
        check_grounded(unit("gear", el="settings:gear"), [seen])
    eu = ExperienceUnit("t", {"overlay": True}, {"tap": {"text": "Never seen"}})
    with pytest.raises(ClawError, match="tap target"):
        check_grounded(eu, [seen])
    blind = Trace("t2", "task", False, (EvidenceStep(0, "", SEARCH),))
    with pytest.raises(ClawError, match="none of the traces holds a UI tree"):
        check_grounded(unit("ok", el="popup:close"), [blind])


def llm_backend(server):
    from digirl_lite.judge.backends import OpenAIBackend

    return OpenAIBackend(model="qwen-vl", base_url=server.url + "/v1", api_key_env=None,
                         timeout_s=10)


@pytest.mark.slow
def test_llm_triage_against_openai_server(openai_server):
    stuck = trace("t-stuck", False, [POPUP] * 2, [SEARCH] * 2, changed=[False] * 2)
    clean = trace("t-clean", True, [PAGE], [SEARCH])
    reply = {"units": [
        {"id": "no-thanks", "trigger": {"element": {"id": "popup:nothanks"}},
         "strategy": {"tap": {"id": "popup:nothanks"}}, "keywords": ["sign up"],
         "subtype": "explore", "traces": ["t-stuck", "t-unknown"], "why": "stuck on it"},
        {"id": "gear", "trigger": {"element": {"id": "settings:gear"}}, "strategy": "back",
         "subtype": "explore"},
        {"id": "fly", "trigger": {}, "strategy": "fly"}]}
    openai_server.reply("Here you go:\n```json\n" + json.dumps(reply) + "\n```")
    tri = LLMTriage(llm_backend(openai_server))
    res = tri.triage([stuck, clean], cycle=2)
    [u] = res.units
    assert (u.id, u.subtype, u.skill) == ("no-thanks", "explore", "phone")
    assert u.provenance == {"cycle": 2, "traces": ["t-stuck"], "triage": "llm",
                            "why": "stuck on it"}
    assert len(res.refused) == 2
    assert "settings:gear" in res.refused[0] and "names nothing" in res.refused[0]
    assert "do 'fly'" in res.refused[1] and '"strategy": "fly"' in res.refused[1]
    assert res.kept == {"t-stuck": ["no-thanks"]} and "t-clean" in res.discarded
    sent = openai_server.requests[-1].json["messages"][0]["content"][0]["text"]
    assert "Trace t-stuck" in sent and "[popup:nothanks]" in sent
    assert "(screen unchanged)" in sent and "repeated_no_change" in sent
    # a reply that is not JSON is refused, quoted
    openai_server.reply("I think the agent should close pop-ups.")
    with pytest.raises(ClawError, match="not valid JSON: 'I think the agent should close"):
        tri.triage([stuck], cycle=3)
    # a backend that fails is refused the same way
    openai_server.error(400, "bad request")
    with pytest.raises(ClawError, match="backend failed"):
        tri.triage([stuck], cycle=3)


@pytest.mark.slow
def test_cycle_goes_on_after_an_llm_reply_that_does_not_parse(openai_server):
    bank = ExperienceBank()
    bank.admit(unit("a"))
    runner = worked_runner()
    openai_server.reply("{not json")
    rep = bank.cycle([trace("t", False, [POPUP], [SEARCH])], runner, TS,
                     triage=LLMTriage(llm_backend(openai_server)))
    assert len(rep["refused"]) == 1 and "{not json" in rep["refused"][0]
    assert rep["active"] == ["a"] and rep["validations"]["a"]["S"] == pytest.approx(0.25)


def test_cycle_records_a_failing_run_and_goes_on():
    bank = ExperienceBank()
    bank.admit(unit("a"))
    bank.admit(unit("b"))
    good = worked_runner()

    def runner(extra, ts):
        if '"eu:b"' in extra:
            raise RuntimeError("phone on fire")
        return good(extra, ts)

    rep = bank.cycle([], runner, TS, triage=lambda t, c: [])
    assert rep["active"] == ["a"] and rep["nursery"] == ["b"]
    assert rep["errors"] == ["b: validation failed: RuntimeError: phone on fire"]


def test_import_is_light():
    code = ("import sys, digirl_lite.harness.claw; "
            "print(sorted(m for m in ('torch', 'openai', 'google.genai') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_the_package_keeps_the_module_names():
    """``harness/claw.py`` became a package (issue 50): every public name of the one-file
    module still imports from ``digirl_lite.harness.claw``; its episode record is
    ``ValidationEpisode``, no second ``Outcome`` beside :mod:`digirl_lite.harness.runner`'s."""
    import digirl_lite.harness.claw as claw

    names = ["ClawError", "ExperienceUnit", "ClawConfig", "ExperienceBank", "Trace",
             "ValidationEpisode", "Validation", "TriageResult", "Triage", "ScriptedTriage",
             "LLMTriage", "scripted_triage", "check_grounded", "score", "validate",
             "write_skill_md", "read_skill_md", "skill_rules", "skill_edit",
             "traces_from_episodes", "outcomes_from_episodes", "FleetRunner", "SUBTYPES",
             "STATES", "TRIAGES", "DEFAULT_WEIGHTS", "EU_PREFIX", "SKILL_FILE",
             "LLM_INSTRUCTIONS", "Runner", "describe_trigger", "describe_strategy"]
    assert [n for n in names if not hasattr(claw, n)] == []
    assert [n for n in claw.__all__ if not hasattr(claw, n)] == []
    assert not hasattr(claw, "Outcome")
    assert claw.ValidationEpisode.__module__ == "digirl_lite.harness.claw.validation"


# ---------------------------------------------------------------------------------------
# on the simulator
# ---------------------------------------------------------------------------------------
class PopupBlind:
    """A scripted frozen agent that ignores overlays: the expert's move on the screen with
    the overlay taken away (a modal pop-up absorbs it, so it repeats it until the budget
    runs out, like a copier of clean demonstrations). A harness's StepAgent."""

    def propose(self, inputs):
        from digirl_lite.envs.sim.agents import expert_action
        from digirl_lite.envs.sim.tasks import parse_task

        return [format_action(expert_action(replace(i.obs.state, overlay=None),
                                            parse_task(i.obs.task))) for i in inputs]

    retry = propose


SIM_TASKS = ["Go to bestbuy.com", 'Go to costco.com, search for "usb c cable"',
             'Go to ebay.com, search for "gaming mouse", and select the first entry',
             'Go to walmart.com, search for "air fryer"'] * 2
SURPRISES = {"popup": 0.4, "consent": 0.0, "voice": 0.0, "reorder": 0.0, "blank": 0.0}


@pytest.fixture
def sim_fleet():
    from digirl_lite.envs.sim.env import SimEnvFactory
    from digirl_lite.rollout import make_fleet

    fleet = make_fleet("sync", SimEnvFactory(tasks=SIM_TASKS, ui_tree=True,
                                             surprises=SURPRISES), 4)
    yield fleet
    fleet.close()


@pytest.mark.slow
def test_expert_traces_give_an_exploit_unit(sim_fleet):
    from digirl_lite.data import ScreenTable
    from digirl_lite.envs.sim.agents import ScriptedExpert
    from digirl_lite.rollout.fleet import ScriptedBatchAgent

    eps = sim_fleet.collect(ScriptedBatchAgent(lambda slot: ScriptedExpert()), SIM_TASKS,
                            ScreenTable(), id_prefix="expert", seed=100)
    traces = traces_from_episodes(eps)
    assert all(t.success for t in traces) and traces[0].seed == 100
    res = ScriptedTriage().triage(traces, 0)
    assert {u.id: (u.subtype, u.provenance["pattern"]) for u in res.units} == {
        "tap-popup-close": ("exploit", "recovery")}
    assert res.discarded and all(v == "clean success" for v in res.discarded.values())


@pytest.mark.slow
def test_cycle_on_the_simulator_promotes_units_that_help(sim_fleet, tmp_path):
    """A frozen agent that ignores pop-ups; one cycle from its own traces: the units are
    validated on the same tasks and seeds with and without them, promoted, written to
    SKILL.md, and the harness that loads them solves held-out seeds the agent alone fails."""
    from digirl_lite.data import ScreenTable

    eps = sim_fleet.collect(HarnessAgent(H0_COMPONENTS, PopupBlind()), SIM_TASKS,
                            ScreenTable(), id_prefix="day", seed=100)
    traces = traces_from_episodes(eps)
    assert 0 < sum(t.success for t in traces) < len(traces)
    runner = FleetRunner(sim_fleet, lambda screens: PopupBlind())
    bank = ExperienceBank()
    rep = bank.cycle(traces, runner, [(t.task, t.seed) for t in traces])
    assert set(rep["admitted"]) == {"tap-popup-close", "unstick-back"}
    assert rep["triage"]["discarded"] and not rep["errors"]
    v = rep["validations"]["tap-popup-close"]
    assert v["relevant"] and v["e"] > 0 and 0 < v["c"] <= 1 and v["rate_without"] == 0.0
    assert set(rep["active"]) == {"tap-popup-close", "unstick-back"}
    assert runner.calls == 3  # one baseline, one run per unit
    write_skill_md(bank, tmp_path)
    rules = skill_rules(tmp_path)
    held_out = [(t, 500 + k) for k, t in enumerate(SIM_TASKS)]
    alone = runner("", held_out)
    with_units = runner(rules, held_out)
    assert sum(bool(o.success) for o in with_units) > sum(bool(o.success) for o in alone)
    assert any("eu:tap-popup-close" in o.hits for o in with_units)
    bank.save(tmp_path / "bank.json")
    assert ExperienceBank.load(tmp_path / "bank.json").as_dict() == bank.as_dict()
