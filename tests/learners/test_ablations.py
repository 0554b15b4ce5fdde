"""The paper's ablations as config fields (issue 16, item 2): what each setting gives the
actor (which trajectories, which steps, which weights), checked on a tiny hand-made buffer
whose critic values are the spec's worked examples (spec/DIGIRL.md section 6)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from digirl_lite.actions import Action, format_action
from digirl_lite.data import Ending, Step, Trajectory
from digirl_lite.learners import make_learner
from digirl_lite.train.config import DigiRLConfig, sim_quick, with_algorithm

TAP = format_action(Action.tap(x=0.5, y=0.62))
# spec section 6: a six-step success (step 3, the voice-input mistake, has A < 0) and a
# ten-step failure (steps 0 and 1 have A > 1/H), H = 10
V_WIN = [0.30, 0.42, 0.55, 0.20, 0.55, 0.60, 0.0]
A_WIN = [0.1475, 0.184375, -0.18125, 0.5125, 0.525, 1.0]
MC_WIN = [0.03125, 0.0625, 0.125, 0.25, 0.5, 1.0]
V_FAIL = [0.30, 0.42, 0.55, 0.20, 0.20, 0.18, 0.18, 0.15, 0.15, 0.12, 0.10]
# a two-step failure whose first step gains 0.08: under Eq. 4.3's 1/H = 0.1, dropped; under
# the released grade (0.08 - 0.05 > 0), kept
V_SMALL = [0.20, 0.28, 0.20]
VALUES = {"win": V_WIN, "fail": V_FAIL, "small": V_SMALL}
INSTR_V = {"win": 0.3, "fail": 0.1, "small": 0.1}  # A_instr: 0.7, -0.1, -0.1


def _traj(name: str, n: int, success: bool, invalid: tuple[int, ...] = ()) -> Trajectory:
    mc = MC_WIN if success else [0.0] * n
    steps = [Step.from_text(task=name, prompt=f"Goal: {name}</s>",
                            action_text="0.88 salad" if i in invalid else TAP,
                            reward=1.0 if (success and i == n - 1) else 0.0, done=i == n - 1,
                            screen_id=f"{name}{i}", next_screen_id=f"{name}{i + 1}",
                            mc_return=mc[i]) for i in range(n)]
    return Trajectory(traj_id=name, task=name, steps=steps, final_reward=float(success),
                      ending=Ending.SUCCESS if success else Ending.BUDGET, horizon=10)


BUFFER = [_traj("win", 6, True), _traj("fail", 10, False, invalid=(1,)),
          _traj("small", 2, False)]


@pytest.fixture
def fixed_critics(monkeypatch):
    """The critics' values are the spec's: select_steps reads them through these two."""
    import digirl_lite.critics.data as data

    monkeypatch.setattr(data, "instruction_values",
                        lambda trajs, text, critic: np.array([INSTR_V[t.task] for t in trajs]))
    monkeypatch.setattr(data, "critic_values_many",
                        lambda trajs, screens, text, critic: [np.array(VALUES[t.task])
                                                             for t in trajs])


def _select(trajectories: str, **cfg):
    stub = SimpleNamespace(cfg=DigiRLConfig(**cfg), text=None, screens=None,
                           instr_critic=None, step_critic=None)
    steps, weights, info = make_learner(stub).select_steps(BUFFER, trajectories)
    return [s.screen_id for s in steps], weights, info


@pytest.mark.parametrize("cfg, trajectories, kept", [
    # the paper: Eq. 4.4 keeps the success (A_instr 0.7 is the top 10%), Eq. 4.3 drops step 2
    ({}, "top_p", ["win0", "win1", "win3", "win4", "win5"]),
    # offline (spec: every success; the same here), whatever instruction_filter says
    ({"instruction_filter": False}, "successes", ["win0", "win1", "win3", "win4", "win5"]),
    # instruction_filter=False online: every trajectory; fail1 is invalid, small0 < 1/H
    ({"instruction_filter": False}, "all", ["win0", "win1", "win3", "win4", "win5", "fail0"]),
    # the released grade keeps small0 (0.08 - 0.05 > 0)
    ({"step_filter": "released"}, "all",
     ["win0", "win1", "win3", "win4", "win5", "fail0", "small0"]),
    ({"step_filter": "none"}, "top_p", [f"win{i}" for i in range(6)]),
    ({"step_filter": "none"}, "all", [f"win{i}" for i in range(6)]
     + [f"fail{i}" for i in range(10) if i != 1] + ["small0", "small1"]),
    ({"algorithm": "filtered_bc"}, "top_p", [f"win{i}" for i in range(6)]),
    ({"algorithm": "awr"}, "top_p", [f"win{i}" for i in range(6)]),
])
def test_select_steps_keeps_what_each_setting_says(fixed_critics, cfg, trajectories, kept):
    ids, weights, info = _select(trajectories, **cfg)
    assert ids == kept
    assert info["kept_steps"] == len(kept)
    assert (weights is not None) == (cfg.get("algorithm") == "awr")


def test_awr_weights_every_step_by_eq_4_1(fixed_critics):
    _, w, info = _select("top_p", algorithm="awr")  # beta 1: uncapped here
    np.testing.assert_allclose(w, np.exp(A_WIN))
    assert info["awr_capped"] == 0
    assert info["awr_ess"] == pytest.approx(w.sum() ** 2 / (w * w).sum(), abs=0.01)
    _, w, info = _select("top_p", algorithm="awr", awr_beta=0.2)  # exp(1 / 0.2) = 148 -> 20
    np.testing.assert_allclose(w, np.minimum(np.exp(np.array(A_WIN) / 0.2), 20.0))
    assert info["awr_capped"] == 1
    _, w, _ = _select("top_p", algorithm="awr", awr_beta=0.2, awr_max_weight=None)
    assert w[-1] == pytest.approx(np.exp(5.0))
    # on the released grade (clamped to [0, 1]), failures included: fail1 is invalid
    ids, w, _ = _select("all", algorithm="awr", step_filter="released")
    assert len(ids) == len(w) == 6 + 9 + 2 and "fail1" not in ids
    assert w.min() == pytest.approx(1.0)  # clamped grade 0 -> exp(0)


def _small_policy():
    from digirl_lite.policy import AutoUIPolicy

    return AutoUIPolicy.sim_preset(seed=0, d_model=32, d_kv=8, d_ff=64, num_heads=4,
                                   img_dim=16)


def _step_once(prompts, feats, actions, weights=None):
    from digirl_lite.policy.updates import text_mle_update

    torch.manual_seed(0)
    policy = _small_policy()
    opt = torch.optim.SGD(policy.model.parameters(), lr=0.1)
    text_mle_update(policy, opt, prompts, feats, actions, None, weights=weights)
    return torch.cat([p.detach().flatten() for p in policy.model.parameters()])


def test_weighted_mle_update_is_the_weighted_mean():
    prompts = ["Previous Actions: Goal: Go to ebay.com</s>", "Previous Actions: Goal: news</s>"]
    feats = np.random.default_rng(0).normal(size=(2, 16)).astype(np.float32)
    actions = [TAP, format_action(Action.tap(x=0.1, y=0.2))]
    first_only = _step_once(prompts[:1], feats[:1], actions[:1])
    both = _step_once(prompts, feats, actions)
    torch.testing.assert_close(_step_once(prompts, feats, actions, [1.0, 0.0]), first_only)
    torch.testing.assert_close(_step_once(prompts, feats, actions, [3.0, 3.0]), both)
    assert not torch.allclose(first_only, both)
    from digirl_lite.policy.updates import text_mle_update

    policy = _small_policy()
    opt = torch.optim.SGD(policy.model.parameters(), lr=0.1)
    for bad in ([0.0, 0.0], [1.0], [1.0, -1.0], [1.0, float("nan")]):
        with pytest.raises(ValueError, match="weights"):
            text_mle_update(policy, opt, prompts, feats, actions, None, weights=bad)


def test_train_actor_hands_each_minibatch_its_weights(monkeypatch):
    # the learner imports mle_update when it trains (the learners import light), so the
    # stand-in goes where that import finds it
    import digirl_lite.policy.updates as updates

    seen = []
    monkeypatch.setattr(updates, "mle_update",
                        lambda policy, opt, steps, *a: seen.append((steps, a[-1])) or 0.5)
    steps = BUFFER[0].steps
    w = np.arange(1.0, 7.0)
    stub = SimpleNamespace(cfg=DigiRLConfig(actor_batch=4), rng=np.random.default_rng(0),
                           policy=None, actor_opt=None, screens=None, accelerator=None,
                           iterate=lambda n, desc: range(n))
    learner = make_learner(stub)
    assert learner.train_actor(steps, 3, w) == 0.5
    assert len(seen) == 3
    for batch, bw in seen:  # each drawn step brings its own weight
        assert [w[steps.index(s)] for s in batch] == list(bw)
    seen.clear()
    learner.train_actor(steps, 1)
    assert seen[0][1] is None


def test_ablation_fields_validate_and_name_themselves():
    d = DigiRLConfig()
    assert (d.instruction_filter, d.step_filter, d.critic_loss, d.awr_beta,
            d.awr_max_weight) == (True, "paper", "ce", 1.0, 20.0)
    for bad, field in [({"step_filter": "ppo"}, "step_filter"),
                       ({"algorithm": "reinforce"}, "algorithm"),
                       ({"algorithm": "ppo", "step_filter": "none"}, "step_filter"),
                       ({"algorithm": "grpo", "value_coef": 1.0}, "value_coef"),
                       ({"ppo_clip_eps": 0.3}, "ppo_clip_eps"),  # digirl does not read it
                       ({"instruction_filter": "yes"}, "instruction_filter"),
                       ({"algorithm": "awr", "awr_beta": 0.0}, "awr_beta"),
                       ({"algorithm": "awr", "awr_beta": float("nan")}, "awr_beta"),
                       ({"algorithm": "awr", "awr_max_weight": -1.0}, "awr_max_weight"),
                       ({"algorithm": "awr", "step_filter": "none"}, "step_filter"),
                       ({"awr_beta": 0.5}, "awr_beta"),  # digirl does not read it
                       ({"algorithm": "filtered_bc", "step_filter": "released"},
                        "step_filter"),
                       ({"algorithm": "filtered_bc", "critic_loss": "mse"}, "critic_loss"),
                       ({"algorithm": "filtered_bc", "instruction_filter": False},
                        "instruction_filter")]:
        with pytest.raises(ValueError, match=field):
            DigiRLConfig(**bad)
    # the Filtered BC arm of an ablation: what it does not read goes back to its default
    fbc = with_algorithm(sim_quick(step_filter="none", instruction_filter=False,
                                   critic_loss="mse"), "filtered_bc")
    assert (fbc.algorithm, fbc.step_filter, fbc.instruction_filter, fbc.critic_loss,
            fbc.pile_size) == ("filtered_bc", "paper", True, "ce", sim_quick().pile_size)
    assert with_algorithm(DigiRLConfig(step_filter="none"), "awr").step_filter == "paper"


@pytest.mark.parametrize("item, field, value", [
    ("instruction_filter=false", "instruction_filter", False),
    ("step_filter=none", "step_filter", "none"),
    ("critic_loss=mse", "critic_loss", "mse"),
    ("algorithm=filtered_bc", "algorithm", "filtered_bc"),
])
def test_each_ablation_parses_from_the_command_line(item, field, value):
    from digirl_lite.train.cli import config_from_args

    args = argparse.Namespace(seed=None, world=None, config=None, quick=True, set=[item])
    assert getattr(config_from_args(args), field) == value
    args.set = ["algorithm=awr", "awr_beta=0.2", "awr_max_weight=null"]
    cfg = config_from_args(args)
    assert (cfg.algorithm, cfg.awr_beta, cfg.awr_max_weight) == ("awr", 0.2, None)
    args.set = ["step_filter=none", "algorithm=awr"]
    with pytest.raises(SystemExit, match="step_filter"):
        config_from_args(args)
