"""A learner is one file: it registers itself and declares what the run needs from it (its
config fields and checks, critics, task draws, data parallelism, checkpoint state), and the
Trainer, the config, the viewer and the report take it from there with no edit elsewhere."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

from digirl_lite.learners import learner_class, learner_names, register
from digirl_lite.learners.base import Learner


@dataclass
class EverySuccessOptions:
    """Settings only this learner has (the config's ``learner_options``)."""

    minibatch: int = 4
    """Steps per update."""

    def __post_init__(self):
        if not (isinstance(self.minibatch, int) and self.minibatch > 0):
            raise ValueError(f"minibatch must be a positive int, not {self.minibatch!r}")


@register("every_success_test")
class EverySuccess(Learner):
    """Imitates every valid step of the buffer's successes; no critics; each online task
    drawn twice in a row; one process; its own setting ``minibatch``."""

    defaults = {"actor_lr": 3e-4}
    Options = EverySuccessOptions
    data_parallel = False
    offline_work = "actor"

    def draw_tasks(self, n_tasks: int, n: int) -> np.ndarray:
        return np.repeat(self.rng.integers(0, n_tasks, n // 2), 2)

    def _imitate(self, trajs, updates: int) -> dict:
        from digirl_lite.policy.updates import mle_update

        steps = [s for t in trajs if t.is_success for s in t.steps if s.action.is_valid]
        loss = float("nan")
        for _ in self.run.iterate(updates, "actor"):
            if steps:
                idx = self.rng.integers(0, len(steps), self.options.minibatch)
                self.batches.append(len(idx))
                loss = mle_update(self.policy, self.run.actor_opt, [steps[i] for i in idx],
                                  self.run.screens, self.cfg.actor_grad_clip,
                                  self.run.accelerator)
        return {"actor_loss": loss, "kept_steps": len(steps)}

    def __init__(self, run) -> None:
        super().__init__(run)
        self.batches: list[int] = []

    def offline(self, pile):
        return self.run.timed("offline_actor", lambda: self._imitate(
            pile, self.cfg.offline_actor_updates))

    def update(self, collected):
        return self.run.timed("actor", lambda: self._imitate(
            self.run.buffer.trajectories("train"), self.cfg.actor_updates))


def test_a_learner_registers_itself():
    assert learner_class("every_success_test") is EverySuccess
    assert EverySuccess.name == "every_success_test"
    assert {"digirl", "filtered_bc", "awr", "ppo", "grpo"} <= set(learner_names())
    register("every_success_test", EverySuccess)  # the same class again: no clash


def test_a_name_taken_twice_is_an_error_naming_both_classes():
    class Impostor(Learner):
        pass

    with pytest.raises(ValueError) as e:
        register("digirl", Impostor)
    assert "digirl_lite.learners.digirl.DigiRL" in str(e.value)
    assert "Impostor" in str(e.value)
    with pytest.raises(ValueError, match="EverySuccess"):
        register("every_success_test")(Impostor)
    assert learner_class("digirl").__name__ == "DigiRL"


@pytest.mark.slow  # ~0.7 s: the config's first checks
def test_the_config_takes_its_algorithms_from_the_registry():
    from digirl_lite.errors import ConfigError
    from digirl_lite.train.config import sim_quick, unread

    cfg = sim_quick(algorithm="every_success_test")
    assert cfg.resolved("actor_lr") == 3e-4
    # every algorithm-specific field is another learner's: this one reads none
    assert {"step_filter", "ppo_clip_eps", "grpo_group", "awr_beta"} <= set(
        unread("every_success_test"))
    with pytest.raises(ValueError, match="has no effect"):
        sim_quick(algorithm="every_success_test", ppo_epochs=3)
    with pytest.raises(ConfigError, match="algorithm must be one of .*every_success_test"):
        sim_quick(algorithm="nope")
    # the config's sync / async modes are LEARNER_MODES (LEARNERS named two things)
    from digirl_lite.train import config

    assert config.LEARNER_MODES == ("sync", "async") and not hasattr(config, "LEARNERS")


@pytest.mark.slow  # a tiny quick job, 20-40 s
def test_a_learner_of_one_file_runs_the_quick_job(tmp_path):
    import torch

    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    small = {"pile_size": 8, "eval_tasks": 4, "iterations": 2, "rollouts_per_iteration": 4,
             "n_envs": 4, "offline_actor_updates": 2, "actor_updates": 2, "horizon": 6,
             "seed": 3}
    t = Trainer(sim_quick(**small, algorithm="every_success_test",
                          learner_options={"minibatch": 3}), tmp_path,
                cache_dir=None, progress=False)
    assert isinstance(t.learner, EverySuccess) and t.learner.options.minibatch == 3
    assert t.step_critic is None and t.instr_critic is None and t.critic_opt is None
    assert t.actor_opt.param_groups[0]["lr"] == 3e-4
    # one name, one thing: the process count is world_size, cfg.world the task set
    assert t.world_size == 1 and not hasattr(t, "world") and t.cfg.world == "webshop"
    summary = t.run()
    assert {"offline", "online"} <= set(summary["stages"])
    assert t.learner.batches and set(t.learner.batches) == {3}  # its own setting, read
    online = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    online = [r for r in online if r.get("stage") == "online"]
    assert [r["iteration"] for r in online] == [1, 2]
    assert all("kept_steps" in r for r in online)
    # each online task drawn twice in a row (this learner's draw)
    from digirl_lite.data import load_trajectories

    trajs, _ = load_trajectories(tmp_path / "store", with_images=False)
    it1 = sorted((t for t in trajs if t.iteration == 1), key=lambda t: t.traj_id)
    assert [x.task for x in it1[0::2]] == [x.task for x in it1[1::2]]
    # no critics in its checkpoint; the learner's own state beside the actor's
    ckpt = tmp_path / "checkpoints" / (tmp_path / "checkpoints" / "latest").read_text().strip()
    state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=True)
    assert "step_critic" not in state and state["learner"] == {}


def test_a_learner_that_is_not_data_parallel_is_refused_on_several_processes():
    from digirl_lite.learners.ppo import PPO

    assert learner_class("digirl").data_parallel and not PPO.data_parallel
    assert not learner_class("grpo").data_parallel


def test_the_viewer_uses_the_learners_keep_rules():
    """Filtered BC keeps successes and every step; DigiRL the top advantages and the step
    filter's steps; AWR DigiRL's trajectories and every step."""
    r = np.array([1.0, 0.0, 1.0, 0.0])
    a = np.array([0.1, 0.9, 0.2, -0.5])
    ok = np.array([True, False, True])
    fbc, digirl, awr = (learner_class(n) for n in ("filtered_bc", "digirl", "awr"))
    assert fbc.trajectory_keep(r, a, 0.5).tolist() == [True, False, True, False]
    assert digirl.trajectory_keep(r, a, 0.5).tolist() == [False, True, True, False]
    assert digirl.step_keep(ok).tolist() == ok.tolist()
    assert fbc.step_keep(ok).all() and awr.step_keep(ok).all()


@pytest.mark.slow  # three small policies, ~20 s
def test_the_ppo_reference_travels_in_the_learners_state(tmp_path):
    """PPO's frozen reference is checkpointed through its state_dict (no files of its own in
    the run folder), and a run folder written before that (``reference_policy/``) loads."""
    import torch

    from digirl_lite.learners.ppo import PPO
    from digirl_lite.train.config import sim_quick

    def policy(seed):
        from digirl_lite.policy import AutoUIPolicy

        return AutoUIPolicy.sim_preset(seed=seed, d_model=32, d_kv=8, d_ff=64, num_heads=4,
                                       img_dim=16)

    cfg = sim_quick(algorithm="ppo")
    first = PPO(SimpleNamespace(cfg=cfg, policy=policy(0), out=tmp_path))
    ref = first.reference_policy()
    assert list(tmp_path.iterdir()) == []  # nothing written beside the checkpoints
    state = first.state_dict()
    again = PPO(SimpleNamespace(cfg=cfg, policy=policy(1), out=tmp_path))
    again.load_state_dict(state)
    got = again.reference_policy()
    for a, b in zip(ref.parameters(), got.parameters()):
        assert torch.equal(a, b)
    assert not all(torch.equal(a, b) for a, b in zip(got.model.parameters(),
                                                      again.policy.model.parameters()))
    # an older run's folder: OUT/reference_policy/{policy, state.json}
    ref.save(tmp_path / "reference_policy" / "policy")
    (tmp_path / "reference_policy" / "state.json").write_text('{"iteration": 1}')
    old = PPO(SimpleNamespace(cfg=cfg, policy=policy(2), out=tmp_path))
    old.load_state_dict({})
    for a, b in zip(ref.parameters(), old.reference_policy().parameters()):
        assert torch.equal(a, b)


@pytest.mark.slow  # ~0.9 s: matplotlib
def test_plot_leaves_matplotlib_backend_alone(tmp_path):
    """A notebook's inline backend survives the run's learning curve."""
    import matplotlib

    from digirl_lite.train.trainer import Trainer

    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        fake = SimpleNamespace(curve=[(0, 0.5), (4, 0.75)], out=tmp_path,
                               cfg=SimpleNamespace(eval_tasks=4, env="sim", world="webshop",
                                                   algorithm="digirl", seed=0))
        path = Trainer.plot(fake)
        assert path.is_file() and path.stat().st_size > 0
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)


@pytest.mark.slow  # the config's first checks, ~0.7 s
def test_a_learners_own_options_are_checked_by_name():
    """``learner_options`` holds the settings only the run's learner has: its ``Options``
    defaults, an unknown option or a refused value a ConfigError naming it, options given
    to a learner without any refused, and another algorithm's options not carried over."""
    from digirl_lite.errors import ConfigError
    from digirl_lite.train.config import DigiRLConfig, sim_quick, with_algorithm

    assert EverySuccess.parse_options({}).minibatch == 4
    cfg = sim_quick(algorithm="every_success_test", learner_options={"minibatch": 8})
    assert DigiRLConfig.from_dict(cfg.as_dict()).learner_options == {"minibatch": 8}
    with pytest.raises(ConfigError, match=r"no option 'minbatch' \(its options: \['minibatch'\]"):
        sim_quick(algorithm="every_success_test", learner_options={"minbatch": 8})
    with pytest.raises(ConfigError, match="learner_options of algorithm 'every_success_test'"
                                          ": minibatch must be a positive int"):
        sim_quick(algorithm="every_success_test", learner_options={"minibatch": 0})
    with pytest.raises(ConfigError, match="algorithm 'digirl' declares no options"):
        sim_quick(learner_options={"minibatch": 8})
    with pytest.raises(ConfigError, match="learner_options must be an object"):
        EverySuccess.parse_options(["minibatch"])
    assert with_algorithm(cfg, "digirl").learner_options == {}
