"""The asynchronous learner (issue 17, item 4; spec/DARWIN.md A.1): ``learner="async"``
takes completed trajectories from a collection that never stops for the learner, drops the
stale ones, updates as the synchronous loop does and publishes its weights; checkpoints and
``--resume`` work as for the synchronous loop."""

from __future__ import annotations

import json
import runpy
import signal
from pathlib import Path

import pytest

from digirl_lite.data import load_trajectories
from digirl_lite.errors import ConfigError
from digirl_lite.train.config import DigiRLConfig, sim_quick
from digirl_lite.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"pile_size": 4, "eval_tasks": 2, "iterations": 2, "rollouts_per_iteration": 2,
         "n_envs": 3, "offline_critic_updates": 1, "critic_updates": 1,
         "offline_actor_updates": 1, "actor_updates": 1, "horizon": 4,
         "learner": "async", "fleet": "async"}


def _run(out: Path, **kw) -> tuple[Trainer, dict]:
    t = Trainer(sim_quick(**{**SMALL, **kw}), out, cache_dir=None, progress=False)
    return t, t.run()


def _online_lines(out: Path) -> list[dict]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r.get("stage") == "online"]


def _online_stored(out: Path):
    trajs, _ = load_trajectories(out / "store", with_images=False)
    return [t for t in trajs if t.source.value == "online"]


@pytest.mark.parametrize("fields, names", [
    ({"learner": "async", "fleet": "local"}, ("learner", "fleet")),
    ({"learner": "async", "fleet": "process"}, ("learner", "fleet")),
    ({"learner": "async", "fleet": "async", "algorithm": "grpo"}, ("learner", "grpo")),
    ({"learner": "async", "fleet": "async", "days_per_iteration": 1.0},
     ("learner", "days_per_iteration")),
    ({"learner": "sync", "max_staleness": 0}, ("max_staleness",)),
    ({"learner": "async", "fleet": "async", "max_staleness": -1}, ("max_staleness",)),
    ({"learner": "sync", "take_order": "completion"}, ("take_order",)),
    ({"learner": "async", "fleet": "async", "take_order": "shortest"}, ("take_order",)),
    ({"learner": "later"}, ("learner",)),
])
def test_an_async_learner_that_cannot_work_is_refused_naming_the_fields(fields, names):
    with pytest.raises(ConfigError) as e:
        DigiRLConfig(**fields)
    assert all(n in str(e.value) for n in names), str(e.value)


def test_the_recipe_refuses_an_async_learner_on_a_lockstep_fleet_before_building(tmp_path):
    recipe = runpy.run_path(str(ROOT / "recipes" / "offline_to_online.py"))
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match="bad configuration: learner='async' .*fleet='local'"):
        recipe["main"](["--quick", "--out", str(out), "--cache-dir", "", "--set",
                        "learner=async", "fleet=local"])
    assert not out.exists()  # nothing built, nothing collected


@pytest.mark.slow  # two tiny Trainer runs, 30-60 s each on 2 shared cores
@pytest.mark.parametrize("algorithm", ["digirl", "ppo"])
def test_an_async_run_reaches_its_summary_with_versioned_steps(tmp_path, algorithm):
    """Through evaluations (collection stopped and restarted around each), every stored
    online step carries the policy version that sampled it, never newer than the learner's
    weights when it was taken and never more than max_staleness older; the staleness of the
    data used is logged per iteration."""
    out = tmp_path / "run"
    t, summary = _run(out, algorithm=algorithm, eval_every=1)
    assert set(summary["stages"]) == {"copier", "offline", "online-1", "online"}
    assert summary["online_trajectories"] == 4 and summary["async"]["kept"] == 4
    lines = _online_lines(out)
    assert [r["iteration"] for r in lines] == [1, 2]
    for r in lines:
        assert sum(r["staleness"].values()) == 2
        assert r["staleness_max"] <= t.cfg.max_staleness
        assert r["async_dropped"] == len(r["async_dropped_staleness"])
        if algorithm == "ppo":
            assert r["ppo_steps"] > 0
    stored = _online_stored(out)
    assert len(stored) == 4 and len({x.traj_id for x in stored}) == 4
    for x in stored:
        versions = [s.policy_version for s in x.steps]
        assert versions and min(versions) >= 0
        assert max(versions) <= x.iteration - 1  # no step from weights the learner had not
        assert x.iteration - 1 - min(versions) <= t.cfg.max_staleness
        assert x.traj_id.startswith("online-s0-a")
    # take_order "start": each collection's trajectories are used in the order their
    # episodes started (ids online-s0-a{generation}-{k}), never a later one before an earlier
    if not any(r["async_dropped"] for r in lines):
        by_generation: dict[str, list[int]] = {}
        for x in stored:
            generation, k = x.traj_id.rsplit("-", 2)[1:]
            by_generation.setdefault(generation, []).append(int(k))
        assert all(sorted(ks) == list(range(len(ks))) for ks in by_generation.values())
    assert {"discarded_running", "discarded_out_of_order"} <= set(summary["async"])


@pytest.mark.slow  # a tiny Trainer run, 30-60 s on 2 shared cores
def test_data_beyond_max_staleness_is_dropped_logged_and_never_trained_on(tmp_path):
    """max_staleness=0 with more phones than trajectories per iteration: the episodes the
    other phones ran with version 0 while the learner made version 1 are too old for
    iteration 2. They are dropped (counted, with their staleness), neither stored nor in
    the buffer the learner trains from; iteration 2 still gets its full batch, all fresh."""
    out = tmp_path / "run"
    t, _ = _run(out, max_staleness=0, n_envs=4)
    first, second = _online_lines(out)
    assert first["async_dropped"] == 0 and first["staleness"] == {"0": 2}
    assert second["async_dropped"] >= 1
    assert second["async_dropped_staleness"] and min(second["async_dropped_staleness"]) >= 1
    assert second["staleness"] == {"0": 2} and second["staleness_max"] == 0
    stored = _online_stored(out)
    assert len(stored) == 4
    for x in stored:  # every step sampled by the weights of the iteration before
        assert {s.policy_version for s in x.steps} == {x.iteration - 1}
    buffered = {x.traj_id for x in t.buffer.trajectories("all", usable_only=False)
                if x.source.value == "online"}
    assert buffered == {x.traj_id for x in stored}
    assert {k: t.summary["async"][k] for k in ("kept", "dropped")} == {
        "kept": 4, "dropped": second["async_dropped"]}


@pytest.mark.slow  # four recipe processes, 1-3 minutes on 2 shared cores
def test_an_async_run_killed_mid_iteration_resumes_with_unique_ids(tmp_path):
    """SIGKILL while the background collection runs and right after an iteration, each
    followed by --resume: episodes in flight at a kill are lost by design; the run ends
    with its iterations' trajectories stored once each, under ids never reused, and every
    stage evaluated."""
    from recipe_runs import run_recipe

    extra = ("learner=async", "fleet=async", "horizon=4", "n_envs=3")
    out = tmp_path / "killed"
    kills = [("background collection 1 started", 1.0), ("stage=online  iteration=1", 0.2),
             ("background collection", 0.5)]
    killed = 0
    for i, (_, delay) in enumerate(kills):
        later = tuple(m for m, _ in kills[i:])
        rc, lines = run_recipe(out, resume=i > 0, markers=later, delay=delay, extra=extra)
        text = "".join(lines)
        assert "Traceback" not in text, text[-3000:]
        if rc == 0:
            break
        assert rc == -signal.SIGKILL, text[-3000:]
        killed += 1
    assert killed >= 2
    rc, lines = run_recipe(out, resume=True, extra=extra)
    assert rc == 0, "".join(lines[-30:])
    stored = _online_stored(out)
    ids = [x.traj_id for x in stored]
    assert len(ids) == len(set(ids)) == 4
    assert sorted(x.iteration for x in stored) == [1, 1, 2, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["stages"]) == {"copier", "offline", "online-1", "online"}
    assert summary["online_trajectories"] == 4


@pytest.mark.slow  # three Trainers built: 10-20 s on 2 shared cores
def test_a_checkpoint_from_before_the_learner_field_resumes(tmp_path):
    """A run checkpointed before ``learner`` and ``max_staleness`` existed resumes under
    their defaults (no config change to allow); another value for them is a change."""
    out = tmp_path / "run"
    small = {k: v for k, v in SMALL.items() if k not in ("learner", "fleet")}
    t = Trainer(sim_quick(**small), out, cache_dir=None, progress=False)
    t.phase = "starting_policy"
    ckpt = t.save_checkpoint()
    state = json.loads((ckpt / "state.json").read_text())
    for name in ("learner", "max_staleness"):
        del state["config"][name]
        del state["summary"]["config"][name]
    (ckpt / "state.json").write_text(json.dumps(state))
    again = Trainer(sim_quick(**small), out, cache_dir=None, progress=False)
    assert again.load_checkpoint() and again.phase == "starting_policy"
    changed = Trainer(sim_quick(**SMALL), out, cache_dir=None, progress=False)
    with pytest.raises(ConfigError, match="learner"):
        changed.load_checkpoint()
