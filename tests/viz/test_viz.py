"""digirl_lite.viz: actions drawn in the right place, run folders, grades against hand-computed
Eq. 4.3 / 4.4 values, filmstrips, learning curves, re-grading with another judge."""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from digirl_lite.actions import Action, ActionType, format_action, parse_action
from digirl_lite.data import Ending, ScreenTable, Step, Trajectory, Verdict
from digirl_lite.prompts import build_prompt
from digirl_lite.viz import (
    ACTION_COLOR,
    Grader,
    ReplayMismatch,
    Run,
    action_label,
    compare_verdicts,
    draw_action,
    filmstrip,
    load_runs,
    plot_learning_curves,
    plot_training_metrics,
    regrade,
    replay_states,
    step_views,
    trajectory_html,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "data" / "fixtures" / "runs"
RUN = FIXTURES / "digirl-seed0"


def _is_mark(px) -> bool:
    return all(abs(a - b) <= 30 for a, b in zip(px, ACTION_COLOR))


# minilm: the real MiniLM text encoder, loaded once per session (tests/conftest.py)


# ----------------------------------------------------------------------------------------
# Drawing
# ----------------------------------------------------------------------------------------
def test_tap_is_drawn_at_x_y_not_at_y_x():
    white = Image.new("RGB", (200, 400), (255, 255, 255))
    out = draw_action(white, Action.tap(x=0.25, y=0.75))
    assert _is_mark(out.getpixel((50, 300)))  # x = 0.25 * 200, y = 0.75 * 400
    assert out.getpixel((150, 100)) == (255, 255, 255)  # where [y, x] read as (x, y) lands
    assert white.getpixel((50, 300)) == (255, 255, 255)  # the input is not drawn on
    # the same tap written as the policy writes it ([y, x] in the string) lands there too
    parsed = parse_action('Action Decision: "action_type": "DUAL_POINT", "touch_point": '
                          '"[0.7500, 0.2500]", "lift_point": "[0.7500, 0.2500]", '
                          '"typed_text": ""')
    assert np.array_equal(np.asarray(draw_action(white, parsed)), np.asarray(out))


def test_tap_scales_to_a_thumbnail():
    white = Image.new("RGB", (1080, 2280), (255, 255, 255))
    out = draw_action(white, Action.tap(x=0.8, y=0.1), width=108)
    assert out.size == (108, 228)
    assert _is_mark(out.getpixel((86, 23)))
    assert out.getpixel((10, 200)) == (255, 255, 255)


def test_swipe_is_an_arrow_from_touch_to_lift():
    white = Image.new("RGB", (200, 400), (255, 255, 255))
    out = draw_action(white, Action.swipe(x0=0.5, y0=0.8, x1=0.5, y1=0.2))
    for y in (320, 250, 200, 150, 95):  # along the vertical line x = 100
        assert _is_mark(out.getpixel((100, y))), y
    assert out.getpixel((40, 200)) == (255, 255, 255)
    # the head is at the lift end (y = 80): wider just behind its tip than along the shaft
    def width_at(y):
        return sum(_is_mark(out.getpixel((x, y))) for x in range(200))

    assert width_at(90) > 2 * width_at(250)


def test_keys_and_text_are_labels_at_the_bottom():
    white = Image.new("RGB", (270, 570), (255, 255, 255))
    for a in (Action.key(ActionType.PRESS_BACK), Action.type_text("usb-c cable"),
              Action.key(ActionType.STATUS_TASK_COMPLETE), Action.invalid("no marker")):
        arr = np.asarray(draw_action(white, a))
        marked = (np.abs(arr.astype(int) - ACTION_COLOR).max(axis=2) <= 30)
        ys = np.where(marked.any(axis=1))[0]
        assert len(ys) > 0, a
        assert ys.min() > 570 * 0.75, a  # only in the bottom band
    long = Action.type_text("x" * 200)
    arr = np.asarray(draw_action(white, long))
    assert arr.shape == (570, 270, 3)


def test_action_labels():
    assert action_label(Action.tap(x=0.5, y=0.62)) == "tap x=0.50 y=0.62"
    assert action_label(Action.swipe(x0=0.5, y0=0.8, x1=0.5, y1=0.2)).startswith("swipe up")
    assert action_label(Action.swipe(x0=0.2, y0=0.5, x1=0.9, y1=0.5)).startswith("swipe right")
    assert action_label(Action.type_text("shoes")) == 'type "shoes"'
    assert action_label(Action.key(ActionType.PRESS_HOME)) == "HOME"
    assert action_label(Action.invalid("bad")) == "invalid: bad"
    # touch and lift 1 px apart on the device: a tap, as the device performs it
    assert action_label(Action.swipe(x0=0.5, y0=0.5, x1=0.5005, y1=0.5)).startswith("tap")


# ----------------------------------------------------------------------------------------
# Run folders
# ----------------------------------------------------------------------------------------
def test_fixture_run_reads_back():
    run = Run(RUN)
    summary = json.loads((RUN / "summary.json").read_text())
    curve = run.curve()
    assert [p.stage for p in curve] == list(summary["stages"])
    assert [p.success_rate for p in curve] == pytest.approx(
        [s["success_rate"] for s in summary["stages"].values()], abs=1e-4)
    assert run.eval_stages() == [p.stage for p in curve]
    trajs, screens = run.eval_trajectories("online")
    assert len(trajs) == run.config["eval_tasks"]
    assert all(screens.image(s.screen_id) is not None for t in trajs for s in t.steps)
    assert [r["stage"] for r in run.stage_table()] == run.eval_stages()
    xs, ys = run.series("kept_steps")
    assert xs == [8.0, 16.0] and len(ys) == 2
    assert run.label == "digirl seed 0"
    with pytest.raises(FileNotFoundError, match="stored: copier"):
        run.eval_trajectories("nope")


def test_run_in_progress_torn_and_corrupt_metrics(tmp_path):
    rec = {"stage": "eval:copier", "online_trajectories": 0, "success_rate": 0.25,
           "ci95": [0.1, 0.5]}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rec) + "\n" + '{"stage": "onl')
    run = Run(tmp_path)
    assert [p.success_rate for p in run.curve()] == [0.25]  # torn last line skipped
    assert run.summary() is None and run.config == {} and run.eval_stages() == []
    assert run.stage_table()[0]["success_rate"] == 0.25
    (tmp_path / "metrics.jsonl").write_text("not json\n" + json.dumps(rec) + "\n")
    with pytest.raises(ValueError, match="metrics.jsonl:1"):
        run.curve()
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        Run(tmp_path / "..")


def test_load_runs_from_a_folder_of_runs():
    runs = load_runs(FIXTURES)
    assert [r.name for r in runs] == ["digirl-seed0", "digirl-seed1", "filtered_bc-seed0",
                                      "filtered_bc-seed1", "ppo-seed0"]
    assert load_runs(RUN)[0].name == "digirl-seed0"


# ----------------------------------------------------------------------------------------
# Grades: hand-computed Eq. 4.3 / 4.4 with constant critics
# ----------------------------------------------------------------------------------------
def _traj(tid: str, n: int, success: bool, *, invalid_at: int | None = None,
          unjudged: bool = False) -> Trajectory:
    tap = format_action(Action.tap(x=0.5, y=0.5))
    stop = format_action(Action.key(ActionType.STATUS_TASK_COMPLETE))
    steps, last = [], None
    for h in range(n):
        end = h == n - 1
        text = "garbage" if h == invalid_at else (stop if end and not success else tap)
        steps.append(Step.from_text(
            task=f"task {tid}", prompt=build_prompt(f"task {tid}", last), action_text=text,
            reward=1.0 if end and success else 0.0, done=end, screen_id=f"s{h}",
            next_screen_id=f"s{h + 1}",
            verdict=Verdict.UNJUDGED if unjudged and h == 0 else
            (Verdict.SUCCESS if end and success else Verdict.FAILURE)))
        last = text
    return Trajectory(tid, f"task {tid}", tuple(steps), 1.0 if success else 0.0,
                      Ending.SUCCESS if success else Ending.AGENT_STOP,
                      horizon=20).with_mc_returns()


def _constant_grader(text_encoder, img_dim=8, **kw) -> Grader:
    """Critics whose value is 0.1 on every input (zero output weights, Darwin A.6 init)."""
    from digirl_lite.critics import EmbeddingCache, InstructionCritic, StepCritic

    return Grader(StepCritic(text_encoder.dim, img_dim, hidden=8, init_value=0.1),
                  InstructionCritic(text_encoder.dim, init_value=0.1),
                  EmbeddingCache(text_encoder), **kw)


def _screens(n=6, dim=8) -> ScreenTable:
    t = ScreenTable(dim)
    rng = np.random.default_rng(0)
    for h in range(n):
        t.add(Image.new("RGB", (27, 57), (255, 255, 255)), rng.standard_normal(dim),
              screen_id=f"s{h}")
    return t


def test_grades_match_hand_computed_eq43_eq44(minilm):
    trajs = [_traj("win", 3, True), _traj("lose1", 3, False), _traj("lose2", 2, False)]
    g = _constant_grader(minilm).grade(trajs, _screens())
    win, lose = g["win"], g["lose1"]
    # V = 0.1 everywhere, V(s_T) = 0 (terminal)
    assert win.values == pytest.approx((0.1, 0.1, 0.1, 0.0), abs=1e-6)
    # success [0, 0, 1], lam 0.5: m = [.25, .5, 1], td = [0, 0, .9] -> A = [.25, .5, 1]
    assert win.advantages == pytest.approx((0.25, 0.5, 1.0), abs=1e-6)
    # failure: m = 0, td = [0, 0, -.1]
    assert lose.advantages == pytest.approx((0.0, 0.0, -0.1), abs=1e-6)
    # Eq. 4.4: A = r - 0.1 -> [.9, -.1, -.1]; top 10%: quantile .9 = .7 -> only the win
    assert (win.instr_value, win.instr_advantage) == pytest.approx((0.1, 0.9), abs=1e-6)
    assert [g[t].kept for t in ("win", "lose1", "lose2")] == [True, False, False]
    assert win.step_kept == (True, True, True)  # A > 1/20
    assert lose.step_kept == (False, False, False)


@pytest.mark.slow
def test_grades_invalid_unusable_released_and_filtered_bc(minilm):
    screens = _screens()
    trajs = [_traj("win", 3, True, invalid_at=0), _traj("lose", 3, False),
             _traj("unjudged", 3, True, unjudged=True)]
    g = _constant_grader(minilm, top_p=1.0).grade(trajs, screens)
    assert g["win"].step_kept == (False, True, True)  # invalid action: never imitated
    assert g["unjudged"].kept is False and not any(g["unjudged"].step_kept)
    assert g["lose"].kept is True and not any(g["lose"].step_kept)  # top_p = 1 keeps all
    # released grade: v_next - v - 0.05 + r + mc, clamped; mc = [.25, .5, 1]
    rel = _constant_grader(minilm, step_filter="released").grade(trajs[:1], screens)["win"]
    assert rel.advantages == pytest.approx((0.2, 0.45, 1.0), abs=1e-6)
    bc = _constant_grader(minilm, algorithm="filtered_bc").grade(trajs, screens)
    assert bc["win"].kept and bc["win"].step_kept == (False, True, True)
    assert not bc["lose"].kept and not bc["unjudged"].kept


def test_grader_fills_missing_features_or_says_so(minilm):
    from digirl_lite.vision import SimScreenEncoder

    screens = ScreenTable(8)
    for h in range(4):
        screens.add(Image.new("RGB", (27, 57), (40 * h, 0, 0)), screen_id=f"s{h}")
    t = _traj("win", 3, True)
    with pytest.raises(ValueError, match="no features"):
        _constant_grader(minilm).grade([t], screens)
    g = _constant_grader(minilm, image_encoder=SimScreenEncoder(dim=8)).grade([t], screens)
    assert len(g["win"].values) == 4 and screens.has_features("s0")


@pytest.mark.slow
def test_grader_from_the_fixture_checkpoint(minilm):
    run = Run(RUN)
    grader = Grader.from_run(run, text_encoder=minilm)
    assert (grader.algorithm, grader.top_p, grader.lam) == ("digirl", 0.25, 0.5)
    assert grader.step_critic.critic1[0].out_features == 16  # read from the state dict
    trajs, screens = run.eval_trajectories("online")
    g = grader.grade(trajs, screens)
    assert set(g) == {t.traj_id for t in trajs}
    for t in trajs:
        v = np.array(g[t.traj_id].values)
        assert len(v) == len(t) + 1 and v[-1] == 0 and np.all((v[:-1] > 0) & (v[:-1] < 1))
    # the trained critics tell successes from failures on average
    win = [g[t.traj_id].instr_advantage for t in trajs if t.is_success]
    lose = [g[t.traj_id].instr_advantage for t in trajs if not t.is_success]
    assert min(win) > max(lose)

    class Small:
        dim = 16

    with pytest.raises(ValueError, match="384-d text"):
        Grader.from_run(run, text_encoder=Small())
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Grader.from_run(FIXTURES / "digirl-seed1", text_encoder=minilm)


# ----------------------------------------------------------------------------------------
# Filmstrips and HTML
# ----------------------------------------------------------------------------------------
def test_step_views_filmstrip_and_html(minilm):
    run = Run(RUN)
    trajs, screens = run.eval_trajectories("online")
    t = next(x for x in trajs if x.is_success)
    grade = _constant_grader(minilm, img_dim=512).grade([t], screens)[t.traj_id]
    views = step_views(t, grade)
    assert len(views) == len(t) + 1
    assert views[-1].action is None and views[-1].label == "end: success"
    assert [v.kept for v in views[:-1]] == list(grade.step_kept)
    assert views[0].caption()[0].startswith("0: ")

    sheet = filmstrip(t, screens, grade, thumb_width=80)  # narrow: captions must be cut
    assert sheet.width == (len(t) + 1) * 86 + 6
    # frame 0 on the sheet is the first screenshot with its action drawn
    ref = np.asarray(draw_action(screens.image(t.steps[0].screen_id), t.steps[0].action,
                                 width=80))
    column = np.asarray(sheet.crop((6, 0, 86, sheet.height)))
    assert any(np.array_equal(column[y:y + ref.shape[0]], ref)
               for y in range(column.shape[0] - ref.shape[0] + 1))
    # captions are cut to their frame: the gaps between frames stay empty
    arr = np.asarray(sheet)
    for i in range(1, len(views)):
        assert (arr[40:, i * 86:i * 86 + 6] == 250).all(), f"caption spills into gap {i}"

    page = trajectory_html(t, screens, grade, thumb_width=100)
    for s in t.steps:
        assert s.action_text.replace('"', "&quot;") in page
    assert page.count('class="dl-step kept"') == sum(grade.step_kept)
    assert page.count('class="dl-step dropped"') == len(t) - sum(grade.step_kept)
    uris = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(uris) == len(t) + 1
    assert Image.open(io.BytesIO(base64.b64decode(uris[0]))).size[0] == 100
    with pytest.raises(ValueError, match="steps"):
        step_views(_traj("other", len(t) + 1, True), grade)


# ----------------------------------------------------------------------------------------
# Learning curves
# ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_learning_curves_plot_every_run_and_the_seed_mean():
    runs = load_runs(FIXTURES)
    fig = plot_learning_curves(runs)
    ax = fig.axes[0]
    by_label = {line.get_label(): line for line in ax.get_lines()}
    for run in runs:
        line = by_label[run.label]
        assert list(line.get_xdata()) == [p.online_trajectories for p in run.curve()]
        assert list(line.get_ydata()) == [p.success_rate for p in run.curve()]
    mean = by_label["digirl mean of 2"]
    ys = np.mean([[p.success_rate for p in r.curve()] for r in runs[:2]], axis=0)
    assert np.allclose(mean.get_ydata(), ys)
    assert "filtered_bc mean of 2" in by_label
    fig = plot_training_metrics(runs, keys=("kept_steps", "actor_loss", "not_logged"))
    assert [a.get_title() for a in fig.axes if a.get_title()] == ["kept_steps", "actor_loss"]
    # PPO filters nothing (no kept_steps); every run logs an actor loss
    assert len(fig.axes[0].get_lines()) == len([r for r in runs if r.config["algorithm"] != "ppo"])
    assert len(fig.axes[1].get_lines()) == len(runs)


# ----------------------------------------------------------------------------------------
# Re-grading with another judge
# ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_replay_reproduces_the_stored_screens_and_oracle_verdicts():
    trajs, screens = Run(RUN).eval_trajectories("copier")
    states = replay_states(trajs[0])
    assert len(states) == len(trajs[0]) + 1
    new = regrade(trajs, screens, {"judge": "oracle"})
    cmp = compare_verdicts(trajs, new)
    assert cmp.step_agreement == 1.0 and cmp.trajectory_agreement == 1.0
    assert cmp.disagreements == []
    # a judge that calls every screen a success disagrees on every stored failure
    noisy = regrade(trajs, screens, {"judge": "noisy_oracle", "false_success_rate": 1.0,
                                     "false_failure_rate": 0.0})
    cmp = compare_verdicts(trajs, noisy)
    n_fail = sum(s.verdict is Verdict.FAILURE for t in trajs for s in t.steps)
    assert cmp.steps[("failure", "success")] == n_fail > 0
    assert len(cmp.disagreements) == n_fail
    assert {"stored": "failure", "new": "success", "steps": n_fail} in cmp.table()


def test_replay_detects_a_diverged_episode():
    trajs, _ = Run(RUN).eval_trajectories("copier")
    t = trajs[0]
    bad = replace(t, steps=(t.steps[0], replace(t.steps[1], screen_id="elsewhere"),
                            *t.steps[2:]))
    with pytest.raises(ReplayMismatch, match="step 1"):
        replay_states(bad)
    with pytest.raises(ValueError, match="no episode seed"):
        replay_states(replace(t, seeds={}))


def test_regrade_with_a_screen_judge_gets_stored_images_and_history():
    from digirl_lite.judge import JudgeResult

    trajs, screens = Run(RUN).eval_trajectories("online")
    t = trajs[0]
    seen = []

    class ScreenJudge:  # stands in for a VLM judge: reads screenshots, never the state
        def reset(self):
            seen.append("reset")

        def judge(self, task, prev, cur, *, history=None, state=None):
            seen.append((prev.size, cur.size, len(history), state))
            if len(history) == 2:
                raise ConnectionError("API down")
            return JudgeResult(Verdict.FAILURE, reply="Status: failure")

    new = regrade([t], screens, ScreenJudge())[t.traj_id]
    assert seen[0] == "reset" and len(seen) == len(t) + 1
    assert seen[1] == ((270, 570), (270, 570), 1, None)  # no replay: state None
    assert new[1].verdict is Verdict.UNJUDGED and "ConnectionError" in new[1].skipped
    cmp = compare_verdicts([t], {t.traj_id: new})
    assert cmp.steps[(t.steps[1].verdict.value, "unjudged")] == 1


def test_import_viz_is_light():
    code = ("import sys, digirl_lite.viz; from digirl_lite.viz import Run; "
            "print([m for m in ('torch', 'matplotlib', 'datasets', 'transformers') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_filmstrips_head_asks_the_learner_whether_it_has_a_value_head(monkeypatch):
    """The header of an on-policy grade shows V_start where the learner declares a value
    head (``value_coef_applies``), the group advantage otherwise, whatever its name."""
    from digirl_lite import learners
    from digirl_lite.learners.ppo import PPO
    from digirl_lite.viz.film import _grade_head
    from digirl_lite.viz.grades import OnPolicyGrade

    def grade(algorithm: str, values: tuple[float, ...]) -> OnPolicyGrade:
        return OnPolicyGrade(traj_id="t", algorithm=algorithm, reward=1.0, step_lengths=(2,),
                             token_values=values, token_advantages=(0.5, 0.25),
                             token_returns=(), log_probs=(None,), gamma=1.0, lam=1.0)

    assert _grade_head(grade("ppo", (0.3, 0.2)), False) == "PPO: R=1 V_start=0.30 mean A=+0.38"
    assert _grade_head(grade("grpo", ()), False) == "GRPO: R=1 A_group=+0.50 (no value head)"
    learners.learner_names()  # the built-in ones, before the test's own goes in
    monkeypatch.setitem(learners._REGISTRY, "my_ppo", type("MyPPO", (PPO,), {}))
    assert _grade_head(grade("my_ppo", (0.3, 0.2)), False).startswith("MY_PPO: R=1 V_start=")
