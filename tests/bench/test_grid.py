"""benchmarks/grid.py and its package, benchmarks/gridlib: the table's intervals against
numbers worked by hand, resuming a grid (finished runs skipped, checkpointed ones resumed)
with a stand-in recipe, spec errors that name their field; provenance in a repository of its
own (a dirty tree refused, attempts' commits and wall times, --rerun-stale, the table's
warning on mixed code); one slow test runs a real one-job grid under --quick."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

from benchmarks import gridlib as grid  # noqa: E402
from benchmarks.gridlib import repo as grid_repo  # noqa: E402  (its ROOT: the grid's checkout)


def _write(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


def _stage(successes: int, n: int, length: float, **extra) -> dict:
    return {"success_rate": successes / n, "n": n, "successes": successes, "ci95": [0, 1],
            "mean_length": length, "mean_length_success": length,
            "failure_kinds": {"ran_out_of_steps": n - successes, "wrong_page_at_end": 0},
            **extra}


def _result(arm: str, seed: int, online: tuple[int, int, float], **extra) -> dict:
    k, n, length = online
    return {"grid": "g", "arm": arm, "seed": seed,
            "stages": {"copier": _stage(3, n, 9.0), "online": _stage(k, n, length, **extra)},
            "curve": [{"stage": "copier", "online_trajectories": 0, "success_rate": 0.3},
                      {"stage": "offline", "online_trajectories": 0, "success_rate": 0.4},
                      {"stage": "online", "online_trajectories": 16,
                       "success_rate": k / n}],
            "wall_s": 600.0 + 60 * seed, "command": f"python r.py --seed {seed}",
            "config": {"seed": seed, "algorithm": "digirl"}, "git": {"commit": "abc"}}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


def _git_repo(path: Path) -> Path:
    """A git repository at ``path`` with everything in it committed."""
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q")
    _git(path, "config", "user.email", "t@t")
    _git(path, "config", "user.name", "t")
    _git(path, "add", "-A")
    _git(path, "commit", "-qm", "init", "--allow-empty")
    return path


def _spec_file(tmp_path: Path, **fields) -> Path:
    d = {"seeds": [0, 1, 2], "arms": [{"name": "a"}, {"name": "b"}], **fields}
    return _write(tmp_path / "grids" / "g.json", d)


@pytest.fixture
def hand_results(tmp_path):
    """Arm a: 5, 6, 7 of 10 online (lengths of successes 10, 12, 14; invalid-step rates
    0.1, 0.2, 0.3); arm b: 4, 4, 7 of 10; arm c: one seed."""
    res = tmp_path / "results"
    for s, (k, length, inv) in enumerate([(5, 10.0, 0.1), (6, 12.0, 0.2), (7, 14.0, 0.3)]):
        _write(res / "g" / f"a-seed{s}.json",
               _result("a", s, (k, 10, length), invalid_step_rate=inv))
    for s, k in enumerate([4, 4, 7]):
        _write(res / "g" / f"b-seed{s}.json", _result("b", s, (k, 10, 11.0)))
    _write(res / "g" / "c-seed0.json", _result("c", 0, (9, 10, 8.0)))
    spec = grid.load_spec(_spec_file(tmp_path, arms=[{"name": "a"}, {"name": "b"},
                                                     {"name": "c"}]))
    return spec, res


def test_table_math_by_hand(hand_results):
    spec, res = hand_results
    results = grid.load_results(res, spec)
    s = grid.stage_stats(results["a"], "online")
    # rates .5 .6 .7: mean .6, sd .1, t(0.975, 2) = 4.302653, half = 4.302653 * .1 / sqrt 3
    assert s["mean"] == pytest.approx(0.6)
    assert s["ci95_seeds"] == pytest.approx([0.6 - 0.248414, 0.6 + 0.248414], abs=1e-6)
    # pooled 18 / 30, Wilson z = 1.96: centre (0.6 + 3.8416 / 60) / (1 + 3.8416 / 30)
    # = 0.588648, half 1.96 * sqrt(0.24 / 30 + 3.8416 / 3600) / 1.128053 = 0.165448
    assert (s["successes"], s["n"], s["pooled"]) == (18, 30, pytest.approx(0.6))
    assert s["ci95_pooled"] == pytest.approx([0.423200, 0.754096], abs=1e-5)
    # successes' lengths: (5 * 10 + 6 * 12 + 7 * 14) / 18
    assert s["mean_length_success"] == pytest.approx(220 / 18)
    assert s["failure_kinds"] == {"ran_out_of_steps": 12, "wrong_page_at_end": 0}
    assert s["invalid_step_rate"] == pytest.approx(0.2)
    assert (s["n_seeds"], s["seeds"]) == (3, [0, 1, 2])
    # b - a seed by seed: -.1, -.2, 0 -> mean -.1, sd .1, the same half-width
    d = grid.paired_difference(results["b"], results["a"], "online")
    assert d["mean"] == pytest.approx(-0.1)
    assert d["ci95"] == pytest.approx([-0.348414, 0.148414], abs=1e-6)
    # one seed: no interval over seeds; the pooled one is that seed's Wilson interval
    c = grid.stage_stats(results["c"], "online")
    assert c["mean"] == 0.9 and all(math.isnan(x) for x in c["ci95_seeds"])
    assert c["ci95_pooled"] == pytest.approx([0.596, 0.9821], abs=1e-3)
    assert c["invalid_step_rate"] is None  # not reported: not made up


def test_t_quantiles_and_clipping():
    from digirl_lite.viz.curves import _t975, mean_ci95

    assert _t975(1) == 12.706205 and _t975(4) == 2.776445
    assert _t975(31) == pytest.approx(2.039513, abs=1e-5)   # scipy.stats.t.ppf(.975, 31)
    assert _t975(120) == pytest.approx(1.979930, abs=1e-5)
    assert mean_ci95([0.9, 1.0, 1.0])[2] > 1  # the t-interval itself is not clipped...
    recs = [_result("a", s, (k, 10, 5.0)) for s, k in enumerate([9, 10, 10])]
    assert grid.stage_stats(recs, "online")["ci95_seeds"][1] == 1.0  # ...the table's is


@pytest.mark.slow
def test_table_files(hand_results):
    spec, res = hand_results
    paths = grid.write_table(spec, res)
    assert [p.name for p in paths] == ["table.md", "table.json", "curves.png"]
    md = (res / "g" / "table.md").read_text()
    assert "| a | online | 3 | 60.0 [35.2, 84.8] | 60.0 [42.3, 75.4] (18/30) | 12.2 | 20.0 |" \
        " ran_out_of_steps 12 | 11.0 |" in md
    # the difference from the reference a, seed by seed
    assert "| b | +0.0 [0.0, 0.0] (3) | - | -10.0 [-34.8, 14.8] (3) |" in md
    t = json.loads((res / "g" / "table.json").read_text())
    assert t["arms"]["b"]["stages"]["online"]["per_seed"] == [0.4, 0.4, 0.7]
    assert t["arms"]["a"]["wall_s_mean"] == 660.0


FAKE_RECIPE = textwrap.dedent('''
    """A stand-in for recipes/offline_to_online.py: records how it was called, writes what
    the Trainer writes (metrics.jsonl, summary.json). Fails for seed 13; for seed 21 the
    first attempt stops after a checkpoint (a resume finishes it); seed 34 waits for a file
    "go" in its run folder (30 s at most)."""
    import argparse, json, os, sys
    from pathlib import Path
    ap = argparse.ArgumentParser()
    ap.add_argument("--out"); ap.add_argument("--seed", type=int)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--set", nargs="*", default=[]); ap.add_argument("--world")
    a, _ = ap.parse_known_args()
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    with open(out / "calls.jsonl", "a") as f:
        f.write(json.dumps({"argv": sys.argv[1:], "resume": a.resume,
                            "omp": os.environ.get("OMP_NUM_THREADS")}) + "\\n")
    if a.seed == 13:
        sys.exit("boom")
    if a.seed == 34:  # runs until told to finish (a file "go" in its folder), 30 s at most
        import time
        (out / "started").write_text(str(os.getpid()))
        t0 = time.time()
        while not (out / "go").exists():
            if time.time() - t0 > 30:
                sys.exit("never told to finish")
            time.sleep(0.05)
    if a.seed == 21 and not a.resume:
        import time
        (out / "checkpoints").mkdir()
        (out / "checkpoints" / "latest").write_text("ckpt-0001")
        time.sleep(0.3)
        sys.exit(3)
    k = 5 + a.seed
    stages = {}
    with open(out / "metrics.jsonl", "a") as f:
        for st, x, wins in (("copier", 0, 3), ("offline", 0, 4), ("online-1", 8, k - 1),
                            ("online", 16, k)):
            stages[st] = {"success_rate": wins / 10, "ci95": [0.1, 0.9], "judged_episodes": 10,
                          "successes": wins, "mean_length": 9.0, "mean_length_success": 8.0,
                          "failure_kinds": {"ran_out_of_steps": 10 - wins}}
            f.write(json.dumps({"stage": "eval:" + st, "online_trajectories": x,
                                "success_rate": wins / 10}) + "\\n")
        f.write(json.dumps({"stage": "online", "seconds": 2.0,
                            "time_split": {"actor": 1.5, "collect": 0.5}}) + "\\n")
    (out / "summary.json").write_text(json.dumps({"stages": stages, "wall_s": 12.5,
                                                  "config": {"seed": a.seed}}))
''')


@pytest.fixture
def fake_grid(tmp_path, monkeypatch):
    """A grid of the stand-in recipe in a repository of its own (``grid_repo.ROOT``): a
    package, the recipe and the spec, committed."""
    repo = tmp_path / "repo"
    recipe = repo / "fake_recipe.py"
    (repo / "digirl_lite").mkdir(parents=True)
    (repo / "digirl_lite" / "code.py").write_text("x = 1")
    recipe.write_text(FAKE_RECIPE)
    path = _spec_file(repo, seeds=[0, 1, 2], recipe=str(recipe), set={"eval_every": 1},
                      arms=[{"name": "a"}])
    _git_repo(repo)
    monkeypatch.setattr(grid_repo, "ROOT", repo)
    return grid.load_spec(path), tmp_path / "runs", tmp_path / "results"


def _calls(job) -> list[dict]:
    p = job.out / "calls.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.is_file() else []


def test_resume_skips_finished_and_resumes_checkpointed(fake_grid):
    spec, runs, results = fake_grid
    done, ckpt, fresh = grid.jobs_of(spec, runs_dir=runs, results_dir=results)
    _write(done.result, _result("a", 0, (5, 10, 8.0)))  # finished: a result file
    (ckpt.out / "checkpoints").mkdir(parents=True)
    (ckpt.out / "checkpoints" / "latest").write_text("ckpt-0003")
    (fresh.out / "store").mkdir(parents=True)  # no checkpoint: nothing to keep
    assert [j.state() for j in (done, ckpt, fresh)] == ["done", "resume", "fresh"]
    outcome = grid.run_jobs([done, ckpt, fresh], 2, check_configs=False, poll_s=0.05)
    assert outcome["skipped"] == [done] and [j.seed for j in outcome["ran"]] in ([1, 2], [2, 1])
    assert _calls(done) == []
    assert [c["resume"] for c in _calls(ckpt)] == [True]
    assert [c["resume"] for c in _calls(fresh)] == [False]
    assert not (fresh.out / "store").exists()
    threads = str(max(1, grid.cpu_count() // 2))
    assert {c["omp"] for c in _calls(ckpt) + _calls(fresh)} == {threads}
    r = json.loads(ckpt.result.read_text())
    assert r["resumed"] is True and "--set eval_every=1" in r["command"]
    assert r["command"].startswith("python fake_recipe.py ") and "--resume" not in r["command"]
    assert r["stages"]["online"] == {
        "success_rate": 0.6, "n": 10, "successes": 6, "ci95": [0.1, 0.9], "mean_length": 9.0,
        "mean_length_success": 8.0, "failure_kinds": {"ran_out_of_steps": 4}}
    assert [(p["stage"], p["online_trajectories"]) for p in r["curve"]] == [
        ("copier", 0), ("offline", 0), ("online-1", 8), ("online", 16)]
    # the process's wall time, not the Trainer's (12.5 s: the stand-in's made-up summary)
    [attempt] = r["attempts"]
    assert r["trainer_wall_s"] == 12.5 and r["wall_s"] == attempt["wall_s"] < 12.5
    assert r["omp_threads"] == attempt["threads"] == int(threads)
    assert attempt["resume"] is True and attempt["exit"] == 0 and attempt["dirty"] is False
    assert attempt["commit"] == r["git"]["commit"] == _head(grid_repo.ROOT)
    assert r["dirty"] is False and r["diff_sha256"] is None
    assert r["online_iteration_s"] == {"actor": 1.5, "collect": 0.5, "total": 2.0}
    assert "commit" in r["git"] and r["config"] == {"seed": 1}
    # run again: everything is done, nothing is called
    again = grid.run_jobs([done, ckpt, fresh], 2, check_configs=False, poll_s=0.05)
    assert len(again["skipped"]) == 3 and len(_calls(ckpt)) == 1


def test_a_job_another_live_runner_holds_is_left_alone(fake_grid):
    spec, runs, results = fake_grid
    from needs import hold

    held, stale = grid.jobs_of(spec, seeds=[0, 1], runs_dir=runs, results_dir=results)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    stale.out.parent.mkdir(parents=True, exist_ok=True)
    stale.out.with_suffix(".lock").write_text(f"{dead} host\n")  # left by a runner that died
    runner = hold(held.out.with_suffix(".lock"))  # another live runner
    try:
        outcome = grid.run_jobs([held, stale], 2, check_configs=False, poll_s=0.05)
    finally:
        runner.kill()
        runner.wait()
    assert outcome["busy"] == [held] and outcome["ran"] == [stale]
    assert _calls(held) == [] and held.out.with_suffix(".lock").is_file()
    assert not stale.out.with_suffix(".lock").exists()  # released when the job ended
    # the runner gone (killed: its lock file stays), the next call runs the job
    assert grid.run_jobs([held], 1, check_configs=False, poll_s=0.05)["ran"] == [held]


@pytest.mark.slow
def test_a_job_stays_held_while_it_runs_after_its_runner_is_killed(fake_grid, tmp_path):
    """The job's process inherits its lock: a runner killed with SIGKILL leaves the job held
    until the job ends, so no other runner starts it again or clears its folder."""
    spec, runs, results = fake_grid
    [job] = grid.jobs_of(spec, seeds=[34], runs_dir=runs, results_dir=results)
    runner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        from benchmarks import gridlib as grid
        from benchmarks.gridlib import repo
        repo.ROOT = Path({str(grid_repo.ROOT)!r})
        [job] = grid.jobs_of(grid.load_spec(Path({str(spec.path)!r})), seeds=[34],
                             runs_dir=Path({str(runs)!r}), results_dir=Path({str(results)!r}))
        grid.run_jobs([job], 1, check_configs=False, poll_s=0.05)
        """)])
    try:
        deadline = time.time() + 120
        while not (job.out / "started").is_file() and time.time() < deadline:
            time.sleep(0.05)
        assert (job.out / "started").is_file()
        runner.kill()  # as kill -9 would
        runner.wait()
        outcome = grid.run_jobs([job], 1, check_configs=False, poll_s=0.05)
        assert outcome["busy"] == [job] and outcome["ran"] == []
        assert len(_calls(job)) == 1 and not (job.out / "go").exists()  # left alone
    finally:
        (job.out / "go").parent.mkdir(parents=True, exist_ok=True)
        (job.out / "go").write_text("")
    pid = int((job.out / "started").read_text())
    deadline = time.time() + 60
    while time.time() < deadline:  # the job ends; its lock with it
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    assert (job.out / "summary.json").is_file()
    assert grid.run_jobs([job], 1, check_configs=False, poll_s=0.05)["busy"] == []


def test_finished_run_gets_its_result_without_rerunning(fake_grid):
    spec, runs, results = fake_grid
    job = grid.jobs_of(spec, seeds=[2], runs_dir=runs, results_dir=results)[0]
    subprocess.run([sys.executable, spec.arms[0].recipe, *job.recipe_args()], check=True)
    assert job.state() == "finished"
    outcome = grid.run_jobs([job], 1, check_configs=False, poll_s=0.05)
    assert outcome["ran"] == [job] and len(_calls(job)) == 1
    r = json.loads(job.result.read_text())
    assert r["stages"]["online"]["successes"] == 7
    # run by hand, not by a runner: no attempt records, no log; its commit is not this one's
    assert r["attempts"] == [] and r["git"] == {"commit": None, "commits": []}
    assert r["wall_s"] == r["trainer_wall_s"] == 12.5 and r["wall_s_from"].startswith("summary")


def test_failed_job_leaves_no_result(fake_grid, capsys):
    spec, runs, results = fake_grid
    bad, good = grid.jobs_of(spec, seeds=[13, 1], runs_dir=runs, results_dir=results)
    outcome = grid.run_jobs([bad, good], 2, check_configs=False, poll_s=0.05)
    assert outcome["failed"] == [bad] and outcome["ran"] == [good]
    assert not bad.result.exists() and good.result.is_file()
    assert "boom" in bad.log.read_text()
    assert "FAILED g/a-seed13" in capsys.readouterr().out


def test_from_grid_shares_the_other_grids_runs(tmp_path):
    _write(tmp_path / "grids" / "base.json",
           {"seeds": [0], "set": {"eval_every": 5}, "arms": [{"name": "digirl"}]})
    p = _write(tmp_path / "grids" / "abl.json",
               {"seeds": [0, 1], "set": {"critic_loss": "mse"},
                "arms": [{"name": "digirl", "from_grid": "base"}, {"name": "mse"}]})
    spec = grid.load_spec(p)
    assert spec.arms[0] == grid.Arm("digirl", "base", set={"eval_every": 5})
    assert spec.arms[1].set == {"critic_loss": "mse"} and spec.arms[1].grid == "abl"
    job = grid.jobs_of(spec, seeds=[1], runs_dir=tmp_path / "r",
                       results_dir=tmp_path / "res")[0]
    assert job.out == tmp_path / "r" / "base" / "digirl" / "seed1"
    assert job.result == tmp_path / "res" / "base" / "digirl-seed1.json"


@pytest.mark.parametrize("fields, message", [
    ({"seeds": []}, "seeds: must be a non-empty list"),
    ({"seeds": [0, 0]}, "seeds: must be a non-empty list of distinct integers"),
    ({"seed": [0]}, "seed: unknown field"),
    ({"arms": []}, "arms: must be a non-empty list"),
    ({"arms": [{"name": "a"}, {"name": "b", "set": ["x=1"]}]}, "arms[1] (b).set: must be an"),
    ({"arms": [{"name": "a", "sett": {}}]}, "arms[0].sett: unknown field"),
    ({"arms": [{"set": {}}]}, "arms[0].name: must be a name"),
    ({"arms": [{"name": "a", "args": ["--seed", "3"]}]},
     "arms[0] (a).args: --seed is not allowed here (use the spec's seeds)"),
    ({"args": ["--filtered-bc"]}, "(shared).args: --filtered-bc is not allowed here (make"),
    ({"arms": [{"name": "a"}, {"name": "a"}]}, "arms: arm name a appears twice"),
    ({"reference": "z"}, "reference: 'z' is not an arm"),
    ({"world": 3}, "(shared).world: must be a string"),
    ({"arms": [{"name": "a", "from_grid": "nope"}]}, "arms[0] (a).from_grid: no grid spec"),
    ({"arms": [{"name": "a", "from_grid": "g"}]}, "arms[0] (a).from_grid: a cycle"),
])
def test_spec_errors_name_the_field(tmp_path, fields, message):
    path = _spec_file(tmp_path, **fields)
    with pytest.raises(grid.SpecError) as e:
        grid.load_spec(path)
    assert str(e.value).startswith(str(path)) and message in str(e.value)


def test_bad_config_field_names_the_arm(tmp_path):
    spec = grid.load_spec(_spec_file(tmp_path, arms=[{"name": "a", "set": {"no_such": 1}}]))
    job = grid.jobs_of(spec, runs_dir=tmp_path, results_dir=tmp_path)[0]
    with pytest.raises(grid.SpecError, match=r"arm a \(grid g\).*no_such"):
        job.expected_config()
    with pytest.raises(grid.SpecError, match="grid g has no arm 'z'"):
        grid.jobs_of(spec, arms=["z"])


@pytest.mark.parametrize("name", ["table1_webshop", "table1_general", "ablations_webshop",
                                  "constrained_webshop", "drift_webshop"])
def test_shipped_grids_parse(name):
    spec = grid.load_spec(name)
    assert spec.name == name and len(spec.seeds) >= 3
    if name != "constrained_webshop":
        # every job builds its config (constrained_webshop's field lands with its feature:
        # drop this condition then)
        for job in grid.jobs_of(spec):
            assert job.expected_config()["seed"] == job.seed


def test_placeholder_grid_refuses_to_run(tmp_path, capsys):
    path = _spec_file(tmp_path, placeholder="the drift fields do not exist yet")
    assert grid.main([str(path), "--dry-run"]) == 2
    assert "grid g is a placeholder: the drift fields" in capsys.readouterr().err


@pytest.mark.slow
def test_one_quick_job_end_to_end(tmp_path):
    """A real one-job grid under --quick (eval_every 1: a curve point mid-run), then its
    table from the result file."""
    p = _write(tmp_path / "tiny.json", {"seeds": [0], "set": {"eval_every": 1},
                                        "arms": [{"name": "digirl"}]})
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "grid.py"), str(p),
                        "--quick", "--jobs", "2", "--runs-dir", str(tmp_path / "runs"),
                        "--results-dir", str(tmp_path / "results")],
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((tmp_path / "results" / "tiny" / "digirl-seed0.json").read_text())
    assert set(res["stages"]) >= {"copier", "offline", "online-1", "online"}
    on = res["stages"]["online"]
    assert on["n"] == 16 and on["successes"] == round(on["success_rate"] * 16)
    assert [p["stage"] for p in res["curve"]] == ["copier", "offline", "online-1", "online"]
    assert res["config"]["pile_size"] == 24 and "--quick" in res["command"]
    md = (tmp_path / "results" / "tiny" / "table.md").read_text()
    assert "| digirl | online | 1 |" in md
    assert (tmp_path / "results" / "tiny" / "curves.png").is_file()


def test_seed_bands_average_where_every_seed_was_evaluated():
    from digirl_lite.viz.curves import plot_seed_bands

    fig = plot_seed_bands({"a": [([0, 8, 16], [0.4, 0.5, 0.6]), ([0, 8], [0.2, 0.3])],
                           "b": [([0, 16], [0.5, 0.7])]})
    ax = fig.axes[0]
    means = {ln.get_label(): ln for ln in ax.lines if not ln.get_label().startswith("_")}
    assert set(means) == {"a (2 seeds)", "b (1 seed)"}
    a = means["a (2 seeds)"]
    assert list(a.get_xdata()) == [0, 8] and list(a.get_ydata()) == pytest.approx([0.3, 0.4])
    assert len(ax.collections) == 1  # a band for a only: one seed has no interval over seeds


def test_commit_takes_only_its_file(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("a")
    _git_repo(tmp_path)
    (tmp_path / "a.txt").write_text("someone else's staged edit")
    _git(tmp_path, "add", "a.txt")
    result = _write(tmp_path / "results" / "x-seed0.json", {"seed": 0})
    monkeypatch.setattr(grid_repo, "ROOT", tmp_path)
    assert grid.commit_files([result], "grid g: x seed 0")
    assert _git(tmp_path, "show", "--name-only", "--format=%s", "HEAD").split() == [
        "grid", "g:", "x", "seed", "0", "results/x-seed0.json"]
    assert _git(tmp_path, "diff", "--cached", "--name-only").split() == ["a.txt"]  # staged


# -- provenance, and the table's fixes (issue 32, item 3) -------------------------------------
def _head(repo: Path) -> str:
    return _git(repo, "rev-parse", "HEAD").strip()


def _change_code(repo: Path, text: str) -> str:
    (repo / "digirl_lite" / "code.py").write_text(text)
    _git(repo, "commit", "-qam", f"code: {text}")
    return _head(repo)


def test_an_edit_to_the_runners_package_is_a_dirty_tree(fake_grid):
    """The runner is benchmarks/grid.py and its package (issue 50): an uncommitted edit to
    either stops a run, as one to digirl_lite does; neither is in the run's code_id."""
    spec, runs, results = fake_grid
    repo = grid_repo.ROOT
    [job] = grid.jobs_of(spec, seeds=[0], runs_dir=runs, results_dir=results)
    assert {"benchmarks/grid.py", "benchmarks/gridlib"} <= set(job.watched_files())
    assert not {"benchmarks/grid.py", "benchmarks/gridlib"} & set(job.code_files())
    grid.require_clean([job], "the grid")  # clean
    (repo / "benchmarks" / "gridlib").mkdir(parents=True)
    (repo / "benchmarks" / "gridlib" / "stats.py").write_text("T = 2.262")
    with pytest.raises(grid.DirtyTreeError, match=r"\?\? benchmarks/gridlib/stats.py"):
        grid.require_clean([job], "the grid")


@pytest.mark.slow
def test_a_dirty_tree_is_refused_unless_allowed(fake_grid, capsys):
    spec, runs, results = fake_grid
    repo = grid_repo.ROOT
    (repo / "digirl_lite" / "code.py").write_text("x = 2")
    (repo / "digirl_lite" / "new.py").write_text("y = 1")  # untracked: imported all the same
    [job] = grid.jobs_of(spec, seeds=[0], runs_dir=runs, results_dir=results)
    with pytest.raises(grid.DirtyTreeError) as e:
        grid.run_jobs([job], 1, check_configs=False, poll_s=0.05)
    assert "refusing to start the grid" in str(e.value)
    assert " M digirl_lite/code.py\n" in str(e.value) and "?? digirl_lite/new.py" in str(e.value)
    assert _calls(job) == [] and not job.attempts.exists()
    argv = [str(spec.path), "--seeds", "0", "--jobs", "1", "--runs-dir", str(runs),
            "--results-dir", str(results)]
    assert grid.main(argv) == 2
    assert "M digirl_lite/code.py" in capsys.readouterr().err and _calls(job) == []
    # --allow-dirty: it runs, marked dirty, with the hash of the diff and the untracked file
    assert grid.main([*argv, "--allow-dirty"]) == 0
    r = json.loads(job.result.read_text())
    diff = subprocess.run(["git", "diff", "HEAD", "--binary", "--", *job.watched_files()],
                          cwd=repo, capture_output=True, check=True).stdout
    assert b"x = 2" in diff
    sha = hashlib.sha256(diff + b"\ndigirl_lite/new.py\n" + b"y = 1").hexdigest()
    [attempt] = r["attempts"]
    assert r["dirty"] is True and r["diff_sha256"] == attempt["diff_sha256"] == sha
    assert attempt["changed"] == [" M digirl_lite/code.py", "?? digirl_lite/new.py"]
    assert attempt["diff"].startswith("diff HEAD --binary -- digirl_lite fake_recipe.py ")
    assert attempt["commit"] == _head(repo)


def test_wall_time_and_commits_add_up_over_attempts(fake_grid, capsys):
    spec, runs, results = fake_grid
    repo = grid_repo.ROOT
    [job] = grid.jobs_of(spec, seeds=[21], runs_dir=runs, results_dir=results)
    first = grid.run_jobs([job], 1, check_configs=False, poll_s=0.05)
    assert first["failed"] == [job] and job.state() == "resume"
    c1 = _head(repo)
    c2 = _change_code(repo, "x = 2")
    second = grid.run_jobs([job], 1, check_configs=False, poll_s=0.05)
    assert second["ran"] == [job]
    assert f"resuming on {c2[:10]} a run begun on other code ({c1[:10]})" in \
        capsys.readouterr().out
    r = json.loads(job.result.read_text())
    a1, a2 = r["attempts"]
    assert (a1["commit"], a1["resume"], a1["exit"]) == (c1, False, 3) and a1["wall_s"] >= 0.3
    assert (a2["commit"], a2["resume"], a2["exit"]) == (c2, True, 0)
    assert a1["code_id"] != a2["code_id"] and a1["threads"] == a2["threads"]
    assert r["wall_s"] == round(a1["wall_s"] + a2["wall_s"], 1) and r["wall_s_from"] == "attempts"
    assert r["job_wall_s"] == a2["wall_s"] and r["trainer_wall_s"] == 12.5
    assert r["git"] == {"commit": c2, "commits": [c1, c2]} and r["resumed"] is True
    # a run on two versions of the code is its own pair's mismatch
    assert [label for label, _ in grid.run_versions(r)] == [c1[:10], c2[:10]]


def test_a_run_picked_up_finished_keeps_the_commit_it_ran_on(fake_grid):
    spec, runs, results = fake_grid
    repo = grid_repo.ROOT
    [job] = grid.jobs_of(spec, seeds=[2], runs_dir=runs, results_dir=results)
    grid.run_jobs([job], 1, check_configs=False, poll_s=0.05)
    c1, before = _head(repo), json.loads(job.result.read_text())
    job.result.unlink()  # as if the runner had died between the run's end and its result
    _change_code(repo, "x = 3")
    assert job.state() == "finished"
    again = grid.run_jobs([job], 1, check_configs=False, poll_s=0.05)
    assert again["ran"] == [job] and len(_calls(job)) == 1
    r = json.loads(job.result.read_text())
    assert r["git"] == {"commit": c1, "commits": [c1]} and r["attempts"] == before["attempts"]
    assert r["wall_s"] == before["wall_s"]


def test_attempts_from_before_records_come_from_the_log(fake_grid):
    """A run resumed by this runner after a resume by an older one: the older attempt's
    start and threads from the log's header, its end from metrics.jsonl, its commit
    unknown."""
    from datetime import datetime, timedelta

    spec, runs, results = fake_grid
    [job] = grid.jobs_of(spec, seeds=[1], runs_dir=runs, results_dir=results)
    (job.out / "checkpoints").mkdir(parents=True)
    (job.out / "checkpoints" / "latest").write_text("ckpt-0003")
    started = (datetime.now() - timedelta(seconds=1000)).isoformat(timespec="seconds")
    job.log.write_text(f"\n== {started} OMP_NUM_THREADS=2 python r.py --out x\nlost\n")
    t0 = datetime.fromisoformat(started).timestamp()
    (job.out / "metrics.jsonl").write_text(json.dumps({"time": t0 + 400, "stage": "pile"}) + "\n")
    grid.run_jobs([job], 1, check_configs=False, poll_s=0.05)
    r = json.loads(job.result.read_text())
    old, new = r["attempts"]
    assert (old["threads"], old["resume"], old["commit"], old["wall_s"]) == (2, False, None, 400)
    assert old["from"] == "log" and old["wall_s_from"] == "metrics.jsonl"
    assert new["resume"] is True and new["commit"] == _head(grid_repo.ROOT)
    assert r["wall_s"] == round(400 + new["wall_s"], 1)
    assert r["git"]["commits"] == [None, new["commit"]]


@pytest.mark.slow
def test_rerun_stale_reruns_what_is_not_on_the_commit(fake_grid, capsys):
    spec, runs, results = fake_grid
    repo = grid_repo.ROOT
    old, new = grid.jobs_of(spec, seeds=[0, 1], runs_dir=runs, results_dir=results)
    grid.run_jobs([old], 1, check_configs=False, poll_s=0.05)
    c1 = _head(repo)
    c2 = _change_code(repo, "x = 2")
    grid.run_jobs([new], 1, check_configs=False, poll_s=0.05)
    (repo / "results.md").write_text("a table")  # results committed on top: c2's code
    _git(repo, "add", "results.md")
    _git(repo, "commit", "-qm", "results")
    argv = [str(spec.path), "--seeds", "0", "1", "--jobs", "1", "--runs-dir", str(runs),
            "--results-dir", str(results)]
    assert grid.main([*argv, "--rerun-stale", c1]) == 2
    err = capsys.readouterr().err
    assert f"HEAD is {_head(repo)[:10]}, not {c1[:10]}, and digirl_lite differ" in err
    assert grid.main([*argv, "--rerun-stale", c2, "--dry-run"]) == 0
    assert f"stale g/a-seed0: result on {c1[:10]}: would rerun" in capsys.readouterr().out
    assert old.result.is_file() and len(_calls(old)) == 1
    assert grid.main([*argv, "--rerun-stale", c2]) == 0
    out = capsys.readouterr().out
    assert f"HEAD {_head(repo)[:10]} is not {c2[:10]} but has its code" in out
    assert "stale g/a-seed0" in out and "a-seed1" not in out.split("grid g:")[0]
    assert len(_calls(old)) == 1 and len(_calls(new)) == 1  # run afresh: a new folder
    r0, r1 = (json.loads(j.result.read_text()) for j in (old, new))
    assert r0["git"]["commit"] == _head(repo) and r1["git"]["commit"] == c2
    assert grid.run_versions(r0)[0][1] == grid.run_versions(r1)[0][1]  # the same code
    assert grid.is_stale(old, c2) is None and grid.is_stale(new, c2) is None


def test_a_seed_without_successes_keeps_the_success_length(hand_results):
    spec, res = hand_results
    # seed 3 of arm a: no success, and summary.json's NaN for the length of its successes
    _write(res / "g" / "a-seed3.json", _result("a", 3, (0, 10, float("nan"))))
    s = grid.stage_stats(grid.load_results(res, spec)["a"], "online")
    assert (s["successes"], s["n"]) == (18, 40)
    assert s["mean_length_success"] == pytest.approx(220 / 18)  # seeds 0-2's successes
    grid.write_table(spec, res)
    assert "| a | online | 4 |" in (res / "g" / "table.md").read_text()
    assert "| 12.2 |" in (res / "g" / "table.md").read_text()


def test_a_borrowed_arm_brings_the_specs_seeds_only(tmp_path):
    res = tmp_path / "results"
    for s in range(5):
        _write(res / "base" / f"digirl-seed{s}.json",
               {**_result("digirl", s, (5, 10, 8.0)), "grid": "base"})
    for s in (0, 1, 2, 7):  # its own arm's seed 7 (run with --seeds 7) stays
        _write(res / "abl" / f"mse-seed{s}.json", _result("mse", s, (4, 10, 8.0)))
    _write(tmp_path / "grids" / "base.json", {"seeds": [0, 1, 2, 3, 4],
                                              "arms": [{"name": "digirl"}]})
    spec = grid.load_spec(_write(tmp_path / "grids" / "abl.json", {
        "seeds": [0, 1, 2], "arms": [{"name": "digirl", "from_grid": "base"},
                                     {"name": "mse"}]}))
    results = grid.load_results(res, spec)
    assert [r["seed"] for r in results["digirl"]] == [0, 1, 2]
    assert [r["seed"] for r in results["mse"]] == [0, 1, 2, 7]
    t = grid.make_table(spec, results)
    assert t["arms"]["digirl"]["stages"]["online"]["n_seeds"] == 3
    assert t["differences_from_reference"]["mse"]["online"]["seeds"] == [0, 1, 2]


def test_table_warns_when_paired_runs_ran_on_different_code(tmp_path, capsys):
    res = tmp_path / "results"
    c, d, e = "c" * 40, "d" * 40, "e" * 40
    same = {"commit": c, "code_id": "code1", "dirty": False}
    runs = {("a", 0): [same], ("a", 1): [same], ("a", 2): [same],
            ("b", 0): [{**same, "commit": d}],  # results committed since: the same code
            ("b", 1): [{"commit": e, "code_id": "code2", "dirty": False}],
            ("b", 2): [{**same, "dirty": True, "diff_sha256": "f" * 64}]}
    for (arm, seed), attempts in runs.items():
        r = _result(arm, seed, (5, 10, 8.0))
        del r["git"]
        _write(res / "g" / f"{arm}-seed{seed}.json", {**r, "attempts": attempts})
    # a result from before attempt records, on a commit this repository does not have
    _write(res / "g" / "c-seed0.json", _result("c", 0, (5, 10, 8.0)))
    spec = grid.load_spec(_spec_file(tmp_path, arms=[{"name": "a"}, {"name": "b"},
                                                     {"name": "c"}]))
    assert grid.main([str(spec.path), "--table", "--results-dir", str(res)]) == 0
    err = capsys.readouterr().err
    assert "3 paired run(s) differ from their reference run in code" in err
    assert f"- `b` - `a`: seed 1 {e[:10]} vs {c[:10]}; seed 2 {c[:10]}+dirty:ffffffff vs " \
           f"{c[:10]}\n" in err
    assert f"- `c` - `a`: seed 0 abc vs {c[:10]}" in err
    md = (res / "g" / "table.md").read_text()
    assert "**Warning: 3 of these pairs compare runs on different code**" in md
    assert f"- `b` - `a`: seed 1 {e[:10]} vs {c[:10]};" in md
    t = json.loads((res / "g" / "table.json").read_text())
    assert [(m["arm"], m["seed"]) for m in t["mixed_commits"]] == [("b", 1), ("b", 2), ("c", 0)]


def _truth(k_true: int, n: int, tp: int, fp: int, fn: int, tn: int) -> dict:
    return {"truth": "environment", "true_success_rate": k_true / n, "true_successes": k_true,
            "true_episodes": n, "judge_agreement": {
                "judged_success": {"true_success": tp, "true_failure": fp},
                "judged_failure": {"true_success": fn, "true_failure": tn},
                "episodes": tp + fp + fn + tn, "accuracy": (tp + tn) / (tp + fp + fn + tn)}}


def test_the_table_shows_the_true_rate_beside_the_judged_one(tmp_path):
    """Issue 32: where the results carry the environment's truth, table.md gains a `true`
    column (pooled true rate, its count, how often the judge was right), hand-counted; an
    arm without a truth shows "-" there, and a grid with none keeps its old columns."""
    res = tmp_path / "results"
    # arm a, online: judged 5/10 and 7/10; true 4/10 and 6/10; judge right 9 + 8 of 20
    _write(res / "g" / "a-seed0.json", _result("a", 0, (5, 10, 10.0), **_truth(4, 10, 4, 1, 0, 5)))
    _write(res / "g" / "a-seed1.json", _result("a", 1, (7, 10, 10.0), **_truth(6, 10, 5, 2, 0, 3)))
    _write(res / "g" / "b-seed0.json", _result("b", 0, (5, 10, 10.0)))
    spec = grid.load_spec(_spec_file(tmp_path, seeds=[0, 1]))
    results = grid.load_results(res, spec)
    true = grid.stage_stats(results["a"], "online")["true"]
    assert (true["successes"], true["n"], true["pooled"]) == (10, 20, 0.5)
    assert true["mean"] == pytest.approx(0.5) and true["judge_accuracy"] == 17 / 20
    assert "true" not in grid.stage_stats(results["b"], "online")
    md = grid.table_markdown(grid.make_table(spec, results))
    assert "| pooled | true | length |" in md
    assert "| 60.0 [38.7, 78.1] (12/20) | 50.0 [29.9, 70.1] (10/20; judge 85.0% right) | 10.0 |" \
        in md
    assert "| b | online | 1 | 50.0 | 50.0 [23.7, 76.3] (5/10) | - | 10.0 |" in md
    no_truth = grid.table_markdown(grid.make_table(spec, {"b": results["b"]}))
    assert "true" not in no_truth.split("| arm |")[1].split("\n")[0]


def test_a_result_record_keeps_the_truth(tmp_path):
    """The truth keys of a run's summary travel into its result file."""
    job = grid.jobs_of(grid.load_spec(_spec_file(tmp_path)), runs_dir=tmp_path / "runs")[0]
    job.out.mkdir(parents=True)
    rep = {**_stage(5, 10, 10.0), "ci95": [0.2, 0.8], "judged_episodes": 10,
           "success_rate_unjudged_as_failures": 5 / 11, **_truth(4, 11, 4, 1, 0, 5)}
    (job.out / "summary.json").write_text(json.dumps({"stages": {"online": rep}}))
    row = grid.result_record(job, attempts=[])["stages"]["online"]
    assert row["truth"] == "environment" and row["true_successes"] == 4
    assert row["judge_agreement"]["judged_success"] == {"true_success": 4, "true_failure": 1}
    assert row["success_rate_unjudged_as_failures"] == 5 / 11


def test_a_harness_runs_result_keeps_who_decided_and_what_it_lost(tmp_path):
    """A harness evolution's summary (issue 48): the rules' share in all and per task kind,
    each held-out task's outcome and the evolution's lost and gained tasks travel into the
    result file, with the kept edits' ids (not their whole content)."""
    job = grid.jobs_of(grid.load_spec(_spec_file(tmp_path)), runs_dir=tmp_path / "runs")[0]
    job.out.mkdir(parents=True)
    rep = {**_stage(5, 10, 10.0), "ci95": [0.2, 0.8], "judged_episodes": 10,
           "decided": {"agent": 0.7, "rule": 0.3, "xi": 0.0},
           "decided_by_kind": {"search": {"agent": 0.6, "rule": 0.4, "xi": 0.0,
                                          "episodes": 10, "successes": 5}},
           "per_task": {"t1": True, "t2": False}}
    ev = {"best": "n0002", "accepted": 2, "held_out_lost": ["t3"], "held_out_gained": ["t1"],
          "curve": [{"generation": 1}], "edits": [
              {"kind": "skill", "content": '{"id": "ind-dismiss-1", "do": "dismiss"}'},
              {"kind": "rule", "content": "not json"}]}
    (job.out / "summary.json").write_text(json.dumps({"stages": {"online": rep},
                                                      "evolution": ev}))
    rec = grid.result_record(job, attempts=[])
    row = rec["stages"]["online"]
    assert row["decided"]["rule"] == 0.3 and row["decided_by_kind"]["search"]["rule"] == 0.4
    assert row["per_task"] == {"t1": True, "t2": False}
    assert rec["evolution"] == {"best": "n0002", "accepted": 2, "held_out_lost": ["t3"],
                                "held_out_gained": ["t1"], "edits": [
                                    {"kind": "skill", "id": "ind-dismiss-1"},
                                    {"kind": "rule", "id": None}]}


def test_the_finished_runs_line_shows_the_true_rate_where_there_is_one():
    rec = {"stages": {"copier": _stage(3, 10, 9.0),
                      "online": _stage(5, 8, 9.0, **_truth(6, 10, 4, 1, 2, 3))}}
    assert grid._stage_line(rec, ("copier", "online")) == \
        "copier 30.0%, online 62.5% (true 60.0%)"


def test_pairs_give_each_arms_loss_and_the_difference_between_losses(tmp_path):
    """A spec's ``pairs`` (issue 32, item 2): each noisy arm against its own oracle twin,
    seed by seed, and the difference between the two losses, hand-computed; a pair whose
    runs ran different code is warned about like a difference from the reference."""
    res = tmp_path / "results"
    online = {"a": (8, 8, 6), "a_noisy": (6, 8, 6), "b": (7, 7, 7), "b_noisy": (5, 6, 4)}
    same = [{"commit": "c" * 40, "code_id": "code1", "dirty": False}]
    for arm, ks in online.items():
        for seed, k in enumerate(ks):
            r = _result(arm, seed, (k, 10, 8.0))
            del r["git"]
            attempts = [{**same[0], "code_id": "code2"}] if (arm, seed) == ("b_noisy", 2) \
                else same
            _write(res / "g" / f"{arm}-seed{seed}.json", {**r, "attempts": attempts})
    spec = grid.load_spec(_spec_file(
        tmp_path, arms=[{"name": n} for n in online],
        pairs=[["a_noisy", "a"], ["b_noisy", "b"]]))
    t = grid.make_table(spec, grid.load_results(res, spec))
    p = t["pair_differences"]
    assert p["a_noisy - a"]["online"]["mean"] == pytest.approx(-0.2 / 3)  # -0.2, 0, 0
    assert p["b_noisy - b"]["online"]["mean"] == pytest.approx(-0.6 / 3)  # -0.2, -0.1, -0.3
    both = p["(a_noisy - a) - (b_noisy - b)"]["online"]
    assert both["seeds"] == [0, 1, 2]
    assert both["mean"] == pytest.approx((0.0 + 0.1 + 0.3) / 3)
    lo, hi = both["ci95"]
    assert lo < both["mean"] < hi
    assert [(m["arm"], m["reference"], m["seed"]) for m in t["mixed_commits"]] == \
        [("b_noisy", "a", 2), ("b_noisy", "b", 2)]
    grid.write_table(spec, res)
    md = (res / "g" / "table.md").read_text()
    assert "| (a_noisy - a) - (b_noisy - b) | " in md
    assert "| a_noisy - a | " in md and "-6.7" in md
    assert "- `b_noisy` - `b`: seed 2" in md
    with pytest.raises(grid.SpecError, match="pairs"):
        grid.load_spec(_spec_file(tmp_path, pairs=[["a", "nope"]]))


def test_table_warns_when_paired_runs_ran_with_other_thread_counts(tmp_path, capsys):
    """A pair whose runs used different OMP_NUM_THREADS (or a run resumed with another
    count) is named, beside the mixed-code warning; unrecorded threads are not guessed."""
    res = tmp_path / "results"
    c = "c" * 40
    attempt = {"commit": c, "code_id": "code1", "dirty": False}
    threads = {("a", 0): [2], ("a", 1): [1], ("a", 2): [1],
               ("b", 0): [1], ("b", 1): [1], ("b", 2): [1, 2]}
    for (arm, seed), ts in threads.items():
        r = _result(arm, seed, (5, 10, 8.0))
        del r["git"]
        _write(res / "g" / f"{arm}-seed{seed}.json",
               {**r, "attempts": [{**attempt, "threads": t} for t in ts]})
    _write(res / "g" / "c-seed0.json", _result("c", 0, (5, 10, 8.0)))  # no threads recorded
    spec = grid.load_spec(_spec_file(tmp_path, arms=[{"name": "a"}, {"name": "b"},
                                                     {"name": "c"}]))
    assert grid.main([str(spec.path), "--table", "--results-dir", str(res)]) == 0
    err = capsys.readouterr().err
    assert "2 paired run(s) ran with other thread counts than their reference run" in err
    assert "- `b` - `a`: seed 0 1 vs 2; seed 2 1/2 vs 1\n" in err
    assert "differ from their reference run in code" in err  # c's unknown commit
    md = (res / "g" / "table.md").read_text()
    assert "**Warning: 2 of these pairs compare runs with different thread counts**" in md
    t = json.loads((res / "g" / "table.json").read_text())
    assert [(m["arm"], m["seed"]) for m in t["mixed_threads"]] == [("b", 0), ("b", 2)]


def test_table_warns_when_paired_runs_ran_in_other_environments(tmp_path, capsys):
    """A pair whose runs recorded other CPU kernels or library versions is named with what
    differs; a run recorded before environments were is not guessed at."""
    res = tmp_path / "results"
    env = {"python": "3.11.7", "cpu": "x", "torch_cpu_capability": "AVX512",
           "packages": {"torch": "2.13.0", "pillow": "12.3.0"}}
    envs = {("a", 0): env, ("a", 1): env, ("a", 2): None,
            ("b", 0): {**env, "torch_cpu_capability": "AVX2"}, ("b", 1): env,
            ("b", 2): {**env, "packages": {"torch": "2.13.0", "pillow": "13.0.0"}}}
    for (arm, seed), e in envs.items():
        _write(res / "g" / f"{arm}-seed{seed}.json",
               {**_result(arm, seed, (5, 10, 8.0)), **({"environment": e} if e else {})})
    spec = grid.load_spec(_spec_file(tmp_path, arms=[{"name": "a"}, {"name": "b"}]))
    assert grid.main([str(spec.path), "--table", "--results-dir", str(res)]) == 0
    err = capsys.readouterr().err
    assert "1 paired run(s) ran in another environment than their reference run" in err
    assert "- `b` - `a` seed 0: torch_cpu_capability AVX2 vs AVX512\n" in err
    md = (res / "g" / "table.md").read_text()
    assert "**Warning: 1 of these pairs compare runs recorded in different environments**" in md
    t = json.loads((res / "g" / "table.json").read_text())
    assert [(m["arm"], m["seed"]) for m in t["mixed_environments"]] == [("b", 0)]
    assert t["arms"]["b"]["cpu_kernels"] == ["AVX2", "AVX512"]
    assert t["arms"]["a"]["cpu_kernels"] == ["?", "AVX512"]


def test_grid_final_stage_is_each_runs_last():
    """The grid's 'final' stage: online for an offline-then-online run, offline for an
    offline-only one (so the two pair at the end of each)."""
    on = grid.with_final_stage({"stages": {"copier": {"x": 0}, "offline": {"x": 1},
                                           "online": {"x": 2}}})
    off = grid.with_final_stage({"stages": {"copier": {"x": 0}, "offline": {"x": 1}}})
    assert on["stages"]["final"] == {"x": 2} and off["stages"]["final"] == {"x": 1}
    assert "final" not in grid.with_final_stage({"stages": {"copier": {"x": 0}}})["stages"]
    for world in ("webshop", "general"):
        g = grid.load_spec(f"paper_{world}")
        assert {a.name for a in g.arms} == {"digirl", "digirl_offline_only", "filtered_bc",
                                            "filtered_bc_offline_only"}
