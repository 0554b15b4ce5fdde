"""The trainer: each step on small data, checkpoints, resume after kill -9, the main job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from digirl_lite.data import Ending, load_trajectories
from digirl_lite.envs.sim.demos import generate_demos, generate_pile
from digirl_lite.train.config import DigiRLConfig, sim_quick

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_cfg():
    return sim_quick(starting_policy="sft", sft_demos=20, sft_updates=5, sft_copy_updates=20,
                     pile_size=6, iterations=1, rollouts_per_iteration=4, n_envs=4,
                     eval_tasks=4)


def _with_features(trainer, trajs, screens):
    trainer.screens.merge(screens)
    trainer.features.fill(trainer.screens)
    return trajs


def test_config_validates_and_round_trips():
    cfg = sim_quick()
    assert DigiRLConfig.from_dict(cfg.as_dict()) == cfg
    with pytest.raises(ValueError, match="algorithm"):
        DigiRLConfig(algorithm="reinforce")
    with pytest.raises(ValueError, match="unknown config fields"):
        DigiRLConfig.from_dict({"iterationz": 3})
    # the paper's defaults where the simulator preset does not change them
    d = DigiRLConfig()
    assert (d.rollouts_per_iteration, d.capacity, d.critic_updates, d.actor_updates,
            d.actor_batch, d.resolved("actor_lr"), d.actor_grad_clip, d.top_p, d.lam) == \
        (16, 5000, 5, 20, 128, 1e-4, 0.01, 0.1, 0.5)
    # the on-policy learners' own rate (issue 28), unless actor_lr says
    assert DigiRLConfig(algorithm="ppo").resolved("actor_lr") == 1e-5
    assert DigiRLConfig(algorithm="grpo", actor_lr=3e-5).resolved("actor_lr") == 3e-5
    # and their offline imitation (issue 28), on unless offline_imitation says
    assert DigiRLConfig(algorithm="ppo").resolved("offline_imitation")
    assert not DigiRLConfig(algorithm="grpo", offline_imitation=False
                            ).resolved("offline_imitation")
    assert not DigiRLConfig().resolved("offline_imitation")
    # one name each: the field (None: the learner's own), read through resolved()
    for old in ("actor_learning_rate", "policy_loss_normalisation", "imitates_offline"):
        assert not hasattr(DigiRLConfig, old)
    with pytest.raises(ValueError, match="actor_lr"):
        DigiRLConfig(actor_lr=0.0)


@pytest.mark.slow  # builds a Trainer (~3 s)
def test_a_runs_summary_records_its_environment(tiny_cfg, make_trainer):
    """summary.json names the libraries and CPU kernels its numbers came from."""
    from digirl_lite.provenance import environment

    t = make_trainer(tiny_cfg)
    assert t._totals(time.perf_counter())["environment"] == environment()


@pytest.mark.slow
def test_critic_updates_lower_the_loss(tiny_cfg, tmp_path, make_trainer):
    t = make_trainer(tiny_cfg)
    trajs = _with_features(t, *generate_pile("webshop", n=24, seed=1)[:2])
    t.buffer.add(trajs)
    from digirl_lite.critics.data import instruction_batch, step_batches
    from digirl_lite.critics.losses import instruction_critic_loss, step_critic_loss

    def losses():
        train = t.buffer.trajectories("train")
        with torch.no_grad():
            b = next(step_batches(train, t.screens, t.text, 10_000, shuffle=False))
            return (step_critic_loss(t.step_critic, b).item(),
                    instruction_critic_loss(t.instr_critic,
                                            instruction_batch(train, t.text)).item())

    s0, i0 = losses()
    t.cfg.critic_batch = 64
    t.critic_opt = torch.optim.Adam(list(t.step_critic.parameters())
                                    + list(t.instr_critic.parameters()), lr=1e-3)
    t.learner.train_critics(60)
    s1, i1 = losses()
    assert s1 < s0 and i1 < i0


@pytest.mark.slow
def test_select_steps_filtered_bc_and_digirl(tiny_cfg, tmp_path, make_trainer):
    t = make_trainer(tiny_cfg)
    trajs = _with_features(t, *generate_pile("webshop", n=40, seed=2)[:2])
    wins = [x for x in trajs if x.is_success]
    assert wins
    fbc = make_trainer(DigiRLConfig.from_dict({**tiny_cfg.as_dict(),
                                               "algorithm": "filtered_bc"}), tmp_path / "fbc")
    fbc.screens = t.screens
    steps, _, kept = fbc.learner.select_steps(trajs, "top_p")
    assert kept["kept_trajectories"] == len(wins)
    assert len(steps) == sum(len(x) for x in wins)  # every step of every success
    steps, _, kept = t.learner.select_steps(trajs, "top_p")
    assert 0 < kept["kept_trajectories"] <= len(trajs)
    assert all(s.action.is_valid for s in steps)
    # offline: every success, with the step filter (a subset of their steps)
    steps_off, _, kept_off = t.learner.select_steps(trajs, "successes")
    assert kept_off["kept_trajectories"] == len(wins)
    ids = {(x.traj_id, i) for x in wins for i in range(len(x))}
    assert len(steps_off) <= len(ids)


@pytest.mark.slow
def test_actor_updates_change_the_policy_and_raise_likelihood(tiny_cfg, tmp_path, make_trainer):
    t = make_trainer(tiny_cfg)
    demos = _with_features(t, *generate_demos("webshop", n=6, seed=0)[:2])
    steps = [s for d in demos for s in d.steps]
    before = {k: v.clone() for k, v in t.policy.model.state_dict().items()}
    from digirl_lite.train.trainer import steps_to_batch

    p, f, a = steps_to_batch(steps, t.screens)
    lp0 = t.policy.log_prob(p, f, a).mean().item()
    t.cfg.actor_lr = 1e-3
    t.actor_opt = torch.optim.AdamW(t.policy.model.parameters(), lr=1e-3)
    t.learner.train_actor(steps, 30)
    lp1 = t.policy.log_prob(p, f, a).mean().item()
    assert lp1 > lp0 + 5
    changed = [k for k, v in t.policy.model.state_dict().items() if not torch.equal(v, before[k])]
    assert "image_dense.weight" in changed and "gate_dense.weight" in changed


@pytest.mark.slow
def test_checkpoint_round_trip(tiny_cfg, tmp_path, make_trainer):
    t = make_trainer(tiny_cfg)
    trajs = _with_features(t, *generate_pile("webshop", n=8, seed=3)[:2])
    t._store_append(trajs)
    t.buffer.add(trajs)
    t.learner.train_critics(3)
    t.iteration, t.online_trajectories = 4, 64
    t.save_checkpoint()
    u = make_trainer(tiny_cfg)
    assert u.load_checkpoint()
    assert (u.iteration, u.online_trajectories) == (4, 64)
    assert [x.traj_id for x in u.buffer] == [x.traj_id for x in t.buffer]
    for k, v in t.step_critic.state_dict().items():
        assert torch.equal(v, u.step_critic.state_dict()[k])
    for k, v in t.policy.model.state_dict().items():
        assert torch.equal(v, u.policy.model.state_dict()[k])
    assert u.rng.integers(0, 10**9) == t.rng.integers(0, 10**9)


@pytest.mark.slow  # a Trainer and three iterations: 10-40 s on 2 shared cores
def test_online_iterations_keep_only_the_buffers_screens(tiny_cfg, tmp_path, make_trainer):
    """Issue 15: after each iteration's ``buffer.add`` the run drops the screens of evicted
    trajectories no buffered one uses, and its caches stay bounded."""
    cfg = DigiRLConfig.from_dict({**tiny_cfg.as_dict(), "capacity": 6, "critic_updates": 1,
                                  "actor_updates": 0})
    t = make_trainer(cfg)
    trajs, pile_screens = generate_pile("webshop", n=18, seed=4)[:2]
    _with_features(t, trajs, pile_screens)
    t._store_append(trajs)
    n0 = len(t.screens)
    for k, start in enumerate(range(0, 18, 6), 1):  # "collected before a crash": no fleet
        t.screens.merge(pile_screens)  # as collecting would add them (with features)
        t.features.fill(t.screens)
        t.online_iteration(k, collected=trajs[start:start + 6])
        used = {sid for x in t.buffer for s in x.steps for sid in (s.screen_id, s.next_screen_id)}
        assert set(t.screens.ids) == used
        assert len(t.features) <= len(t.screens) + 1024
    assert len(t.screens) < n0 and [x.traj_id for x in t.buffer] == [x.traj_id for x in
                                                                       trajs[12:]]


def _run(args, **kw):
    return subprocess.Popen([sys.executable, str(ROOT / "recipes" / "offline_to_online.py"),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **kw)


QUICK = ["--quick", "--cache-dir", "", "--quiet", "--set", "eval_tasks=8", "n_envs=8"]


@pytest.mark.slow
def test_main_job_quick_run_writes_its_artifacts(tmp_path):
    out = tmp_path / "quick"
    p = _run([*QUICK, "--out", str(out)])
    try:
        stdout, _ = p.communicate(timeout=1500)
    finally:
        if p.poll() is None:
            p.kill()  # our own child: never leave it running
    assert p.returncode == 0, stdout[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["stages"]) >= {"copier", "offline", "online"}
    for stage in ("copier", "offline", "online"):
        r = summary["stages"][stage]
        # each stage's rate is its stored evaluation episodes' own (successes / usable ones)
        ev, _ = load_trajectories(out / "eval" / stage)
        usable = [t for t in ev if t.is_usable]
        assert r["episodes"] == len(ev) == 8 and r["judged_episodes"] == len(usable)
        assert r["successes"] == sum(t.is_success for t in usable)
        assert r["success_rate"] == r["successes"] / len(usable)
    assert summary["online_trajectories"] == 2 * 8
    assert (out / "learning_curve.png").stat().st_size > 1000
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    online = [r for r in lines if r.get("stage") == "online"]
    assert [r["iteration"] for r in online] == [1, 2]
    # the mechanism's curve (issue 47): each iteration's successes that took a way back,
    # from the simulator's ground truth; and the evaluations say why their failures failed
    for r in online:
        assert 0 <= r["successes_with_recovery"] <= r["true_successes"] <= 8
        assert set(r["recoveries"]) <= {"popup", "voice", "consent", "back"}
    for stage in ("copier", "offline", "online"):
        rep = summary["stages"][stage]
        assert sum(rep["failure_causes"].values()) == rep["judged_episodes"] - rep["successes"]
    assert "held-out success" in stdout and "digirl" in stdout
    # training changed the policy: the final weights differ from a fresh preset's
    from digirl_lite.policy import AutoUIPolicy

    latest = (out / "checkpoints" / "latest").read_text().strip()
    final = AutoUIPolicy.load(out / "checkpoints" / latest / "policy")
    fresh = AutoUIPolicy.sim_preset(seed=0)
    assert not torch.equal(final.model.image_dense.weight, fresh.model.image_dense.weight)
    trajs, _ = load_trajectories(out / "store")
    assert len(trajs) == 24 + 16 and len({t.traj_id for t in trajs}) == len(trajs)
    # every step the policy sampled keeps its tokens and their log-probabilities (issue 17)
    for s in (s for t in trajs for s in t.steps):
        assert s.action_token_ids and len(s.action_log_probs) == len(s.action_token_ids)
        assert all(x <= 0 for x in s.action_log_probs)


@pytest.mark.slow
def test_resume_after_kill_loses_and_repeats_nothing(tmp_path):
    out = tmp_path / "killed"
    args = [*QUICK, "--out", str(out), "--set", "iterations=4", "eval_tasks=4"]
    p = _run(args, start_new_session=True)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 1200
    while not metrics.is_file() and p.poll() is None and time.time() < deadline:
        time.sleep(0.2)  # the run has begun (its folder is locked before anything is logged)
    # a resume while the run still runs is refused (the run folder's lock), and says by whom
    early = _run([*args, "--resume"])
    said, _ = early.communicate(timeout=600)
    assert early.returncode != 0 and "not started: " in said, said[-3000:]
    assert f"is in use by process {p.pid} on host" in said, said[-3000:]
    assert p.poll() is None  # the run goes on
    while time.time() < deadline:
        if metrics.is_file() and '"iteration": 2' in metrics.read_text():
            break
        if p.poll() is not None:
            pytest.fail("the run ended before it could be killed")
        time.sleep(0.2)
    time.sleep(1.5)  # land somewhere inside iteration 3
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    q = _run([*args, "--resume"])
    try:
        stdout, _ = q.communicate(timeout=1500)
    finally:
        if q.poll() is None:
            q.kill()
    assert q.returncode == 0, stdout[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["online_trajectories"] == 4 * 8
    trajs, screens = load_trajectories(out / "store")
    online = [t for t in trajs if t.source.value == "online"]
    assert len({t.traj_id for t in trajs}) == len(trajs)  # nothing stored twice
    assert len(online) == 4 * 8
    assert sorted({t.iteration for t in online}) == [1, 2, 3, 4]
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert any(r.get("stage") == "resume" for r in lines)
    assert summary["buffer"]["total"] == len(trajs)  # every stored trajectory is buffered
    final = summary["stages"]["online"]  # the final evaluation's rate, from its episodes
    ev, _ = load_trajectories(out / "eval" / "online")
    usable = [t for t in ev if t.is_usable]
    assert final["episodes"] == len(ev) == 4
    assert final["success_rate"] == sum(t.is_success for t in usable) / len(usable)
    assert not any(t.ending is Ending.INFRA for t in online)
    # every screen a stored step names was stored with it (none lost to the kill)
    named = {sid for t in trajs for s in t.steps for sid in (s.screen_id, s.next_screen_id)}
    assert named <= set(screens.ids)


@pytest.mark.slow
def test_sft_starts_with_copy_drills_that_teach_copying(tmp_path, make_trainer):
    """The copy phase comes first (logged), then demonstrations with drills mixed in; the
    drills raise the likelihood of copying products the policy never saw."""
    from itertools import islice

    from digirl_lite.envs.sim.drills import copy_drills
    from digirl_lite.policy import AutoUIPolicy

    cfg = sim_quick(starting_policy="sft", sft_demos=10, sft_copy_updates=25, sft_updates=3,
                    sft_batch=16)
    t = make_trainer(cfg)
    policy = t.train_sft()
    phases = [json.loads(x).get("phase") for x in
              (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert phases[0] == "copy" and phases[-1] == "demos"
    held = list(islice(copy_drills(seed=99), 16))
    fresh = AutoUIPolicy.sim_preset(seed=cfg.sft_seed)
    img = np.zeros((16, policy.img_dim), dtype=np.float32)
    with torch.no_grad():
        before = fresh.log_prob([p for p, _ in held], img, [a for _, a in held]).mean()
        after = policy.log_prob([p for p, _ in held], img, [a for _, a in held]).mean()
    assert after > before + 10
    with pytest.raises(ValueError, match="sft_copy_share"):
        sim_quick(sft_copy_share=1.0)


def test_effective_fields_compare_runs_as_they_run():
    """A moved default compares as the value the run uses (None: the algorithm's own, issue
    28), and a field the algorithm does not read is left out; so a checkpoint or grid result
    written before a default moved differs only where the run would."""
    from digirl_lite.learners.grpo import GRPO
    from digirl_lite.train.config import effective_fields, sim_webshop

    old_digirl = {**sim_webshop().as_dict(), "policy_loss_norm": "token", "actor_lr": 1e-4}
    assert effective_fields(old_digirl) == effective_fields(sim_webshop().as_dict())
    grpo = sim_webshop(algorithm="grpo").as_dict()
    eff = effective_fields(grpo)
    assert eff["policy_loss_norm"] == "trajectory" and eff["actor_lr"] == GRPO.defaults["actor_lr"]
    assert "ppo_lam" not in eff and "step_filter" not in eff  # GRPO reads neither
    assert effective_fields({**grpo, "policy_loss_norm": "token"}) != eff
    assert eff["offline_imitation"] is True  # None: GRPO's own
    # a result written when offline imitation was off by default differs
    assert effective_fields({**grpo, "offline_imitation": False}) != eff
