"""A resume that cannot break: checkpoints under fresh names with ``latest`` switched last,
a changed config refused, and the main job killed with SIGKILL at many moments in a row
(during the pile, the offline phase, evaluations, iterations), each time resumed, ending
with the store of an uninterrupted run."""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import pytest
from recipe_runs import SMALL
from recipe_runs import run_recipe as _run

import digirl_lite.train.checkpoints as checkpoints_mod
from digirl_lite.data.store import TrajectoryStore
from digirl_lite.errors import ConfigError
from digirl_lite.train.config import sim_quick
from digirl_lite.train.trainer import Trainer


def _cfg(**kw):
    return sim_quick(**{**SMALL, **kw})


@pytest.mark.slow
def test_checkpoints_get_fresh_names_and_latest_moves_last(tmp_path, monkeypatch, make_trainer):
    out = tmp_path / "run"
    t = make_trainer(_cfg(), out)
    t.build_starting_policy()
    t.phase = "starting_policy"
    root = out / "checkpoints"
    first = t.save_checkpoint()
    second = t.save_checkpoint()
    assert first != second and first.name < second.name
    assert (root / "latest").read_text() == second.name
    # a save killed half way: latest still names the last complete checkpoint
    monkeypatch.setattr(checkpoints_mod, "atomic_write_text",
                        lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        t.save_checkpoint()
    assert (root / "latest").read_text() == second.name
    assert (second / "state.json").is_file() and (second / "policy").is_dir()
    (root / ".tmp-ckpt-99999-x").mkdir()  # what a kill during the writing leaves
    monkeypatch.undo()
    fourth = t.save_checkpoint()
    kept = sorted(p.name for p in root.iterdir())
    assert kept == sorted([second.name, fourth.name, "latest"])  # the newest two
    u = make_trainer(_cfg(), out)
    assert u.load_checkpoint() and u.phase == "starting_policy"
    a = t.policy.model.state_dict()
    b = u.policy.model.state_dict()
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


@pytest.mark.slow
def test_resume_refuses_a_changed_config_unless_told(tmp_path, make_trainer):
    out = tmp_path / "run"
    t = make_trainer(_cfg(), out)
    t.build_starting_policy()
    t.phase = "starting_policy"
    t.save_checkpoint()
    changed = make_trainer(_cfg(critic_lr=5e-4, iterations=3), out)
    with pytest.raises(ConfigError, match="critic_lr") as e:
        changed.run(resume=True)
    assert "iterations" in str(e.value) and "--allow-config-change" in str(e.value)
    assert "eval_tasks" not in str(e.value)  # only the fields that differ
    again = make_trainer(_cfg(critic_lr=5e-4, iterations=3), out)
    assert again.load_checkpoint(allow_config_change=True)
    assert again.summary["config"]["critic_lr"] == 5e-4
    logged = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert logged[-1]["config_changed"]["critic_lr"] == [0.001, 5e-4]
    # a fresh run never writes over a run
    with pytest.raises(FileExistsError, match="resume"):
        make_trainer(_cfg(), out).run()


def _store_ids(out: Path) -> list[str]:
    trajs, _ = TrajectoryStore.open(out / "store").load(with_images=False)
    return [t.traj_id for t in trajs]


@pytest.mark.slow
def test_killed_at_random_moments_the_run_resumes_to_the_same_store(tmp_path):
    """SIGKILL during the pile, the offline phase, the first evaluations, each online
    iteration and at random moments, each followed by ``--resume`` (which must start and
    go on); then a last resume to the end. The store holds each trajectory once, the same
    ids as an uninterrupted run of the same seed, and every stage is evaluated."""
    rng = random.Random(15)
    ref = tmp_path / "ref"
    rc, lines = _run(ref, resume=False)
    assert rc == 0, "".join(lines[-30:])
    want = sorted(_store_ids(ref))
    assert len(want) == 4 + 2 * 2

    out = tmp_path / "killed"
    kills = [(None, rng.uniform(3.0, 8.0)),  # loading, the copier's evaluation
             ("pile:", rng.uniform(0.0, 1.5)), ("offline phase", rng.uniform(0.0, 1.0)),
             ("stage=eval:offline", rng.uniform(0.0, 0.5)),
             ("online phase", rng.uniform(0.5, 2.0)),
             ("stage=online  iteration=1", rng.uniform(0.0, 1.0)),
             ("stage=eval:online-1", rng.uniform(0.0, 1.0)),
             ("stage=online  iteration=2", rng.uniform(0.0, 0.5))]
    resumed = 0
    for i, (marker, delay) in enumerate(kills):
        # this kill's marker or any later one: a phase that the last kill let finish is not
        # redone, so its marker may never come again (waiting for it let the run run to its
        # end, and the loop stopped with one resume where eight were meant)
        later = tuple(m for m, _ in kills[i:] if m is not None)
        rc, lines = _run(out, resume=i > 0, markers=later if marker else (), delay=delay)
        text = "".join(lines)
        assert "Traceback" not in text, text[-3000:]
        if marker is not None:  # killed after it printed a marker: it started
            assert "run folder" in text, text[-3000:]
        if i > 0 and (out / "checkpoints" / "latest").is_file():
            resumed += "stage=resume" in text
        if rc == 0:  # the run finished before this kill: nothing left to interrupt
            break
        assert rc == -signal.SIGKILL, text[-3000:]
    assert resumed >= 5
    rc, lines = _run(out, resume=True)
    assert rc == 0, "".join(lines[-30:])
    got = _store_ids(out)
    assert len(got) == len(set(got))
    assert sorted(got) == want
    # every screen a stored step names was stored with it (none lost to a kill)
    trajs, screens = TrajectoryStore.open(out / "store").load(with_images=False)
    named = {sid for t in trajs for s in t.steps for sid in (s.screen_id, s.next_screen_id)}
    assert named <= set(screens.ids)
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["stages"]) == {"copier", "offline", "online-1", "online"}
    for stage in ("copier", "offline", "online-1", "online"):
        ev = sorted(t.traj_id for t in TrajectoryStore.open(out / "eval" / stage).load(
            with_images=False)[0])
        assert ev == [f"eval-{stage}-{j:05d}" for j in range(2)]


@pytest.mark.slow
def test_resume_refuses_another_algorithm_even_when_told(tmp_path, make_trainer):
    """A PPO run's checkpoint holds a value head and a two-group optimiser: resuming it as
    DigiRL (or back) is refused with a ConfigError naming the algorithms, not a crash in
    the optimiser's state."""
    out = tmp_path / "run"
    t = make_trainer(_cfg(), out)
    t.build_starting_policy()
    t.phase = "starting_policy"
    t.save_checkpoint()
    with pytest.raises(ConfigError, match="algorithm='digirl', not 'ppo'"):
        make_trainer(_cfg(algorithm="ppo"), out).load_checkpoint(allow_config_change=True)


@pytest.mark.slow
def test_the_offline_phase_does_not_depend_on_where_the_pile_came_from(tmp_path):
    """Collecting the pile samples from torch's generator; reading it from the cache does
    not. The offline phase and its evaluation after either must be the same (so arms of a
    grid that share a pile differ only by their settings, whichever arm collected it)."""
    import torch

    cache = tmp_path / "cache"
    weights = []
    for name in ("collects", "reads"):
        t = Trainer(sim_quick(**{**SMALL, "eval_tasks": 6}), tmp_path / name,
                    cache_dir=cache, progress=False)
        t.run(online=False)
        weights.append({k: v.clone() for k, v in t.policy.model.state_dict().items()})
    logs = [[json.loads(line) for line in (tmp_path / n / "metrics.jsonl").open()]
            for n in ("collects", "reads")]
    assert any("cached" in r for r in logs[1] if r.get("stage") == "pile")
    assert not any("cached" in r for r in logs[0] if r.get("stage") == "pile")
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    # the offline evaluation samples from the same stream too
    from digirl_lite.data.store import load_trajectories

    acts = [[[s.action_text for s in t.steps] for t in
             sorted(load_trajectories(tmp_path / n / "eval" / "offline", with_images=False)[0],
                    key=lambda t: t.traj_id)] for n in ("collects", "reads")]
    assert acts[0] and acts[0] == acts[1]


@pytest.mark.slow  # two tiny runs, 1-2 min on 2 free cores
def test_training_does_not_depend_on_how_often_the_run_evaluates(tmp_path):
    """An evaluation samples from a stream of its own (fixed by the seed and the stage) and
    leaves the run's streams as they were: a run that evaluates after every iteration ends
    with the same weights, and the same final evaluation, as one that evaluates only at the
    end (so a stage is evaluated with the same draws whatever came before it). Before the
    fix the final evaluations differed (the weights did not at this size: the tiny online
    phase kept nothing to train on)."""
    import torch

    from digirl_lite.data.store import load_trajectories

    def run(name: str, **kw):
        t = Trainer(sim_quick(**{**SMALL, "iterations": 2, "eval_tasks": 4, **kw}),
                    tmp_path / name, cache_dir=tmp_path / "cache", progress=False)
        summary = t.run()
        weights = {k: v.clone() for k, v in t.policy.model.state_dict().items()}
        acts = {stage: [[s.action_text for s in x.steps] for x in sorted(
            load_trajectories(tmp_path / name / "eval" / stage, with_images=False)[0],
            key=lambda x: x.traj_id)] for stage in summary["stages"]}
        return weights, acts

    w_end, a_end = run("at_the_end", eval_every=0)
    w_every, a_every = run("every_iteration", eval_every=1)
    assert set(a_every) - set(a_end) == {"online-1"}
    assert all(torch.equal(w_end[k], w_every[k]) for k in w_end)
    assert a_end["online"] and a_end["online"] == a_every["online"]
