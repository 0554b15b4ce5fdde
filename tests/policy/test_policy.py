"""The AutoUI policy: fusion, sampling, exact log-likelihoods, persistence, learning."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import T5Config

from digirl_lite.actions import Action, ActionType, format_action, parse_action
from digirl_lite.envs.sim.demos import sim_corpus
from digirl_lite.paths import data_dir
from digirl_lite.policy import AutoUIModel, AutoUIPolicy
from digirl_lite.policy.policy import REFERENCE_CLAMP
from digirl_lite.policy.tokenizer import SPTokenizer, train_sim_tokenizer

TOK = data_dir() / "tokenizer" / "spiece.model"
PROMPT = "Previous Actions: Goal: Go to ebay.com</s>"
HOME = format_action(Action.key(ActionType.PRESS_HOME))
TAP = format_action(Action.tap(x=0.5, y=0.62))


def small(seed=0, **kw):
    return AutoUIPolicy.sim_preset(seed=seed, **{"d_model": 32, "d_kv": 8, "d_ff": 64,
                                                 "num_heads": 4, "img_dim": 16, **kw})


def test_import_does_not_load_torch():
    code = "import sys, digirl_lite.policy; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_shipped_tokenizer_is_compact_and_exact():
    tok = SPTokenizer(TOK)
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 1)
    for a in (Action.tap(x=0.5, y=0.62), Action.swipe(x0=0.5, y0=0.8, x1=0.5, y1=0.3),
              Action.type_text("bose soundsport free"), Action.key(ActionType.PRESS_HOME),
              Action.type_text("café “quoted” 東京")):
        text = format_action(a)
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert len(ids) <= 40
    assert len(tok.encode(HOME)) <= 10
    assert len(tok.encode(TAP)) == 15  # each 4-decimal coordinate is one piece
    ids = tok.encode(PROMPT)
    assert ids[-1] == 1 and ids.count(1) == 1  # the literal </s> is the one eos
    assert len(tok.encode("x " * 600, max_length=512)) == 512


@pytest.mark.slow
def test_tokenizer_training_is_deterministic():
    lines = sim_corpus(n_demos=20)
    a = train_sim_tokenizer(lines, vocab_size=11_000)
    b = train_sim_tokenizer(lines, vocab_size=11_000)
    assert a.serialized() == b.serialized()


def test_preset_sizes():
    p = AutoUIPolicy.sim_preset(seed=0)
    assert p.img_dim == 512
    assert 1e6 < p.num_parameters() < 3e6  # 1.2M of model + 1.4M of embeddings
    m = p.model
    assert m.image_dense.in_features == 512 and m.image_dense.out_features == 128
    assert m.gate_dense.in_features == 256 and m.mha_layer.num_heads == 1


def test_image_changes_the_logits_and_two_frames_use_the_last():
    p = small()
    enc = p.tokenizer([PROMPT])
    labels = p.tokenizer([HOME])["input_ids"]
    a, b = torch.randn(1, 16), torch.randn(1, 16)
    with torch.no_grad():
        la = p.model(**enc, image_ids=a, labels=labels).logits
        lb = p.model(**enc, image_ids=b, labels=labels).logits
        l2 = p.model(**enc, image_ids=torch.cat([b, a], dim=1), labels=labels).logits
    assert not torch.allclose(la, lb)
    assert torch.allclose(la, l2)  # (B, 2d): the last frame is the one used
    with pytest.raises(ValueError, match="floats per row"):
        p.model(**enc, image_ids=torch.randn(1, 17), labels=labels)


def test_gradients_reach_the_fusion_and_not_the_features():
    p = small()
    feats = torch.randn(2, 32)  # frozen encoder output: a constant for the policy
    lp = p.log_prob([PROMPT, PROMPT], feats, [HOME, TAP])
    lp.sum().backward()
    for mod in (p.model.image_dense, p.model.gate_dense, p.model.mha_layer):
        assert all(q.grad is not None and q.grad.abs().sum() > 0 for q in mod.parameters())
    assert feats.grad is None and not feats.requires_grad


def _slow_log_prob(p, prompt, feats, action):
    """Token by token: the decoder sees the gold prefix, score the next gold token."""
    enc = p.tokenizer([prompt])
    ids = p.tokenizer([action], max_length=None)["input_ids"][0].tolist()
    total = 0.0
    with torch.no_grad():
        for t in range(len(ids)):
            dec = torch.tensor([[0] + ids[:t]])
            logits = p.model(**enc, image_ids=feats, decoder_input_ids=dec).logits[0, -1]
            total += torch.log_softmax(logits.double(), -1)[ids[t]].item()
    return total


def test_log_prob_equals_a_slow_per_token_reference_and_masks_pads():
    p = small(seed=3)
    feats = torch.randn(3, 16)
    actions = [HOME, TAP, format_action(Action.type_text("apple airpods"))]
    prompts = [PROMPT, "Previous Actions: Goal: Open the clock</s>", PROMPT]
    with torch.no_grad():
        batch = p.log_prob(prompts, feats, actions)
    for i in range(3):
        ref = _slow_log_prob(p, prompts[i], feats[i:i + 1], actions[i])
        assert batch[i].item() == pytest.approx(ref, abs=1e-3)
        alone = p.log_prob(prompts[i:i + 1], feats[i:i + 1], actions[i:i + 1])
        assert alone.item() == pytest.approx(batch[i].item(), abs=1e-4)  # pads add nothing
    clamped = p.log_prob(prompts, feats, actions, clamp=REFERENCE_CLAMP)
    n_tokens = [len(p.tokenizer.encode(a)) for a in actions]
    for i in range(3):  # each token's probability is clamped at 0.001: log >= -6.91
        assert clamped[i].item() >= n_tokens[i] * torch.log(torch.tensor(0.001)).item() - 1e-3


def test_save_load_round_trip_is_bit_exact(tmp_path):
    p = small(seed=5)
    p.save(tmp_path / "pol")
    q = AutoUIPolicy.load(tmp_path / "pol")
    for (k, a), (k2, b) in zip(p.model.state_dict().items(), q.model.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    feats = torch.randn(2, 16)
    assert torch.equal(p.log_prob([PROMPT] * 2, feats, [HOME, TAP]),
                       q.log_prob([PROMPT] * 2, feats, [HOME, TAP]))
    assert p.act([PROMPT], feats[:1], generator_seed=1, max_new_tokens=20) == \
        q.act([PROMPT], feats[:1], generator_seed=1, max_new_tokens=20)
    with pytest.raises(FileNotFoundError, match="from_pretrained"):
        AutoUIPolicy.load(tmp_path)


def test_act_is_batched_and_seeded():
    p = small(seed=1)
    feats = torch.randn(4, 16)
    a = p.act([PROMPT] * 4, feats, max_new_tokens=12, generator_seed=7)
    b = p.act([PROMPT] * 4, feats, max_new_tokens=12, generator_seed=7)
    assert len(a) == 4 and a == b
    assert p.act([], torch.zeros(0, 16)) == []
    with pytest.raises(ValueError, match="image rows"):
        p.act([PROMPT] * 2, feats)


@pytest.mark.slow
def test_learning_fixed_triples_raises_likelihood_and_act_reproduces():
    torch.manual_seed(0)
    p = small(seed=2)
    feats = torch.randn(4, 16)
    prompts = [PROMPT, "Previous Actions: Goal: Open the clock</s>",
               'Previous Actions: Goal: Go to costco.com, search for "tv"</s>', PROMPT]
    actions = [TAP, HOME, format_action(Action.type_text("tv")),
               format_action(Action.tap(x=0.25, y=0.1))]  # same prompt, other image
    opt = torch.optim.AdamW(p.parameters(), lr=3e-3)
    before = p.log_prob(prompts, feats, actions).detach()
    for _ in range(300):
        loss = -p.log_prob(prompts, feats, actions).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(p.parameters(), 1.0)
        opt.step()
    after = p.log_prob(prompts, feats, actions).detach()
    assert (after > before + 10).all()
    greedy = p.act(prompts, feats, temperature=0.0, max_new_tokens=48)
    assert [parse_action(g) for g in greedy] == [parse_action(a) for a in actions]


def test_from_pretrained_reads_an_auto_ui_layout_and_lists_bad_keys(tmp_path):
    from safetensors.torch import save_file
    from transformers import T5Tokenizer

    cfg = T5Config(vocab_size=SPTokenizer(TOK).vocab_size, d_model=32, d_kv=8, d_ff=64,
                   num_layers=1, num_decoder_layers=1, num_heads=2, decoder_start_token_id=0)
    cfg.img_dim = 24
    m = AutoUIModel(cfg)
    ckpt = tmp_path / "auto-ui"
    m.save_pretrained(str(ckpt))
    T5Tokenizer(vocab_file=str(TOK), extra_ids=0).save_pretrained(str(ckpt))
    p = AutoUIPolicy.from_pretrained(ckpt)
    assert p.load_report == {"missing": [], "unexpected": []}
    for k, v in m.state_dict().items():
        assert torch.equal(v, p.model.state_dict()[k]), k
    # a checkpoint without the fusion layers, and with a stray tensor
    state = {k: v.clone() for k, v in m.state_dict().items()
             if not k.startswith("gate_dense") and "embed_tokens" not in k}
    state["stray.weight"] = torch.zeros(2)
    for f in ckpt.glob("*.safetensors"):
        f.unlink()
    save_file(state, str(ckpt / "model.safetensors"))
    with pytest.raises(ValueError) as e:
        AutoUIPolicy.from_pretrained(ckpt)
    assert "gate_dense.weight" in str(e.value) and "stray.weight" in str(e.value)
    loose = AutoUIPolicy.from_pretrained(ckpt, strict=False)
    assert loose.load_report["unexpected"] == ["stray.weight"]
    with pytest.raises(FileNotFoundError, match="config.json"):
        AutoUIPolicy.from_pretrained(tmp_path / "nothing")


def test_a_checkpoint_with_its_own_output_head_keeps_both_matrices(tmp_path):
    """FLAN-T5 (hence Auto-UI-base) has an lm_head apart from the embeddings; transformers 5
    ties T5's head on load whatever the config says, which would overwrite one with the
    other. Both survive from_pretrained, and a save/load round trip."""
    from safetensors.torch import save_file
    from transformers import T5Tokenizer

    cfg = T5Config(vocab_size=SPTokenizer(TOK).vocab_size, d_model=32, d_kv=8, d_ff=64,
                   num_layers=1, num_decoder_layers=1, num_heads=2, decoder_start_token_id=0)
    cfg.img_dim = 24
    m = AutoUIModel(cfg)
    state = {k: v.clone() for k, v in m.state_dict().items()}
    torch.manual_seed(1)
    state["lm_head.weight"] = torch.randn_like(state["shared.weight"])
    ckpt = tmp_path / "flan-like"
    m.save_pretrained(str(ckpt))
    for f in ckpt.glob("*.safetensors"):
        f.unlink()
    save_file({k: v.contiguous() for k, v in state.items()}, str(ckpt / "model.safetensors"))
    T5Tokenizer(vocab_file=str(TOK), extra_ids=0).save_pretrained(str(ckpt))
    p = AutoUIPolicy.from_pretrained(ckpt)
    assert torch.equal(p.model.shared.weight, state["shared.weight"])
    assert torch.equal(p.model.encoder.embed_tokens.weight, state["shared.weight"])
    assert torch.equal(p.model.lm_head.weight, state["lm_head.weight"])
    q = AutoUIPolicy.load(p.save(tmp_path / "saved"))
    assert torch.equal(q.model.shared.weight, state["shared.weight"])
    assert torch.equal(q.model.lm_head.weight, state["lm_head.weight"])
    feats = np.zeros((1, 24), np.float32)
    prompt, act = ["Previous Actions: None Goal: Go to ebay.com</s>"], ["PRESS_HOME"]
    assert torch.allclose(p.log_prob(prompt, feats, act), q.log_prob(prompt, feats, act))


def _full_forward_log_prob(p, prompts, feats, actions):
    """The plain way: the model's own forward over the padded batch, log-softmax over every
    position, gathered at the labels, pads masked (what log_prob did before issue 16)."""
    enc = p.tokenizer(prompts)
    act = p.tokenizer(actions, max_length=None)
    labels, mask = act["input_ids"], act["attention_mask"]
    out = p.model(**enc, image_ids=feats, labels=labels.masked_fill(mask == 0, -100),
                  decoder_attention_mask=mask)
    logp = torch.log_softmax(out.logits.double(), -1).gather(-1, labels[..., None])[..., 0]
    return (logp * mask).sum(-1)


@pytest.mark.parametrize("tied", [True, False])
def test_bucketed_log_prob_equals_the_full_forward_in_any_order(tied):
    """Rows sorted by length, scored in buckets cut to their own lengths, the head on real
    tokens only: the same numbers and gradients as the padded full forward, in the caller's
    order, for a tied head (the preset) and an untied one (FLAN-T5, hence Auto-UI-base)."""
    p = small(seed=4, tie_word_embeddings=tied)
    rng = np.random.default_rng(0)
    goals = ["Go to ebay.com", "Open the clock", 'Go to costco.com, search for "usb c hub"',
             'Go to walmart.com, search for "bose soundsport free wireless", and select the '
             "first entry"]
    acts = [HOME, TAP, format_action(Action.type_text("usb c hub")),
            format_action(Action.swipe(x0=0.5, y0=0.8, x1=0.5, y1=0.3))]
    prompts = [f"Previous Actions: {acts[rng.integers(4)] if rng.random() < .5 else ''} "
               f"Goal: {goals[rng.integers(4)]}</s>" for _ in range(11)]
    actions = [acts[rng.integers(4)] for _ in range(11)]
    feats = torch.randn(11, 16)
    ref = _full_forward_log_prob(p, prompts, feats, actions)
    p.model.zero_grad()
    ref.sum().backward()
    ref_grad = {n: q.grad.clone() for n, q in p.model.named_parameters() if q.grad is not None}
    for rows in (3, 32):
        p.bucket_rows = rows
        p.model.zero_grad()
        got = p.log_prob(prompts, feats, actions)
        assert torch.allclose(got.double(), ref.detach(), atol=1e-4)
        got.sum().backward()
        for n, q in p.model.named_parameters():
            if n in ref_grad:
                assert torch.allclose(q.grad, ref_grad[n], atol=1e-4, rtol=1e-3), n
    perm = rng.permutation(11)
    again = p.log_prob([prompts[i] for i in perm], feats[perm], [actions[i] for i in perm])
    assert torch.allclose(again, got[perm], atol=1e-5)
    assert p.log_prob([], torch.zeros(0, 16), []).shape == (0,)


def test_inverse_transform_sampling_draws_the_softmax():
    """sample_categorical draws softmax(logits / T) (chi-square at 6 degrees of freedom far
    below its 0.1% point, 22.5), never a token scored -inf, and follows torch's seed."""
    from digirl_lite.policy.sampling import sample_categorical

    logits = torch.tensor([2.0, 0.5, -1.0, float("-inf"), 1.0, 0.0, -0.5, 1.5])
    n = 40_000
    for temp in (1.0, 2.0):
        torch.manual_seed(0)
        draws = sample_categorical(logits.repeat(n, 1), temp)
        counts = torch.bincount(draws, minlength=8).double()
        expect = torch.softmax(logits.double() / temp, -1) * n
        assert counts[3] == 0
        keep = expect > 0
        chi2 = float((((counts - expect) ** 2)[keep] / expect[keep]).sum())
        assert chi2 < 22.5, (temp, chi2)
    torch.manual_seed(5)
    a = sample_categorical(logits.repeat(50, 1))
    torch.manual_seed(5)
    assert torch.equal(a, sample_categorical(logits.repeat(50, 1)))
    with pytest.raises(ValueError, match="temperature"):
        sample_categorical(logits[None], 0.0)


def test_act_samples_the_models_distribution():
    """What act() samples at temperature 1 is the model's own distribution: over 400 draws
    of a peaked model's first action token, each of the three most frequent strings comes as
    often as the softmax mass of the tokens that decode to it (within 4 standard
    deviations); greedy decoding always takes the most likely token."""
    from collections import Counter

    p = small(seed=6)
    with torch.no_grad():
        p.model.lm_head.weight.mul_(3)  # a peaked distribution (head tied: embeddings too)
    n = 400
    feats = torch.randn(1, 16).repeat(n, 1)
    outs = p.act([PROMPT] * n, feats, max_new_tokens=1, generator_seed=3)
    enc = p.tokenizer([PROMPT])
    with torch.no_grad():
        logits = p.model(**enc, image_ids=feats[:1],
                         decoder_input_ids=torch.zeros(1, 1, dtype=torch.long)).logits[0, -1]
    probs = torch.softmax(logits.double(), -1)
    text_of = [p.tokenizer.decode([t]).strip("\n") for t in range(len(probs))]
    for text, count in Counter(outs).most_common(3):
        mass = float(sum(probs[t] for t in range(len(probs)) if text_of[t] == text))
        sd = (mass * (1 - mass) / n) ** 0.5
        assert abs(count / n - mass) < 4 * sd + 1e-9, (text, count / n, mass)
    assert Counter(outs).most_common(1)[0][1] < 0.9 * n  # sampled, not always one token
    greedy = p.act([PROMPT] * 3, feats[:3], max_new_tokens=1, temperature=0.0)
    assert set(greedy) == {text_of[int(probs.argmax())]}


def _grads(p):
    return torch.cat([q.grad.flatten() for q in p.model.parameters() if q.grad is not None])


def test_repeated_rows_are_merged_without_changing_the_update():
    """A minibatch drawn with replacement repeats rows: scored once with the summed share,
    the loss and the gradient are those of the batch as drawn (plain mean and AWR weights)."""
    from digirl_lite.policy.updates import text_mle_update

    prompts = [PROMPT, "Previous Actions: Goal: Open the clock</s>"]
    acts = [HOME, TAP]
    feats = torch.randn(2, 16)
    rows = [0, 1, 0, 0, 1, 1, 0]
    weights = np.array([1.0, 0.5, 2.0, 0.0, 1.0, 3.0, 0.25])
    for w in (None, weights):
        p = small(seed=8)
        opt = torch.optim.SGD(p.parameters(), lr=0.0)  # a step that moves nothing
        loss = text_mle_update(p, opt, [prompts[r] for r in rows], feats[rows],
                               [acts[r] for r in rows], None, weights=w)
        got = _grads(p)
        p.model.zero_grad()
        lp = p.log_prob([prompts[r] for r in rows], feats[rows], [acts[r] for r in rows])
        share = torch.ones(len(rows)) / len(rows) if w is None else \
            torch.as_tensor(w / w.sum(), dtype=torch.float32)
        ref = -(share * lp).sum()
        ref.backward()
        assert loss == pytest.approx(float(ref.detach()), rel=1e-5)
        assert torch.allclose(got, _grads(p), atol=1e-6, rtol=1e-4)


def test_bf16_updates_stay_close_to_fp32_and_restore_the_attention():
    """Under actor_precision("bf16") the log-likelihoods stay within 1% of fp32 and the
    gradient points the same way (cosine > 0.99); the model's attention implementation is
    put back afterwards; anything but "fp32"/"bf16" is refused."""
    from digirl_lite.policy.updates import actor_precision

    p = small(seed=9)
    prompts = [PROMPT, 'Previous Actions: Goal: Go to costco.com, search for "tv"</s>'] * 3
    actions = [HOME, format_action(Action.type_text("tv")), TAP] * 2
    feats = torch.randn(6, 16)
    impl = p.model.config._attn_implementation
    lp32 = p.log_prob(prompts, feats, actions)
    lp32.sum().backward()
    g32 = _grads(p)
    p.model.zero_grad()
    with actor_precision(p, "bf16"):
        assert p.model.config._attn_implementation == "eager"
        lp16 = p.log_prob(prompts, feats, actions)
        assert lp16.dtype == torch.float32
    lp16.sum().backward()
    g16 = _grads(p)
    assert p.model.config._attn_implementation == impl
    assert torch.allclose(lp16, lp32, rtol=1e-2)
    assert not torch.equal(lp16, lp32)  # bf16 really ran
    assert torch.nn.functional.cosine_similarity(g16, g32, dim=0) > 0.99
    with pytest.raises(ValueError, match="precision"):
        with actor_precision(p, "fp16"):
            pass


@pytest.mark.slow
def test_bf16_updates_in_one_region_see_the_weights_the_optimizer_moved():
    """Issue 28's bf16 collapse: the updates of a phase run in one actor_precision region,
    and each forward there must read the weights as the last optimizer step left them (with
    autocast's weight cache on it read the bf16 copies made at the region's first forward,
    so every update took the first one's gradient). Here: weights changed inside the region
    change its log-likelihoods, and 20 updates on one batch lower the loss in bf16 as far as
    in fp32 (within 10%; with the cache on bf16 ended 2.7x above fp32)."""
    from digirl_lite.policy.updates import actor_precision, text_mle_update

    prompts = [PROMPT, 'Previous Actions: Goal: Go to costco.com, search for "tv"</s>'] * 2
    actions = [HOME, format_action(Action.type_text("tv"))] * 2
    feats = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    final = {}
    for precision in ("fp32", "bf16"):
        p = small(seed=9)
        with actor_precision(p, precision):
            before = p.log_prob(prompts, feats, actions).detach()
            with torch.no_grad():
                for w in p.model.parameters():
                    w.mul_(0.5)
            after = p.log_prob(prompts, feats, actions).detach()
        assert (after - before).abs().max() > 0.1, precision  # the halved weights were read
        p = small(seed=9)
        opt = torch.optim.AdamW(p.parameters(), lr=1e-2)
        with actor_precision(p, precision):
            losses = [text_mle_update(p, opt, prompts, feats, actions, None)
                      for _ in range(20)]
        final[precision] = losses
    assert final["fp32"][-1] < 0.5 * final["fp32"][0]
    assert final["bf16"][-1] < 0.5 * final["bf16"][0]  # cache on: 0.84 of the first
    assert final["bf16"][-1] == pytest.approx(final["fp32"][-1], rel=0.2)  # cache on: 2.7x


def test_bf16_is_refused_on_a_cpu_that_emulates_it(monkeypatch):
    """actor_precision='bf16' where the CPU has no bf16 hardware (this project's AVX2 AMD
    machine: 10x slower than fp32) is a ConfigError naming the field; with the hardware it
    is accepted."""
    import digirl_lite.policy.updates as updates
    from digirl_lite.train.config import ConfigError, sim_quick

    monkeypatch.setattr(updates, "cpu_has_native_bf16", lambda: False)
    with pytest.raises(ConfigError, match="actor_precision='bf16' on a CPU without"):
        sim_quick(actor_precision="bf16")
    monkeypatch.setattr(updates, "cpu_has_native_bf16", lambda: True)
    assert sim_quick(actor_precision="bf16").actor_precision == "bf16"
    assert sim_quick().actor_precision == "fp32"


def _decoder_states(p, prompts, feats, actions):
    """The decoder's last hidden states over the padded batch, the plain way."""
    enc = p.tokenizer(prompts)
    act = p.tokenizer(actions, max_length=None)
    labels, mask = act["input_ids"], act["attention_mask"]
    out = p.model(**enc, image_ids=feats, labels=labels.masked_fill(mask == 0, -100),
                  decoder_attention_mask=mask, output_hidden_states=True)
    return out.decoder_hidden_states[-1], mask


def test_value_head_gives_a_value_per_action_token_from_the_decoder_state():
    """Issue 17, item 2: per-token values from the decoder state that writes each token
    (a linear head, bias 0.1 at first, DARWIN.md A.6), beside the same per-token
    log-probabilities log_prob sums; masked at pads, in the caller's order, bucketed or not;
    the value loss reaches the head and the T5 body."""
    from digirl_lite.policy import VALUE_BIAS

    p = small(seed=6)
    assert p.value_head_fresh and VALUE_BIAS == 0.1
    assert p.value_head.linear.bias.item() == pytest.approx(0.1)
    prompts = [PROMPT, "Previous Actions: Goal: Open the clock</s>", PROMPT]
    actions = [HOME, TAP, format_action(Action.type_text("usb c hub"))]
    feats = torch.randn(3, 16)
    logp, values, mask = p.token_log_probs_and_values(prompts, feats, actions)
    assert logp.shape == values.shape == mask.shape
    assert torch.allclose(logp.sum(-1), p.log_prob(prompts, feats, actions), atol=1e-6)
    assert (values[mask == 0] == 0).all() and (values[mask == 1] - 0.1).abs().max() < 0.2
    hidden, ref_mask = _decoder_states(p, prompts, feats, actions)
    assert torch.equal(mask, ref_mask)
    want = p.value_head(hidden) * ref_mask
    assert torch.allclose(values, want, atol=1e-5)
    p.bucket_rows = 1
    _, v1, _ = p.token_log_probs_and_values(prompts, feats, actions)
    assert torch.allclose(v1, values, atol=1e-5)
    ((values - 1.0) ** 2 * mask).sum().backward()
    assert p.value_head.linear.weight.grad.abs().sum() > 0
    assert p.model.decoder.block[0].layer[0].SelfAttention.q.weight.grad.abs().sum() > 0
    assert all(q not in set(p.parameters()) for q in p.value_head.parameters())


def test_value_head_saves_and_loads_with_the_policy_and_is_fresh_where_absent(tmp_path, caplog):
    import json
    import logging

    p = small(seed=7)
    with torch.no_grad():
        p.value_head.linear.weight.normal_()
        p.value_head.linear.bias.fill_(-0.7)
    p.save(tmp_path / "pol")
    q = AutoUIPolicy.load(tmp_path / "pol")
    assert not q.value_head_fresh
    for a, b in zip(p.value_head.state_dict().values(), q.value_head.state_dict().values()):
        assert torch.equal(a, b)
    feats = torch.randn(2, 16)
    assert torch.equal(p.token_log_probs_and_values([PROMPT] * 2, feats, [HOME, TAP])[1],
                       q.token_log_probs_and_values([PROMPT] * 2, feats, [HOME, TAP])[1])
    # a policy saved before the value head existed (the shipped starting policies): fresh
    (tmp_path / "pol" / "value_head.safetensors").unlink()
    meta = json.loads((tmp_path / "pol" / "digirl_policy.json").read_text())
    del meta["value_head"]
    (tmp_path / "pol" / "digirl_policy.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.INFO, logger="digirl_lite.policy.policy"):
        old = AutoUIPolicy.load(tmp_path / "pol")
    assert old.value_head_fresh and old.value_head.linear.bias.item() == pytest.approx(0.1)
    assert "has no value head: a fresh one" in caplog.text
    for a, b in zip(p.model.state_dict().values(), old.model.state_dict().values()):
        assert torch.equal(a, b)
    shipped = AutoUIPolicy.load(data_dir() / "policies" / "sft-webshop")
    assert shipped.value_head_fresh


@pytest.mark.slow
def test_sample_records_the_tokens_and_log_probs_it_drew():
    """Issue 17, item 3's old log-probabilities: sample() returns the token ids the model
    wrote and each one's log-probability as drawn. Unconstrained at temperature 1 they are
    the teacher-forced log-probabilities of those very ids; under the grammar mask each is
    at least the unmasked one (the distribution renormalised over fewer tokens); act() is
    sample()'s text; greedy decoding records none."""
    p = small(seed=8)
    prompts = [PROMPT, "Previous Actions: Goal: Open the clock</s>"] * 3
    feats = torch.randn(6, 16)
    got = p.sample(prompts, feats, generator_seed=3, max_new_tokens=24)
    assert [s.text for s in got] == p.act(prompts, feats, generator_seed=3, max_new_tokens=24)
    eos = p.tokenizer.eos_token_id
    for s in got:
        assert len(s.log_probs) == len(s.token_ids) and all(x <= 0 for x in s.log_probs)
        assert s.token_ids[-1] == eos or len(s.token_ids) == 24
    tf, _, mask = p.token_ids_log_probs_and_values(prompts, feats, [s.token_ids for s in got])
    for i, s in enumerate(got):
        n = len(s.token_ids)
        assert int(mask[i].sum()) == n
        np.testing.assert_allclose(tf[i, :n].detach().numpy(), s.log_probs, atol=1e-4)
    con = p.sample(prompts, feats, generator_seed=3, max_new_tokens=48, constrained=True)
    tf, _, _ = p.token_ids_log_probs_and_values(prompts, feats, [s.token_ids for s in con])
    gain = []
    for i, s in enumerate(con):
        assert parse_action(s.text).is_valid
        d = np.array(s.log_probs) - tf[i, :len(s.token_ids)].detach().numpy()
        assert (d >= -1e-4).all()
        gain.append(d.max())
    assert max(gain) > 0.01  # the mask removed mass somewhere: the recorded ones are its
    greedy = p.sample(prompts[:2], feats[:2], temperature=0.0, max_new_tokens=24)
    assert all(s.log_probs is None and s.token_ids for s in greedy)
    with pytest.raises(ValueError, match="at least one token"):
        p.token_ids_log_probs_and_values(prompts[:1], feats[:1], [()])


def test_a_fresh_value_head_leaves_the_sampling_stream_alone():
    """Building a policy (and its fresh value head) draws nothing from torch's global
    generator, so a run's samples for a seed are what they were before the head existed."""
    from digirl_lite.policy import ValueHead

    torch.manual_seed(123)
    a = torch.rand(3)
    torch.manual_seed(123)
    head = ValueHead(32)
    assert torch.equal(torch.rand(3), a)
    assert torch.equal(ValueHead(32).linear.weight, head.linear.weight)  # seeded, not global
