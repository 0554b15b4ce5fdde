"""benchmarks/main_job_time.py: /usr/bin/time's report parsed by hand, and the JSON entry
written from a stand-in recipe's summary.json, under /usr/bin/time and under Python's
resource module (issue 32, item 3)."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("main_job_time",
                                               ROOT / "benchmarks" / "main_job_time.py")
mjt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mjt)

TIME_V = """\
\tCommand being timed: "python recipes/offline_to_online.py --cache-dir  --out runs/t"
\tUser time (seconds): 1043.27
\tSystem time (seconds): 31.90
\tPercent of CPU this job got: 186%
\tElapsed (wall clock) time (h:mm:ss or m:ss): 9:35.41
\tMaximum resident set size (kbytes): 3743412
\tExit status: 0
"""

STAND_IN = textwrap.dedent('''
    """A stand-in for the main job: holds ~40 MB, writes a summary.json as the Trainer does."""
    import argparse, json, time
    from pathlib import Path
    ap = argparse.ArgumentParser()
    ap.add_argument("--out"); ap.add_argument("--cache-dir"); ap.add_argument("--processes")
    a = ap.parse_args()
    ballast = bytearray(40_000_000)
    time.sleep(0.3)  # a run takes time: the entry rounds to 0.1 s, and a bare start is 0.04 s
    stages = {st: {"success_rate": k / 96, "ci95": [0, 1], "successes": k, "episodes": 96,
                   "invalid_step_rate": 0.125}
              for st, k in (("copier", 55), ("offline", 70), ("online", 71))}
    out = Path(a.out); out.mkdir(parents=True)
    (out / "summary.json").write_text(json.dumps({
        "stages": stages, "wall_s": 566.0, "processes": int(a.processes or 2),
        "timings_s": {"actor": 232.4, "filter": 0.61}, "args": [a.cache_dir]}))
''')


def test_the_time_report_parsed_by_hand():
    t = mjt.parse_time_v(TIME_V)
    assert t == {"user_s": 1043.27, "sys_s": 31.9, "elapsed_s": pytest.approx(575.41),
                 "max_rss_kib": 3743412, "exit_status": 0}
    assert mjt.parse_time_v(TIME_V.replace("9:35.41", "1:02:03"))["elapsed_s"] == 3723
    with pytest.raises(ValueError, match="no max_rss_kib"):
        mjt.parse_time_v(TIME_V.replace("Maximum resident", "Max"))


@pytest.mark.skipif(not Path(mjt.TIME_BIN).is_file(), reason="no /usr/bin/time here")
def test_entry_from_the_runs_summary_under_usr_bin_time(tmp_path, capsys):
    recipe = tmp_path / "stand_in.py"
    recipe.write_text(STAND_IN)
    result = tmp_path / "main_job_time.json"
    result.write_text(json.dumps({"by_hand": {"elapsed_s": 575}}))
    argv = ["--recipe", str(recipe), "--out", str(tmp_path / "run"), "--json", str(result),
            "--label", "t", "--", "--processes", "1"]
    assert mjt.main(argv) == 0
    data = json.loads(result.read_text())
    assert data["by_hand"] == {"elapsed_s": 575}  # the other entries are kept
    e = data["t"]
    assert e["measured_with"] == "/usr/bin/time -v" and e["exit_status"] == 0
    assert e["command"].startswith("python ") and e["command"].endswith(
        f"--out {tmp_path / 'run'} --cache-dir '' --processes 1")
    assert 0.3 <= e["elapsed_s"] < 60 and e["user_s"] >= 0 and e["sys_s"] >= 0
    assert 0.04 < e["max_rss_gib_largest_process"] < 1  # the 40 MB it held, and Python
    assert (e["summary_wall_s"], e["processes"], e["evaluations"]) == (566.0, 1, 3)
    assert e["phases_s"] == {"actor": 232, "filter": 0.61}
    assert e["held_out_success_pct"] == {"copier": 57.3, "offline": 72.9, "online": 74.0}
    assert e["invalid_step_pct"] == {"copier": 12.5, "offline": 12.5, "online": 12.5}
    assert len(e["code"]["commit"]) == 40 and e["machine"]["cpus"] >= 1
    # a second run into the same folder is refused: it would resume, not time, the job
    with pytest.raises(SystemExit):
        mjt.main(argv)
    assert "is not empty" in capsys.readouterr().err


def test_without_usr_bin_time_the_resource_module_measures(tmp_path):
    m = mjt.measure([sys.executable, "-c", "x = bytearray(60_000_000)"], time_bin=None)
    assert m["measured_with"].startswith("python resource.getrusage")
    assert m["exit_status"] == 0 and 0 < m["elapsed_s"] < 60
    assert m["max_rss_kib"] > 60_000_000 / 1024


def test_the_readme_figure_is_written_between_its_markers_from_the_entry():
    """--readme: the sentence built from the fresh_clone entry replaces what stood between
    the markers (and nothing else); a README without them is refused."""
    record = {"machine": {"cpus": 2, "cpu": "Some CPU"}, "when": "2026-12-06T06:00:00+00:00",
              "code": {"commit": "0" * 40}, "install_s": 98.4, "elapsed_s": 480.2,
              "first_command_s": 578.6}
    text = "a\n<!-- main-job-time -->old figure<!-- /main-job-time -->\nb\n"
    got = mjt.readme_with_figure(text, record)
    assert got.startswith("a\n<!-- main-job-time -->Measured on a fresh clone")
    assert got.endswith("<!-- /main-job-time -->\nb\n") and "old figure" not in got
    assert "9.6 minutes in all, install 98 s and run 480 s" in got
    assert "2 CPUs, Some CPU, 2026-12-06" in got
    with pytest.raises(ValueError, match="has no <!-- main-job-time --> .* markers"):
        mjt.readme_with_figure("no markers", record)


def test_fresh_clone_dry_run_clones_and_writes_nothing(tmp_path, capsys):
    """``--fresh-clone --dry-run`` prints the clone, install and run, and runs none of them
    (it once ran the whole measurement)."""
    out = tmp_path / "t.json"
    assert mjt.main(["--fresh-clone", "--dry-run", "--json", str(out)]) == 0
    said = capsys.readouterr().out
    assert said.startswith("git clone ") and mjt.FRESH_INSTALL in said and mjt.RECIPE in said
    assert not out.exists()
