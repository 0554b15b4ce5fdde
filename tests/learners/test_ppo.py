"""Darwin's learner math (digirl_lite.ppo) against DARWIN.md section D's worked numbers and a
slow per-token reference."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from digirl_lite import ppo

V = [0.5, 0.6, 0.7, 0.8, 0.9]
R = [0.0, 1.0]
LENGTHS = [2, 3]


def gae_reference(values, rewards, lengths, gamma, lam, terminal=True, last_value=0.0):
    """A_i = sum_k (prod_{i <= j < k} c_j * lam) * delta_k, spelled out token by token."""
    tokens = []  # (value, reward after the token, discount to the next token)
    i = 0
    for r, n in zip(rewards, lengths):
        for j in range(n):
            last = j == n - 1
            tokens.append((values[i], r if last else 0.0, gamma if last else 1.0))
            i += 1
    n = len(tokens)
    delta = []
    for i, (v, r, c) in enumerate(tokens):
        nxt = tokens[i + 1][0] if i + 1 < n else (0.0 if terminal else last_value)
        delta.append(r + c * nxt - v)
    adv = []
    for i in range(n):
        total, w = 0.0, 1.0
        for k in range(i, n):
            total += w * delta[k]
            w *= tokens[k][2] * lam
        adv.append(total)
    return np.array(adv), np.array(adv) + np.array([t[0] for t in tokens])


def test_token_gae_matches_section_d():
    adv, ret = ppo.token_gae(V, R, LENGTHS, gamma=0.9, lam=0.5)
    np.testing.assert_allclose(adv, [0.154375, 0.10875, 0.175, 0.15, 0.1], atol=1e-12)
    np.testing.assert_allclose(ret, [0.654375, 0.70875, 0.875, 0.95, 1.0], atol=1e-12)
    np.testing.assert_allclose(ppo.value_targets(adv, V), ret)
    # torch tensors in, numpy out
    a_t, _ = ppo.token_gae(torch.tensor(V), torch.tensor(R), torch.tensor(LENGTHS), 0.9, 0.5)
    assert isinstance(a_t, np.ndarray)
    np.testing.assert_allclose(a_t, adv, atol=1e-6)


def test_token_gae_limits_of_section_d():
    # gamma = lambda = 1: Monte Carlo, A_i = R - v_i and every return is R = 1
    adv, ret = ppo.token_gae(V, R, LENGTHS, gamma=1.0, lam=1.0)
    np.testing.assert_allclose(adv, 1.0 - np.array(V), atol=1e-12)
    np.testing.assert_allclose(ret, np.ones(5), atol=1e-12)
    # gamma 0.9, lambda 1: A_1 = 0.4 and G_1 = 0.9 (= gamma * r_2)
    adv, ret = ppo.token_gae(V, R, LENGTHS, gamma=0.9, lam=1.0)
    assert adv[0] == pytest.approx(0.4) and ret[0] == pytest.approx(0.9)


@pytest.mark.parametrize("seed", range(25))
def test_token_gae_equals_the_per_token_reference(seed):
    rng = np.random.default_rng(seed)
    t = int(rng.integers(1, 7))
    lengths = rng.integers(1, 6, t)
    values = rng.normal(size=int(lengths.sum()))
    rewards = rng.normal(size=t) * (rng.random(t) < 0.5)
    gamma, lam = float(rng.random()), float(rng.random())
    terminal = bool(rng.random() < 0.5)
    last = float(rng.normal())
    got = ppo.token_gae(values, rewards, lengths, gamma, lam, terminal, last)
    want = gae_reference(values, rewards, lengths, gamma, lam, terminal, last)
    np.testing.assert_allclose(got[0], want[0], atol=1e-10)
    np.testing.assert_allclose(got[1], want[1], atol=1e-10)


def test_token_gae_bootstraps_a_truncated_trajectory_only_when_asked():
    """Infrastructure truncations are terminal (value 0 after) by default (A.6); with
    terminal=False the last token takes gamma * last_value."""
    a_term, _ = ppo.token_gae([0.2, 0.3], [0.0], [2], gamma=0.9, lam=0.5)
    a_boot, _ = ppo.token_gae([0.2, 0.3], [0.0], [2], gamma=0.9, lam=0.5, terminal=False,
                              last_value=0.8)
    assert a_term[-1] == pytest.approx(-0.3)
    assert a_boot[-1] == pytest.approx(0.9 * 0.8 - 0.3)


@pytest.mark.parametrize("values, rewards, lengths, msg", [
    ([0.1, 0.2], [0.0], [3], "sum to 3 tokens but there are 2 values"),
    ([0.1, 0.2], [0.0, 1.0], [2], "2 rewards but 1 step lengths"),
    ([0.1, 0.2], [0.0, 1.0], [2, 0], "at least one action token"),
])
def test_token_gae_rejects_shapes_that_do_not_fit(values, rewards, lengths, msg):
    with pytest.raises(ValueError, match=msg):
        ppo.token_gae(values, rewards, lengths)
    with pytest.raises(ValueError, match="gamma and lam"):
        ppo.token_gae([0.1], [1.0], [1], gamma=1.5)


def test_ppo_clip_loss_matches_section_d_in_numpy_and_torch():
    rho, adv = [1.5, 0.5, 1.1], [1.0, -1.0, 1.0]
    np.testing.assert_allclose(ppo.ppo_clip_loss(rho, adv), [-1.2, 0.8, -1.1])
    r = torch.tensor(rho, requires_grad=True)
    loss = ppo.ppo_clip_loss(r, torch.tensor(adv))
    assert torch.allclose(loss, torch.tensor([-1.2, 0.8, -1.1]))
    loss.sum().backward()
    # clipped tokens pass no gradient; the unclipped one gets -A
    assert r.grad.tolist() == pytest.approx([0.0, 0.0, -1.0])


def test_grpo_advantages_use_the_population_std_by_default():
    np.testing.assert_allclose(ppo.grpo_advantages([1, 0, 0, 1]), [1, -1, -1, 1], atol=1e-5)
    np.testing.assert_allclose(ppo.grpo_advantages([1, 0, 0, 1], std="sample"),
                               [0.866, -0.866, -0.866, 0.866], atol=1e-3)
    assert ppo.grpo_advantages([1, 1, 1]).tolist() == [0.0, 0.0, 0.0]
    assert ppo.grpo_advantages([0.0, 0.0]).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="population"):
        ppo.grpo_advantages([1, 0], std="biased")


def test_kl_k3_is_zero_where_the_policies_agree_and_positive_elsewhere():
    lp = np.log([0.2, 0.5, 0.9])
    assert np.allclose(ppo.kl_k3(lp, lp), 0.0)
    ref = np.log([0.4, 0.5, 0.3])
    k = ppo.kl_k3(lp, ref)
    assert (k[[0, 2]] > 0).all() and k[1] == pytest.approx(0.0)
    # unbiased: the mean over tokens sampled from p is KL(p || q)
    rng = np.random.default_rng(0)
    p, q = np.array([0.7, 0.2, 0.1]), np.array([0.3, 0.3, 0.4])
    x = rng.choice(3, size=200_000, p=p)
    est = ppo.kl_k3(np.log(p[x]), np.log(q[x])).mean()
    assert est == pytest.approx(float(np.sum(p * np.log(p / q))), rel=0.02)
    t = ppo.kl_k3(torch.tensor(lp), torch.tensor(ref))
    assert torch.is_tensor(t) and np.allclose(t.numpy(), k)


def test_import_is_light():
    """digirl_lite.ppo imports neither torch nor transformers."""
    code = ("import sys, digirl_lite.ppo; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def _small_policy(seed=0):
    from digirl_lite.policy import AutoUIPolicy

    return AutoUIPolicy.sim_preset(seed=seed, d_model=32, d_kv=8, d_ff=64, num_heads=4,
                                   img_dim=16)


def _batch_from_samples(policy, n=6, adv_sign=(1, -1), seed=0):
    from digirl_lite.policy.updates import PPOBatch

    prompts = ["Previous Actions: Goal: Go to ebay.com</s>",
               "Previous Actions: Goal: Open the clock</s>"] * (n // 2)
    feats = torch.randn(n, 16, generator=torch.Generator().manual_seed(seed))
    drawn = policy.sample(prompts, feats, generator_seed=seed, max_new_tokens=16)
    adv = [[float(adv_sign[i % 2])] * len(d.token_ids) for i, d in enumerate(drawn)]
    ret = [[0.7] * len(d.token_ids) for d in drawn]
    return PPOBatch(prompts, feats, [d.token_ids for d in drawn],
                    [d.log_probs for d in drawn], adv, ret)


@pytest.mark.slow
def test_ppo_update_starts_at_ratio_one_and_moves_likelihood_with_the_advantage():
    """ppo_update on the behaviour policy's own samples: the first ratio is 1 (no clip, no
    KL, the loss is -mean(A)); updates raise the likelihood of tokens with A > 0 and lower
    those with A < 0; the value head moves towards the returns."""
    from digirl_lite.policy.updates import ppo_update

    p = _small_policy(1)
    b = _batch_from_samples(p)
    params = list(p.model.parameters()) + list(p.value_head.parameters())
    opt = torch.optim.Adam(params, lr=3e-3)
    first = ppo_update(p, opt, b, clip_eps=0.2, value_coef=0.5)
    assert first["ratio_max"] == pytest.approx(1.0, abs=1e-3)
    assert first["clip_fraction"] == 0.0 and first["kl"] == pytest.approx(0.0, abs=1e-5)
    n_tok = sum(len(a) for a in b.advantages)
    assert first["policy_loss"] == pytest.approx(-sum(map(sum, b.advantages)) / n_tok, abs=1e-3)
    for _ in range(15):
        last = ppo_update(p, opt, b, clip_eps=0.2, value_coef=0.5)
    lp, v, m = p.token_ids_log_probs_and_values(list(b.prompts), b.feats, list(b.token_ids))
    lp = lp.detach()
    for i, old in enumerate(b.old_log_probs):
        change = float(lp[i, :len(old)].sum()) - sum(old)
        assert change > 0 if i % 2 == 0 else change < 0, (i, change)
    assert last["value_loss"] < first["value_loss"]
    assert last["clip_fraction"] > 0  # the ratios ran past the clip range by now


@pytest.mark.slow
def test_the_critic_warm_up_moves_only_the_value_head():
    """update_policy=False (DARWIN.md A.6's warm-up): the T5 body and the LM head stay as
    they were, the value head fits the returns."""
    from digirl_lite.policy.updates import ppo_update

    p = _small_policy(2)
    b = _batch_from_samples(p, seed=1)
    before = {k: v.clone() for k, v in p.model.state_dict().items()}
    head0 = p.value_head.linear.bias.item()
    opt = torch.optim.AdamW(list(p.model.parameters()) + list(p.value_head.parameters()),
                            lr=1e-2, weight_decay=0.1)
    losses = [ppo_update(p, opt, b, update_policy=False)["value_loss"] for _ in range(30)]
    for k, v in p.model.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} moved during the warm-up"
    assert p.value_head.linear.bias.item() != head0
    assert losses[-1] < 0.2 * losses[0]
    with pytest.raises(ValueError, match="row 0: .* tokens, .* recorded log-probs"):
        ppo_update(p, opt, b._replace(old_log_probs=[(-1.0,)] + list(b.old_log_probs[1:])))


@pytest.mark.slow  # three tiny Trainer runs
@pytest.mark.parametrize("algorithm, masked", [("ppo", False), ("grpo", False), ("ppo", True)])
def test_the_trainer_learns_on_policy_from_its_own_samples(tmp_path, algorithm, masked):
    """algorithm="ppo" / "grpo" through the Trainer (issue 17, item 3): PPO warms its value
    head up on the pile (actor frozen), then both update on each iteration's own
    trajectories against the recorded log-probabilities (ratio 1 at the first update of an
    iteration, so the clip statistics start from there); GRPO draws every task grpo_group
    times and leaves the value head alone; the weights move; the checkpoint keeps the head.
    ``masked``: sampled under the grammar and the copy mask (issue 47, item 5), the first
    iteration's recorded log-probabilities are the starting policy's scored under the same
    masks (KL 0 to the start before any update)."""
    from collections import Counter

    from digirl_lite.data import load_trajectories
    from digirl_lite.paths import data_dir
    from digirl_lite.policy import AutoUIPolicy
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    cfg = sim_quick(algorithm=algorithm, iterations=1, pile_size=8, n_envs=4, eval_tasks=2,
                    horizon=4, ppo_minibatch=8, ppo_epochs=1,
                    **({"constrained_decoding": True, "copy_typed_text": True,
                        "typed_span_extractor": "none", "typed_span_once": True}
                       if masked else {}))
    out = tmp_path / "run"
    summary = Trainer(cfg, out, cache_dir=None, progress=False).run()
    assert set(summary["stages"]) >= {"copier", "offline", "online"}
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    offline = next(r for r in lines if r.get("stage") == "offline")
    online = next(r for r in lines if r.get("stage") == "online")
    assert online["ppo_steps"] > 0 and online["ppo_tokens"] >= online["ppo_steps"]
    assert np.isfinite(online["actor_loss"]) and online["kl"] >= 0
    if masked:
        assert abs(online["kl_start"]) < 1e-4, online["kl_start"]
    final = AutoUIPolicy.load(out / "checkpoints" /
                              (out / "checkpoints" / "latest").read_text().strip() / "policy")
    start = AutoUIPolicy.load(data_dir() / "policies" / "sft-webshop")
    assert not torch.equal(final.model.lm_head.weight, start.model.lm_head.weight)
    assert not final.value_head_fresh
    trajs, _ = load_trajectories(out / "store", with_images=False)
    tasks = Counter(t.task for t in trajs if t.source.value == "online")
    if algorithm == "ppo":
        assert offline["warmup_value_loss_after"] < offline["warmup_value_loss_before"]
        assert final.value_head.linear.bias.item() != pytest.approx(0.1, abs=1e-6)
    else:
        assert "warmup_value_loss_before" not in offline
        assert final.value_head.linear.bias.item() == pytest.approx(0.1, abs=1e-6)
        assert all(n % cfg.grpo_group == 0 for n in tasks.values())


@pytest.mark.parametrize("field, value", [("temperature", 0.7), ("temperature", 0.0),
                                          ("actor_precision", "bf16"), ("actor_updates", 0)])
@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_on_policy_refuses_what_its_ratio_cannot_use(algorithm, field, value, monkeypatch):
    """The ratio scores recorded tokens with the model at temperature 1, in fp32:
    a config sampling from another distribution fails before any collection, naming the
    field (as does actor_updates=0, which would not freeze PPO)."""
    import digirl_lite.policy.updates as updates
    from digirl_lite.errors import ConfigError
    from digirl_lite.train.config import sim_quick

    # bf16 as on a CPU with bf16 hardware (elsewhere it is refused for every algorithm)
    monkeypatch.setattr(updates, "cpu_has_native_bf16", lambda: True)
    with pytest.raises(ConfigError, match=field):
        sim_quick(algorithm=algorithm, **{field: value})
    sim_quick(algorithm="digirl", **{field: value})  # DigiRL's likelihood has no ratio


def test_grpo_leaves_infrastructure_truncations_out_of_their_group(tmp_path):
    """A device's fault is not the agent's failure (DARWIN.md A.3): in a group of a success,
    a failure and an attempt a lost device cut short, the truncated one gets no rows and
    does not pull the group's statistics (advantages +1 and -1, as for a group of two)."""
    from digirl_lite.actions import parse_action
    from digirl_lite.data.records import Ending, Step, Trajectory
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    t = Trainer(sim_quick(algorithm="grpo"), tmp_path / "run", cache_dir=None, progress=False)
    text = '"action_type": "PRESS_HOME"'

    def traj(name, reward, ending, reason=None):
        steps = [Step("task A", "Goal: task A", text, parse_action(text), float(reward), True,
                      f"{name}-0", f"{name}-1")]
        return Trajectory(name, "task A", steps, float(reward), ending,
                          truncation_reason=reason)

    rows = t.learner.rows([traj("win", 1, Ending.SUCCESS), traj("loss", 0, Ending.BUDGET),
                       traj("cut", 0, Ending.INFRA, "device lost")])
    assert [r[0].screen_id for r in rows] == ["win-0", "loss-0"]
    assert [r[3][0] for r in rows] == pytest.approx([1.0, -1.0], abs=1e-4)  # std + eps


@pytest.mark.slow
def test_value_bias_sets_a_fresh_heads_bias_and_only_ppo_reads_it(tmp_path):
    """A.6's ablation by config: the fresh value head's output bias (0.1 by default; 0 with
    no warm-up is the setting A.6 says collapses)."""
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    for bias in (0.1, 0.0):
        t = Trainer(sim_quick(algorithm="ppo", value_bias=bias), tmp_path / f"b{bias}",
                    cache_dir=None, progress=False)
        t.build_starting_policy()  # the shipped policy has no value head: a fresh one
        assert float(t.policy.value_head.linear.bias) == pytest.approx(bias)
    with pytest.raises(ValueError, match="value_bias"):
        sim_quick(value_bias=0.0)  # DigiRL has no value head


def test_ppo_update_weighs_tokens_by_the_batch_weights():
    """PPOBatch.weights (policy_loss_norm="trajectory"): at the first update (ratio 1) the
    policy loss is minus the weighted mean advantage; equal weights are the token mean;
    a missing or non-positive weight is refused, naming the rows."""
    from digirl_lite.policy.updates import ppo_update

    p = _small_policy(3)
    b = _batch_from_samples(p, seed=2)
    lengths = [len(a) for a in b.advantages]
    weights = [1.0 / (i + 1) for i in range(len(lengths))]
    adv = [a[0] for a in b.advantages]
    expect = -sum(w * n * a for w, n, a in zip(weights, lengths, adv)) / sum(
        w * n for w, n in zip(weights, lengths))
    token_mean = -sum(n * a for n, a in zip(lengths, adv)) / sum(lengths)
    assert expect != pytest.approx(token_mean, abs=1e-3)  # the weights matter here
    opt = torch.optim.SGD(list(p.model.parameters()) + list(p.value_head.parameters()), lr=0.0)
    got = ppo_update(p, opt, b._replace(weights=weights))["policy_loss"]
    assert got == pytest.approx(expect, abs=1e-4)
    same = ppo_update(p, opt, b._replace(weights=[0.3] * len(lengths)))["policy_loss"]
    assert same == pytest.approx(token_mean, abs=1e-4)
    for bad in ([1.0], [0.0] * len(lengths)):
        with pytest.raises(ValueError, match="one positive weight per row"):
            ppo_update(p, opt, b._replace(weights=bad))


@pytest.mark.slow
def test_trajectory_loss_norm_weighs_every_trajectory_alike(tmp_path):
    """policy_loss_norm="trajectory": a token's weight is 1 / its trajectory's tokens, so a
    GRPO group of a one-step success and a three-step failure pulls with net advantage 0
    (the token mean is negative: the failure has more tokens); "token" gives no weights;
    DigiRL refuses the field (it has no such loss) and a bad value names the field."""
    from digirl_lite.actions import parse_action
    from digirl_lite.data.records import Ending, Step, Trajectory
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    text = '"action_type": "PRESS_HOME"'

    def traj(name, reward, n_steps):
        steps = [Step("task A", "Goal: task A", text, parse_action(text),
                      float(reward and j == n_steps - 1), j == n_steps - 1, f"{name}-{j}",
                      f"{name}-{j + 1}") for j in range(n_steps)]
        return Trajectory(name, "task A", steps, float(reward),
                          Ending.SUCCESS if reward else Ending.BUDGET)

    trajs = [traj("win", 1, 1), traj("loss", 0, 3)]
    t = Trainer(sim_quick(algorithm="grpo", policy_loss_norm="trajectory"), tmp_path / "a",
                cache_dir=None, progress=False)
    rows = t.learner.rows(trajs)
    w = t.learner.policy_loss_weights(rows)
    adv = np.concatenate([r.advantages for r in rows])
    tok_w = np.repeat(w, [len(r.token_ids) for r in rows])
    assert adv.mean() < -0.2  # token mean: the longer failure wins
    assert float((adv * tok_w).sum() / tok_w.sum()) == pytest.approx(0.0, abs=1e-6)
    per_traj = {r.traj_id: 0.0 for r in rows}
    for r, x in zip(rows, w):
        per_traj[r.traj_id] += x * len(r.token_ids)
    assert per_traj == pytest.approx({"win": 1.0, "loss": 1.0})
    assert Trainer(sim_quick(algorithm="grpo", policy_loss_norm="token"), tmp_path / "b",
                   cache_dir=None, progress=False).learner.policy_loss_weights(rows) is None
    # the defaults (issue 28): GRPO weighs trajectories alike, PPO tokens
    assert sim_quick(algorithm="grpo").resolved("policy_loss_norm") == "trajectory"
    assert sim_quick(algorithm="ppo").resolved("policy_loss_norm") == "token"
    assert sim_quick().resolved("policy_loss_norm") is None
    with pytest.raises(ValueError, match="policy_loss_norm='trajectory' has no effect"):
        sim_quick(policy_loss_norm="trajectory")
    with pytest.raises(ValueError, match="policy_loss_norm"):
        sim_quick(algorithm="ppo", policy_loss_norm="sequence")


# -- issue 28: the readings and the settings that tell a collapse's causes apart ---------------

def test_draw_groups_split_a_task_drawn_twice():
    """GRPO by draw: the 8 attempts of an iteration that drew task A twice (4 each) are two
    groups of 4, so two draws that both succeed and both fail carry their own signal; by
    task they were one group of 8."""
    from digirl_lite.actions import parse_action
    from digirl_lite.data.records import Ending, Step, Trajectory
    from digirl_lite.policy.on_policy import draw_groups

    text = '"action_type": "PRESS_HOME"'

    def traj(k, task):
        step = Step(task, f"Goal: {task}", text, parse_action(text), 0.0, True, f"s{k}", f"t{k}")
        return Trajectory(f"online-s0-it0001-{k:05d}", task, [step], 0.0, Ending.BUDGET)

    trajs = [traj(k, "task A" if k < 8 else "task B") for k in range(12)]
    g = draw_groups(trajs, 4)
    assert len(set(g.values())) == 3
    assert g[trajs[0].traj_id] == g[trajs[3].traj_id] != g[trajs[4].traj_id]
    assert g[trajs[8].traj_id] == ("task B", 2)
    odd = Trajectory("pile-x", "task A", trajs[0].steps, 0.0, Ending.BUDGET)
    assert draw_groups([odd], 4)["pile-x"] == ("task A", -1)  # no draw number: by task


@pytest.mark.slow
def test_grpo_rows_by_draw_and_by_task(tmp_path):
    """Two draws of one task, one all successes and one all failures: by draw neither group
    has signal (every advantage 0); by task (the old grouping) the successes get +1 and the
    failures -1."""
    from digirl_lite.actions import parse_action
    from digirl_lite.data.records import Ending, Step, Trajectory
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    text = '"action_type": "PRESS_HOME"'

    def traj(k, reward):
        step = Step("task A", "Goal: task A", text, parse_action(text), float(reward), True,
                    f"s{k}", f"t{k}")
        return Trajectory(f"online-s0-it0001-{k:05d}", "task A", [step], float(reward),
                          Ending.SUCCESS if reward else Ending.BUDGET)

    trajs = [traj(k, 1 if k < 4 else 0) for k in range(8)]
    by_draw = Trainer(sim_quick(algorithm="grpo"), tmp_path / "a", cache_dir=None,
                      progress=False).learner.rows(trajs)
    assert all(r[3][0] == 0.0 for r in by_draw)
    by_task = Trainer(sim_quick(algorithm="grpo", grpo_groups="task"), tmp_path / "b",
                      cache_dir=None, progress=False).learner.rows(trajs)
    assert [round(r[3][0]) for r in by_task] == [1] * 4 + [-1] * 4


def test_negative_scale_zero_leaves_a_batch_of_failures_alone():
    """negative_scale=0 (A > 0 only): a batch whose every advantage is negative gives the
    policy no gradient (its weights do not move); at 1 they do."""
    from digirl_lite.policy.updates import ppo_update

    for scale, moves in ((0.0, False), (1.0, True)):
        p = _small_policy(3)
        b = _batch_from_samples(p, adv_sign=(-1, -1), seed=2)
        before = p.model.lm_head.weight.detach().clone()
        opt = torch.optim.SGD(list(p.model.parameters()), lr=1.0)
        out = ppo_update(p, opt, b, value_coef=0.0, grad_clip=None, negative_scale=scale)
        assert (out["grad_norm_policy"] > 0) == moves
        assert (not torch.equal(p.model.lm_head.weight, before)) == moves
    with pytest.raises(ValueError, match="negative_scale"):
        ppo_update(p, opt, b, negative_scale=1.5)


def test_value_grad_clip_caps_the_value_head_apart():
    """One global cap scales the policy's gradient by the value head's norm too; with
    value_grad_clip each is capped alone (the gradients left on the parameters after the
    update show the caps), and the norms reported are those before any cap."""
    from digirl_lite.policy.updates import ppo_update

    p = _small_policy(4)
    b = _batch_from_samples(p, seed=3)
    params = list(p.model.parameters()) + list(p.value_head.parameters())
    opt = torch.optim.SGD(params, lr=0.0)

    def norm(ps):
        return float(torch.linalg.vector_norm(torch.stack([q.grad.norm() for q in ps
                                                           if q.grad is not None])))

    out = ppo_update(p, opt, b, value_coef=1.0, grad_clip=1e-3, value_grad_clip=0.5)
    assert out["grad_norm_policy"] > 1e-3 and out["grad_norm_value"] > 1e-3
    assert norm(p.model.parameters()) == pytest.approx(1e-3, rel=1e-3)
    assert norm(p.value_head.parameters()) == pytest.approx(
        min(0.5, out["grad_norm_value"]), rel=1e-3)
    ppo_update(p, opt, b, value_coef=1.0, grad_clip=1e-3)  # one cap over both
    assert norm(params) == pytest.approx(1e-3, rel=1e-3)


def test_kl_to_a_reference_is_zero_on_itself_and_positive_elsewhere():
    """batch.ref_log_probs: the KL penalty's reference. Equal to the recorded ones, kl_ref
    is kl (0 at the first update); shifted, it is positive."""
    from digirl_lite.policy.updates import ppo_update

    p = _small_policy(5)
    b = _batch_from_samples(p, seed=4)
    opt = torch.optim.SGD(list(p.model.parameters()) + list(p.value_head.parameters()), lr=0.0)
    same = ppo_update(p, opt, b._replace(ref_log_probs=b.old_log_probs), kl_coef=0.1)
    assert same["kl_ref"] == pytest.approx(same["kl"], abs=1e-6)
    assert same["kl_ref"] == pytest.approx(0.0, abs=1e-5)
    shifted = [[x - 0.5 for x in r] for r in b.old_log_probs]
    assert ppo_update(p, opt, b._replace(ref_log_probs=shifted), kl_coef=0.1)["kl_ref"] \
        == pytest.approx(np.exp(-0.5) - 1 + 0.5, rel=1e-3)
    assert np.isnan(ppo_update(p, opt, b)["kl_ref"])


def test_token_entropies_are_those_of_the_next_token_distribution():
    """token_entropies: per action token, the entropy of the policy's softmax where it wrote
    the token; between 0 and log(V), and the same as computed from the logits by hand."""
    p = _small_policy(6)
    b = _batch_from_samples(p, seed=5)
    ent = p.token_entropies(list(b.prompts), b.feats, list(b.token_ids))
    assert [len(e) for e in ent] == [len(t) for t in b.token_ids]
    flat = np.concatenate(ent)
    assert (flat >= 0).all() and (flat <= np.log(p.model.config.vocab_size) + 1e-4).all()
    # by hand for row 0
    enc = p._encode_prompts(list(b.prompts[:1]))
    labels, mask = p._labels(None, list(b.token_ids[:1]))
    with torch.no_grad():
        _, hidden = p.model.action_token_outputs(enc["input_ids"], enc["attention_mask"],
                                                 b.feats[:1], labels, mask)
        probs = torch.softmax(p.model.head_logits(hidden)[0], -1)
    want = -(probs * probs.log()).sum(-1).numpy()
    assert ent[0] == pytest.approx(want[:len(ent[0])], abs=1e-4)


@pytest.mark.parametrize("field, value", [("negative_advantage_scale", -0.1),
                                          ("negative_advantage_scale", 1.5),
                                          ("value_grad_clip", 0.0), ("advantage_norm", "z"),
                                          ("kl_reference", "best"), ("grpo_groups", "x")])
def test_on_policy_settings_are_checked(field, value):
    from digirl_lite.train.config import sim_quick

    algorithm = "grpo" if field == "grpo_groups" else "ppo"
    with pytest.raises(ValueError, match=field):
        sim_quick(algorithm=algorithm, **{field: value})


@pytest.mark.parametrize("field, value", [("negative_advantage_scale", 0.0),
                                          ("value_grad_clip", 0.01), ("advantage_norm", "batch"),
                                          ("grpo_groups", "task")])
def test_on_policy_settings_are_refused_where_unread(field, value):
    """A field the algorithm does not read is refused away from its default (DigiRL reads
    none of these; GRPO has no value head; PPO has no groups)."""
    from digirl_lite.train.config import sim_quick

    with pytest.raises(ValueError, match="has no effect"):
        sim_quick(algorithm="digirl", **{field: value})
    other = "ppo" if field == "grpo_groups" else ("grpo" if field in (
        "value_grad_clip", "advantage_norm") else None)
    if other:
        with pytest.raises(ValueError, match="has no effect"):
            sim_quick(algorithm=other, **{field: value})


def test_on_policy_readings_reads_a_ppo_run(tmp_path):
    """benchmarks/on_policy_readings.py on the PPO fixture run: one row per online iteration,
    the evaluations' rates, and a table with them; a folder without metrics.jsonl is an
    error naming it."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "on_policy_readings", root / "benchmarks" / "on_policy_readings.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    run = root / "data" / "fixtures" / "runs" / "ppo-seed0"
    r = mod.readings(run)
    online = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()
              if json.loads(x).get("stage") == "online"]
    assert [it["iteration"] for it in r["iterations"]] == [x["iteration"] for x in online]
    assert r["iterations"][0]["collect_success"] == online[0]["collect_success"]
    assert {e["stage"] for e in r["evaluations"]} >= {"copier", "online"}
    assert "| 1 |" in mod.table(r)
    out = tmp_path / "r.json"
    assert mod.main([str(run), "--json", str(out)]) == 0
    assert json.loads(out.read_text())[0]["run"] == str(run)
    assert mod.main([str(tmp_path)]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_offline_imitation_trains_the_actor_on_the_piles_successes_first(tmp_path, algorithm):
    """``offline_imitation`` (issue 28): the offline phase runs Filtered BC's on the pile
    (its successes' valid steps, ``offline_actor_updates`` updates at the imitation rate,
    an optimiser of its own) before PPO's value warm-up; the run's actor optimiser is left
    as it was. Off, the offline phase leaves the actor's weights as shipped. DigiRL, which
    has its own offline phase, refuses the field."""
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    weights = {}
    for imitation in (False, True):
        warm = {"critic_warmup_updates": 2} if algorithm == "ppo" else {}
        cfg = sim_quick(algorithm=algorithm, pile_size=8, n_envs=4, offline_actor_updates=3,
                        actor_batch=8, offline_imitation=imitation, **warm)
        t = Trainer(cfg, tmp_path / str(imitation), cache_dir=None, progress=False)
        t.build_starting_policy()
        pile = t.build_pile()
        opt = t.actor_opt
        before = t.policy.model.lm_head.weight.detach().clone()
        info = t.learner.offline(pile)
        after = t.policy.model.lm_head.weight.detach()
        assert t.actor_opt is opt and opt.param_groups[0]["lr"] == cfg.resolved("actor_lr")
        if imitation:
            wins = [x for x in pile if x.is_usable and x.final_reward > 0]
            assert info["imitation_kept_trajectories"] == len(wins) > 0
            assert info["imitation_kept_steps"] > 0
            assert np.isfinite(info["imitation_actor_loss"])
            assert not torch.equal(before, after)
            assert t.learner.offline_work.startswith("the actor on the pile's successes")
        else:
            assert not any(k.startswith("imitation_") for k in info)
            assert torch.equal(before, after)
        if algorithm == "ppo":
            assert info["warmup_value_loss_after"] < info["warmup_value_loss_before"]
        weights[imitation] = after.clone()
    assert not torch.equal(weights[False], weights[True])
    with pytest.raises(ValueError, match="offline_imitation=True has no effect"):
        sim_quick(offline_imitation=True)
