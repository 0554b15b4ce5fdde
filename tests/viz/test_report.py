"""digirl_lite.report: the static HTML report of a run, checked as files and, where Debian's
chromium is installed (.ci/install_chromium.sh), rendered in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from needs import missing
from PIL import Image

from digirl_lite.report import build_report
from digirl_lite.viz import Grader, Run

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "data" / "fixtures" / "runs" / "digirl-seed0"
PPO_RUN = ROOT / "data" / "fixtures" / "runs" / "ppo-seed0"


@pytest.fixture(scope="module")
def report(tmp_path_factory, minilm):
    """The fixture run's report, graded with its own checkpoint (the real MiniLM)."""
    out = tmp_path_factory.mktemp("report")
    grader = Grader.from_run(RUN, text_encoder=minilm)
    return build_report(RUN, out, grader=grader, thumb_width=120)


@pytest.mark.slow
def test_report_shows_every_evaluation_trajectory_with_its_grades(report):
    page = report.read_text()
    run = Run(RUN)
    n_frames = 0
    for stage in run.eval_stages():
        trajs, _ = run.eval_trajectories(stage)
        assert f'id="stage-{stage}"' in page
        wins = sum(t.is_success for t in trajs)
        assert f"{stage}: {wins} of {len(trajs)} trajectories succeeded" in page
        for t in trajs:
            assert f'id="{t.traj_id}"' in page
            n_frames += len(t) + 1
    assert page.count('class="dl-step') == n_frames
    assert page.count("V<sub>instr</sub>=") == sum(
        len(run.eval_trajectories(s)[0]) for s in run.eval_stages())
    # every image the page links exists beside it (relative paths: opens from disk)
    srcs = re.findall(r'<img src="([^"]+)"', page)
    assert len(srcs) == n_frames + 2  # frames + learning curve + training metrics
    for src in srcs:
        assert not src.startswith(("/", "http", "data:")), src
        assert (report.parent / src).is_file(), src
    # the summary table has one row per evaluated stage with its success rate
    for row in run.stage_table():
        assert f"<td>{row['stage']}</td>" in page
        assert f"<td>{row['success_rate']:.3f}</td>" in page


@pytest.mark.slow
def test_report_cli_without_grades(tmp_path):
    out = subprocess.run([sys.executable, "-m", "digirl_lite.report", str(RUN), "--out",
                          str(tmp_path), "--no-grades", "--stages", "online",
                          "--max-per-stage", "2", "--thumb-width", "90"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    index = Path(out.stdout.strip().splitlines()[-1])
    assert index == tmp_path / "index.html"
    page = index.read_text()
    assert page.count('class="dl-traj"') == 2
    assert "V<sub>instr</sub>" not in page and 'id="stage-copier"' not in page
    assert 'width="90"' in page


@pytest.mark.slow
def test_report_of_a_run_without_stored_trajectories(tmp_path):
    index = build_report(RUN.parent / "filtered_bc-seed0", tmp_path)
    page = index.read_text()
    assert "stores no evaluation episodes" in page
    assert "<td>online</td>" in page and (tmp_path / "learning_curve.png").is_file()


# ----------------------------------------------------------------------------------------
# PPO and GRPO runs: the value head's values and advantages instead of the critics' grades
# ----------------------------------------------------------------------------------------
def _card(page: str, traj_id: str) -> str:
    start = page.index(f'id="{traj_id}"')
    return page[start:page.index("</details>", start)]


@pytest.mark.slow
def test_ppo_report_shows_values_and_advantages_per_step(tmp_path):
    """The PPO fixture run's report: every step shows the value head's V, the GAE advantage
    and the recorded log-probability; the values are the checkpoint policy's own (scored
    here again), the advantages token_gae of them, and no critic grade appears."""
    import torch

    from digirl_lite import ppo
    from digirl_lite.policy.updates import steps_to_batch
    from digirl_lite.viz import OnPolicyGrader

    grader = Grader.from_run(PPO_RUN)
    assert isinstance(grader, OnPolicyGrader) and grader.algorithm == "ppo"
    assert (grader.gamma, grader.lam) == (0.99, 0.95)
    index = build_report(PPO_RUN, tmp_path, grader=grader, thumb_width=80)
    page = index.read_text()
    assert "PPO values and advantages from checkpoint" in page
    assert "V<sub>instr</sub>" not in page and "ppo_lam=0.95" in page
    run = Run(PPO_RUN)
    assert run.eval_stages() == ["offline", "online"]
    n_steps = 0
    for stage in run.eval_stages():
        trajs, screens = run.eval_trajectories(stage)
        grades = grader.grade(trajs, screens)
        assert set(grades) == {t.traj_id for t in trajs}
        for t in trajs:
            g = grades[t.traj_id]
            n_steps += len(t)
            assert len(g.token_values) == sum(g.step_lengths) == len(g.token_advantages)
            assert np.isfinite(g.token_values).all() and len(g.values) == len(t) + 1
            # the advantages are token-level GAE of the shown values and the rewards
            adv, ret = ppo.token_gae(g.token_values, t.rewards, g.step_lengths, 0.99, 0.95)
            np.testing.assert_allclose(g.token_advantages, adv, atol=1e-9)
            np.testing.assert_allclose(g.token_returns, ret, atol=1e-9)
            assert g.log_probs == pytest.approx([sum(s.action_log_probs) for s in t.steps])
            # the card shows, per step, V at its first token, the mean A and logp
            shown = re.findall(r"r=(\S+) V=(\S+) A=(\S+) logp=(\S+)</span>",
                               _card(page, t.traj_id))
            assert shown == [(f"{s.reward:g}", f"{v:.2f}", f"{a:+.2f}", f"{lp:.2f}")
                             for s, v, a, lp in zip(t.steps, g.values, g.advantages,
                                                    g.log_probs)]
            assert f"R={t.final_reward:g} V<sub>start</sub>={g.values[0]:.2f}" in page
    assert page.count("logp=") == n_steps
    # the values are the checkpoint's value head on these steps (scored here again)
    trajs, screens = run.eval_trajectories("online")
    t = max(trajs, key=len)
    g = grader.grade([t], screens)[t.traj_id]
    prompts, feats, _ = steps_to_batch(t.steps, screens)
    with torch.no_grad():
        _, v, m = grader.policy.token_ids_log_probs_and_values(
            prompts, feats, [s.action_token_ids for s in t.steps])
    assert [int(x) for x in m.sum(1)] == list(g.step_lengths)
    np.testing.assert_allclose(g.values[:-1], v[:, 0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g.value_means,
                               [float(v[i, :n].mean()) for i, n in enumerate(g.step_lengths)],
                               rtol=1e-5, atol=1e-6)
    assert len(set(np.round(g.advantages, 6))) > 1  # not a constant: per step


@pytest.mark.slow
def test_grpo_grades_are_group_advantages_without_values(tmp_path):
    """GRPO (the PPO fixture's policy, graded as GRPO): no per-step values, each
    trajectory's advantage is its reward standardised within its task's group, and the
    report says GRPO has no value head."""
    from digirl_lite import ppo
    from digirl_lite.viz import OnPolicyGrader

    policy = Grader.from_run(PPO_RUN).policy
    grader = OnPolicyGrader(policy, algorithm="grpo")
    trajs, screens = Run(PPO_RUN).eval_trajectories("online")
    # a second attempt at the first task, with the other outcome: a group of two
    other = next(t for t in trajs if t.is_success != trajs[0].is_success)
    twin = replace(other, traj_id=other.traj_id + "-again", task=trajs[0].task)
    grades = grader.grade([*trajs, twin], screens)
    assert set(grades) == {t.traj_id for t in trajs} | {twin.traj_id}
    group = [t for t in [*trajs, twin] if t.task == trajs[0].task]
    want = ppo.grpo_advantages([t.final_reward for t in group])
    assert want[0] != 0  # the rewards differ
    first = grades[trajs[0].traj_id]
    assert first.values == () and first.token_values == () and first.returns == ()
    assert first.advantages == pytest.approx([want[0]] * len(trajs[0]))
    assert grades[twin.traj_id].row()["A_group"] == pytest.approx(want[-1])
    alone = [t for t in trajs if t.task != trajs[0].task
             and sum(u.task == t.task for u in trajs) == 1]
    assert alone
    assert all(grades[t.traj_id].advantages == (0.0,) * len(t) for t in alone)
    index = build_report(PPO_RUN, tmp_path, grader=grader, stages=["online"], thumb_width=60)
    page = index.read_text()
    assert "GRPO has no value head" in page and "(no value head)" in page
    assert page.count("V=&ndash;") >= sum(len(t) for t in trajs)


# ----------------------------------------------------------------------------------------
# Headless Chromium (Debian's chromium package)
# ----------------------------------------------------------------------------------------
def _chromium() -> str | None:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _headless(*args: str) -> subprocess.CompletedProcess:
    cmd = [_chromium(), "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
           "--no-first-run", "--disable-dev-shm-usage", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.chromium
@pytest.mark.slow
def test_report_renders_in_headless_chromium(report, tmp_path):
    if _chromium() is None:
        missing("chromium is not installed (.ci/install_chromium.sh installs Debian's package)")
    page = report.read_text()
    n_img = len(re.findall(r"<img ", page))
    dom = _headless("--dump-dom", report.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body[^>]*>", dom.stdout).group(0)
    # the page's own check: every image loaded from disk (file://, no server)
    assert f'data-images="{n_img}"' in body, body
    assert 'data-broken-images="0"' in body, body

    shot = tmp_path / "top.png"
    out = _headless("--window-size=1200,2400", f"--screenshot={shot}", report.as_uri())
    assert out.returncode == 0 and shot.is_file(), out.stderr[-2000:]
    px = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert px.shape[:2] == (2400, 1200)
    # not a blank page: dark text, the magenta action marks of the first filmstrip
    assert (px.sum(axis=2) < 150).mean() > 0.002
    magenta = (np.abs(px - [230, 0, 122]).max(axis=2) <= 40)
    assert magenta.sum() > 50

    # and the check can fail: the same page without its img/ folder
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(report, moved / "index.html")
    dom = _headless("--dump-dom", (moved / "index.html").as_uri())
    body = re.search(r"<body[^>]*>", dom.stdout).group(0)
    assert f'data-broken-images="{n_img}"' in body, body


def test_the_summary_table_shows_the_true_rate_beside_the_judged_one():
    """Issue 32: a stage with the environment's truth shows its true rate (with the count)
    and the judge's accuracy beside the judged rate; a stage without one shows dashes; a
    run with no truth at all keeps its old columns."""
    from digirl_lite.report import _summary_table

    judged = {"stage": "online", "online_trajectories": 16, "success_rate": 0.625,
              "ci95": [0.4, 0.8], "episodes": 48, "mean_length": 9.5}
    true = {**judged, "truth": "environment", "true_success_rate": 0.604,
            "true_successes": 29, "true_episodes": 48,
            "judge_agreement": {"accuracy": 0.9}}
    html = _summary_table([true, {**judged, "stage": "copier", "truth": "none"}])
    assert "<th>success rate (judge)</th><th>true success rate</th>" in html
    assert "<td>0.625</td><td>0.604 (29/48)</td><td>0.900</td>" in html
    assert "<td>copier</td><td>16</td><td>0.625</td><td>&ndash;</td><td>&ndash;</td>" in html
    assert "true success" not in _summary_table([judged])
