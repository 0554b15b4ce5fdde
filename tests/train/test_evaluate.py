"""Evaluation summaries: failure kinds and the share of INVALID steps (issue 16, item 5)."""

from __future__ import annotations

import pytest

from digirl_lite.actions import Action, ActionType, format_action
from digirl_lite.data.records import Ending, Step, Trajectory
from digirl_lite.rollout.fleet import Episode
from digirl_lite.train.evaluate import FAILURE_KINDS, INVALID_SHARE, failure_kind, summarize

TASK = "Go to ebay.com, search for 'usb hub'"
TAP = format_action(Action.tap(x=0.5, y=0.62))
STOP = format_action(Action.key(ActionType.STATUS_TASK_COMPLETE))
SALAD = "0.8852 0.3763, 0.87940.3212DUAL_POINT"


def episode(texts: list[str], ending: Ending) -> Episode:
    steps = [Step.from_text(task=TASK, prompt="p", action_text=t, reward=0.0, done=False,
                            screen_id=f"s{i}", next_screen_id=f"s{i + 1}")
             for i, t in enumerate(texts)]
    reward = 1.0 if ending is Ending.SUCCESS else 0.0
    traj = Trajectory(traj_id=f"t{len(texts)}-{texts.count(SALAD)}-{ending.value}", task=TASK,
                      steps=tuple(steps), final_reward=reward, ending=ending,
                      truncation_reason="crash" if ending is Ending.INFRA else None)
    return Episode(traj, [], None)


def budget_run(invalid: int, h: int = 20) -> Episode:
    return episode([SALAD] * invalid + [TAP] * (h - invalid), Ending.BUDGET)


def test_the_old_failure_kinds_keep_their_names_and_order():
    assert FAILURE_KINDS[:5] == ("never_reached_site", "wrong_page_at_end", "ran_out_of_steps",
                                 "infrastructure", "unjudged")
    assert "invalid_actions" in FAILURE_KINDS


@pytest.mark.parametrize("invalid, kind", [(0, "ran_out_of_steps"), (4, "ran_out_of_steps"),
                                           (5, "invalid_actions"), (20, "invalid_actions")])
def test_a_budget_ending_is_invalid_actions_from_a_quarter_of_invalid_steps(invalid, kind):
    assert INVALID_SHARE == 0.25
    assert failure_kind(budget_run(invalid)) == kind


def test_other_endings_are_not_invalid_actions():
    assert failure_kind(episode([SALAD] * 9 + [TAP], Ending.SUCCESS)) is None
    assert failure_kind(episode([SALAD] * 9 + [STOP], Ending.AGENT_STOP)) == "wrong_page_at_end"
    assert failure_kind(episode([SALAD] * 9, Ending.INFRA)) == "infrastructure"


def test_summary_counts_the_share_of_invalid_steps():
    eps = [budget_run(10), budget_run(2), episode([SALAD, TAP, STOP], Ending.SUCCESS),
           episode([SALAD] * 3, Ending.INFRA)]
    s = summarize(eps)
    assert s["invalid_step_rate"] == pytest.approx((10 + 2 + 1 + 3) / (20 + 20 + 3 + 3))
    assert s["failure_kinds"] == {**{k: 0 for k in FAILURE_KINDS}, "invalid_actions": 1,
                                  "ran_out_of_steps": 1, "infrastructure": 1}
    assert list(s["failure_kinds"]) == list(FAILURE_KINDS)
    assert summarize([])["invalid_step_rate"] == 0.0


def test_an_evaluation_with_too_few_tasks_judged_is_incomplete_and_says_which(capsys):
    """Issue 29's lost phone: 1 judged task of 16 printed "100.0%". Every task is judged or
    listed (with why); below ``min_judged_share`` the stage is incomplete and the table
    prints that instead of a rate."""
    from digirl_lite.train.cli import print_table

    win = episode([TAP, STOP], Ending.SUCCESS)
    lost = [episode([TAP] * k, Ending.INFRA) for k in range(15)]
    s = summarize([win, *lost])
    assert s["success_rate"] == 1.0 and s["judged_episodes"] == 1 and s["episodes"] == 16
    assert not s["complete"] and s["judged_share"] == pytest.approx(1 / 16)
    assert len(s["not_evaluated"]) == 15
    assert {x["why"] for x in s["not_evaluated"]} == {"crash"}
    print_table({"digirl": {"stages": {"online": s}}}, 16)
    out = capsys.readouterr().out
    assert "incomplete: 1/16 judged" in out and "100.0%" not in out
    # 9 of 10 judged meets the default share (0.9); a stricter share does not
    ten = [win] * 9 + lost[:1]
    assert summarize(ten)["complete"] and not summarize(ten, min_judged_share=0.95)["complete"]
    print_table({"digirl": {"stages": {"online": summarize(ten)}}}, 10)  # the count beside
    assert "100.0% ( 2.0;  0.0% inv) [9/10 judged]" in capsys.readouterr().out
    assert not summarize([])["complete"]


def test_the_results_table_shows_the_true_rate_where_there_is_one(capsys):
    from dataclasses import replace

    from digirl_lite.train.cli import print_table

    win = episode([TAP, STOP], Ending.SUCCESS)
    false_win = replace(win, trajectory=replace(win.trajectory, traj_id="f",
                                                true_success=False))
    s = summarize([replace(win, trajectory=replace(win.trajectory, true_success=True)),
                   false_win])
    print_table({"digirl": {"stages": {"online": s}}}, 2)
    assert "100.0% ( 2.0;  0.0% inv) [true 50.0%]" in capsys.readouterr().out
