"""Issue 18: any Hugging Face vision-language model as the agent, with LoRA. A tiny random
Qwen2-VL written offline by recipes/make_tiny_vlm.py (built once per session) stands for a
real checkpoint: loaded through transformers' Auto classes, it acts on the simulator's
screenshots, scores actions, trains only its adapters, and saves and loads exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from digirl_lite.actions import ActionType, parse_action
from digirl_lite.errors import ConfigError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory):
    from digirl_lite.envs.sim.demos import sim_corpus
    from digirl_lite.policy.tiny_vlm import make_tiny_vlm

    return make_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny",
                         corpus=sim_corpus(seed=0, n_demos=20))


@pytest.fixture(scope="module")
def observations():
    """Two steps' observations of the simulated phone (screenshots and prompts)."""
    from digirl_lite.envs.sim.env import SimPhoneEnv

    env = SimPhoneEnv("webshop", seed=3)
    obs = [env.reset(seed=3)[0], env.reset(seed=4)[0]]
    return [o.prompt for o in obs], [o.screenshot for o in obs]


def _policy(tiny_vlm, **kw):
    from digirl_lite.policy.vlm import VLMPolicy

    return VLMPolicy.from_pretrained(tiny_vlm, **kw)


def test_the_tiny_vlm_is_a_qwen2_vl_that_the_auto_classes_load(tiny_vlm):
    from transformers import AutoConfig, AutoModelForImageTextToText

    assert AutoConfig.from_pretrained(tiny_vlm).model_type == "qwen2_vl"
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm)
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    assert sum(p.numel() for p in model.parameters()) < 2_000_000


def test_acting_on_the_simulator_gives_strings_that_parse(tiny_vlm, observations):
    prompts, shots = observations
    p = _policy(tiny_vlm)
    free = p.sample(prompts, shots, max_new_tokens=24, generator_seed=0)
    assert len(free) == 2 and all(isinstance(parse_action(s.text).action_type, ActionType)
                                  for s in free)  # random weights: mostly INVALID, no error
    drawn = p.sample(prompts, shots, max_new_tokens=32, constrained=True, generator_seed=0)
    kinds = [parse_action(s.text).action_type for s in drawn]
    assert ActionType.INVALID not in kinds
    assert all(s.token_ids[-1] == p.eos_token_id and len(s.log_probs) == len(s.token_ids)
               for s in drawn)


def test_recorded_log_probs_are_the_scored_ones_and_only_lora_has_gradients(
        tiny_vlm, observations):
    prompts, shots = observations
    p = _policy(tiny_vlm)
    # a checkpoint's own generation settings must not reshape what is sampled
    p.model.generation_config.repetition_penalty = 1.3
    p.model.generation_config.suppress_tokens = [5, 6, 7]
    drawn = p.sample(prompts, shots, max_new_tokens=16, generator_seed=1)
    lp, values, mask = p.token_ids_log_probs_and_values(prompts, shots,
                                                        [s.token_ids for s in drawn])
    for i, s in enumerate(drawn):  # the exact ratio PPO needs: 1 before any update
        assert torch.allclose(lp[i, :len(s.token_ids)], torch.tensor(s.log_probs), atol=1e-4)
    assert torch.allclose(values[mask.bool()], torch.full_like(values[mask.bool()], 0.1),
                          atol=0.5)
    total = p.log_prob(prompts, shots, ["Action Decision: \"action_type\": \"PRESS_BACK\"", "x"])
    assert torch.isfinite(total).all() and (total < 0).all()
    total.sum().backward()
    named = dict(p.model.named_parameters())
    with_grad = {n for n, w in named.items() if w.grad is not None}
    assert with_grad and all("lora_" in n for n in with_grad)
    assert {n for n, w in named.items() if w.requires_grad} == with_grad
    assert sum(w.numel() for w in p.parameters()) < 0.1 * p.num_parameters()


def test_digirl_updates_change_the_adapters_and_nothing_else(tiny_vlm, observations):
    from digirl_lite.policy.updates import text_mle_update

    prompts, shots = observations
    p = _policy(tiny_vlm)
    before = {n: w.detach().clone() for n, w in p.model.named_parameters()}
    opt = torch.optim.AdamW(p.parameters(), lr=1e-2)
    target = ['Action Decision: "action_type": "PRESS_HOME", "touch_point": "[-1.0, -1.0]", '
              '"lift_point": "[-1.0, -1.0]", "typed_text": ""'] * 2
    first = text_mle_update(p, opt, prompts, shots, target, 1.0)
    for _ in range(4):
        last = text_mle_update(p, opt, prompts, shots, target, 1.0)
    assert last < first  # the loss of the imitated action goes down
    changed = {n for n, w in p.model.named_parameters() if not torch.equal(w, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert any("lora_B" in n for n in changed)


def test_save_and_load_round_trip_exactly_and_merge_on_request(tiny_vlm, observations,
                                                                tmp_path):
    from transformers import AutoModelForImageTextToText

    from digirl_lite.policy.factory import load_policy
    from digirl_lite.policy.updates import text_mle_update
    from digirl_lite.policy.vlm import VLMPolicy

    prompts, shots = observations
    p = _policy(tiny_vlm, lora={"r": 4, "alpha": 8})
    opt = torch.optim.AdamW(p.parameters(), lr=1e-2)
    text_mle_update(p, opt, prompts, shots, ["a", "b"], 1.0)  # adapters away from 0
    with torch.no_grad():
        p.value_head.linear.bias.fill_(0.3)
    d = p.save(tmp_path / "saved")
    meta = json.loads((d / "digirl_policy.json").read_text())
    assert meta["kind"] == "vlm" and meta["lora"]["r"] == 4
    assert not list(d.glob("**/model.safetensors"))  # the adapters alone, not the base
    assert meta["dtype"] == "fp32" and meta["base"] == str(tiny_vlm.resolve())
    q = load_policy(d)
    assert isinstance(q, VLMPolicy) and not q.value_head_fresh
    assert not q.model.is_gradient_checkpointing
    assert load_policy(d, gradient_checkpointing=True).model.is_gradient_checkpointing
    for (n, a), (m, b) in zip(p.model.state_dict().items(), q.model.state_dict().items()):
        assert n == m and torch.equal(a, b)
    assert torch.equal(p.value_head.linear.bias, q.value_head.linear.bias)
    acts = ["PRESS_BACK", "hello"]
    with torch.no_grad():
        assert torch.equal(p.log_prob(prompts, shots, acts), q.log_prob(prompts, shots, acts))
        merged = p.merge_and_save(tmp_path / "merged")
        plain = AutoModelForImageTextToText.from_pretrained(merged)
        r = VLMPolicy(plain, p.inputs, base=merged, lora=None, image_size=p.image_size)
        assert torch.allclose(r.log_prob(prompts, shots, acts), p.log_prob(prompts, shots, acts),
                              atol=1e-4)


def test_grammar_constrained_decoding_of_a_decoder_only_model_counts_from_the_prompt():
    from digirl_lite.policy.grammar import ActionLogitsProcessor

    class _Vocab:
        def __init__(self):
            self.fed = []

        def feed_ids(self, ids):
            self.fed.append(list(ids))
            return 0

        def allowed(self, state, budget):
            self.budget = budget
            return torch.ones(4, dtype=torch.bool)

    v = _Vocab()
    proc = ActionLogitsProcessor(v, max_new_tokens=10, prompt_length=5)
    proc(torch.arange(7).unsqueeze(0), torch.zeros(1, 4))  # a prompt of 5, 2 written
    assert v.fed == [[5, 6]] and v.budget == 10 - 3


def test_configs_that_cannot_work_name_the_field(tiny_vlm, tmp_path):
    from transformers import T5Config

    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    with pytest.raises(ConfigError, match="policy_path"):
        sim_quick(policy="vlm").check_paths()
    with pytest.raises(ConfigError, match="policy_path is the base model"):
        sim_quick(policy_path=str(tiny_vlm))
    with pytest.raises(ConfigError, match="vlm_dtype 'bf16' is for a GPU"):
        sim_quick(policy="vlm", policy_path=str(tiny_vlm), vlm_dtype="bf16")
    with pytest.raises(ConfigError, match="vlm_dtype='bf16': algorithm='ppo'"):
        sim_quick(policy="vlm", policy_path=str(tiny_vlm), vlm_dtype="bf16", device="cuda",
                  algorithm="ppo")
    with pytest.raises(ConfigError, match="lora.dropout=0.1: algorithm='grpo'"):
        sim_quick(policy="vlm", policy_path=str(tiny_vlm), algorithm="grpo",
                  lora={"r": 8, "alpha": 16, "dropout": 0.1, "target_modules": ["q_proj"]})
    with pytest.raises(ConfigError, match="lora must hold"):
        sim_quick(policy="vlm", policy_path=str(tiny_vlm), lora={"rank": 8})
    t5 = tmp_path / "t5"
    T5Config(d_model=8, num_layers=1, vocab_size=10).save_pretrained(t5)
    with pytest.raises(ConfigError, match=r"holds a 't5' model .* policy 'autoui'"):
        Trainer(sim_quick(policy="vlm", policy_path=str(t5)), tmp_path / "a", cache_dir=None,
                progress=False)
    from digirl_lite.paths import data_dir

    shipped = data_dir() / "policies" / "sft-webshop"
    with pytest.raises(ConfigError, match="holds an autoui policy"):
        Trainer(sim_quick(policy="vlm", policy_path=str(tiny_vlm),
                          starting_policy=str(shipped)), tmp_path / "b", cache_dir=None,
                progress=False)
    saved = _policy(tiny_vlm).save(tmp_path / "saved")
    with pytest.raises(ConfigError, match="holds a saved VLM policy: set policy 'vlm'"):
        Trainer(sim_quick(starting_policy=str(saved)), tmp_path / "c", cache_dir=None,
                progress=False)


def test_the_main_job_runs_with_a_vlm_policy(tiny_vlm, tmp_path):
    """The Trainer, unchanged, with policy 'vlm': collection, critics, filters, the LoRA
    actor update, evaluation, a checkpoint that resumes into the same adapters."""
    from digirl_lite.policy.factory import load_policy
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    cfg = sim_quick(policy="vlm", policy_path=str(tiny_vlm), pile_size=4, eval_tasks=2,
                    iterations=1, rollouts_per_iteration=2, n_envs=2,
                    offline_critic_updates=1, critic_updates=1, offline_actor_updates=2,
                    actor_updates=2, actor_batch=4, max_new_tokens=24, horizon=3,
                    constrained_decoding=True, eval_every=0)
    t = Trainer(cfg, tmp_path / "run", cache_dir=None, progress=False)
    summary = t.run()
    assert set(summary["stages"]) >= {"copier", "offline", "online"}
    assert summary["stages"]["online"]["invalid_step_rate"] == 0.0  # constrained decoding
    # a random model never succeeds, so the filters kept nothing to imitate: the Trainer's
    # actor update on the expert's steps instead
    from digirl_lite.envs.sim.demos import generate_demos

    demos, screens, _ = generate_demos("webshop", n=2, seed=0)
    t.screens.merge(screens)
    start = {n: w.detach().clone() for n, w in t.policy.model.named_parameters()}
    loss = t.learner.train_actor([s for d in demos for s in d.steps], 2)
    assert np.isfinite(loss)
    changed = {n for n, w in t.policy.model.named_parameters() if not torch.equal(w, start[n])}
    assert changed and all("lora_" in n for n in changed)
    t.save_checkpoint()
    saved = load_policy(tmp_path / "run" / "checkpoints" /
                        (tmp_path / "run" / "checkpoints" / "latest").read_text() / "policy")
    for (n, a), (_, b) in zip(t.policy.model.state_dict().items(),
                              saved.model.state_dict().items()):
        assert torch.equal(a, b), n
    again = Trainer(cfg, tmp_path / "run", cache_dir=None, progress=False)
    assert again.load_checkpoint()
    assert all(torch.equal(a, b) for a, b in zip(again.policy.parameters(),
                                                  t.policy.parameters()))
    np.testing.assert_equal(again.iteration, 1)


def test_ppo_trains_the_adapters_and_the_value_head_of_a_vlm(tiny_vlm, tmp_path):
    """Darwin's learner on a VLM: values per action token from its last hidden state, the
    ratio against the recorded log-probabilities, LoRA and value head updated."""
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    cfg = sim_quick(policy="vlm", policy_path=str(tiny_vlm), algorithm="ppo", pile_size=2,
                    eval_tasks=2, iterations=1, rollouts_per_iteration=2, n_envs=2,
                    critic_warmup_updates=1, ppo_minibatch=8, max_new_tokens=16, horizon=2,
                    eval_every=0)
    t = Trainer(cfg, tmp_path / "run", cache_dir=None, progress=False)
    start = {n: w.detach().clone() for n, w in t.policy.model.named_parameters()}
    bias = t.policy.value_head.linear.bias.detach().clone()
    summary = t.run()
    assert "online" in summary["stages"]
    changed = {n for n, w in t.policy.model.named_parameters() if not torch.equal(w, start[n])}
    assert changed and all("lora_" in n for n in changed)
    assert not torch.equal(t.policy.value_head.linear.bias, bias)
    ppo = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert any("clip_fraction" in json.dumps(r) for r in ppo)


def test_the_gpu_recipe_fails_early_then_loads_with_a_checkpoint(tiny_vlm):
    from pathlib import Path

    from digirl_lite.train.config import load_config

    path = Path(__file__).resolve().parents[2] / "recipes" / "configs" / "qwen_vl_lora.json"
    with pytest.raises(ConfigError, match="policy_path"):
        load_config(path)
    cfg = load_config(path, policy_path=str(tiny_vlm))
    assert cfg.policy == "vlm" and cfg.lora["r"] == 8 and cfg.vlm_dtype == "bf16"


def test_the_paper_figures_count_qwen2_vl_2b_exactly():
    """benchmarks/bench_vlm_size.py on the meta device: the released Qwen2-VL-2B has 2.21 B
    parameters; LoRA rank 8 on q/k/v/o of its 28 layers is 28 x 8 x (2 x (1536 + 1536) +
    2 x (1536 + 256))."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_vlm_size.py"
    spec = importlib.util.spec_from_file_location("bench_vlm_size", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    r = bench.on_paper("2b", 16, (270, 570), 140, 64, bench.LORA)
    assert round(r["parameters"] / 1e9, 2) == 2.21
    assert r["lora_parameters"] == 28 * 8 * (2 * (1536 + 1536) + 2 * (1536 + 256))
    assert r["image_tokens"] == bench.image_tokens(270, 570) == 200
    g = r["gib"]
    assert g["total_checkpointed"] < g["total"] and g["weights_bf16"] > 4
