"""digirl_lite.report: the static HTML report of a run, checked as files and, where Debian's
chromium is installed (.ci/install_chromium.sh), rendered in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from needs import missing
from PIL import Image

from digirl_lite.report import build_report
from digirl_lite.viz import Grader, Run

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "data" / "fixtures" / "runs" / "digirl-seed0"


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
