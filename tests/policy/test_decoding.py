"""The written-out decoding loop (digirl_lite.policy.decoding) against transformers'
``generate()``: the same tokens and per-token log-probabilities for the same random stream,
sampled and greedy, with and without the action grammar, on the shipped policy and on
small models of other shapes (untied head, gated feed-forward)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LogitsProcessorList

from digirl_lite.actions import parse_action
from digirl_lite.policy import AutoUIPolicy
from digirl_lite.policy.decoding import decode
from digirl_lite.policy.grammar import action_logits_processor
from digirl_lite.policy.sampling import CategoricalSampler
from digirl_lite.vision.sim_encoder import SimScreenEncoder


@pytest.fixture(scope="module")
def demo():
    """12 expert steps of simulated Web Shopping: their prompts (of different lengths, so
    the shorter ones are padded) and their screens' features."""
    from digirl_lite.envs.sim.demos import generate_demos

    trajs, screens, _ = generate_demos("webshop", n=6, seed=0)
    steps = [s for t in trajs for s in t.steps]
    rows = [steps[i] for i in np.random.default_rng(0).choice(len(steps), 12)]
    feats = SimScreenEncoder(dim=512, seed=0).encode([screens.image(s.screen_id)
                                                      for s in rows])
    return [s.prompt for s in rows], torch.from_numpy(feats)


@pytest.fixture(scope="module")
def prompts(demo):
    return demo[0]


def _features(policy, n, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(
        (n, policy.img_dim)).astype(np.float32))


def _both(policy, prompts, img, max_new, make_processors, seed):
    """(generate's ids, its sampler's log-probs), (decode's ids, its log-probs)."""
    enc = policy._encode_prompts(prompts)
    policy.model.eval()
    out = []
    for run in ("generate", "decode"):
        procs = make_processors()
        torch.manual_seed(seed)
        if run == "generate":
            ids = policy.model.generate(
                **enc, image_ids=img, max_new_tokens=max_new, do_sample=False,
                pad_token_id=policy.tokenizer.pad_token_id,
                eos_token_id=policy.tokenizer.eos_token_id,
                decoder_start_token_id=policy.model.config.decoder_start_token_id,
                logits_processor=LogitsProcessorList(procs))
        else:
            ids = decode(policy.model, enc["input_ids"], enc["attention_mask"], img, max_new,
                         policy.tokenizer.eos_token_id, policy.tokenizer.pad_token_id, procs)
        samplers = [p for p in procs if isinstance(p, CategoricalSampler)]
        lp = torch.stack(samplers[0].log_probs, 1) if samplers else None
        out.append((ids, lp))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("constrained", [False, True])
def test_decode_samples_what_generate_samples_on_the_shipped_policy(shipped, demo,
                                                                   constrained):
    prompts, img = demo

    def procs():
        grammar = [action_logits_processor(shipped.tokenizer, 64)] if constrained else []
        return [*grammar, CategoricalSampler(1.0)]

    for seed in range(3):
        (ref, ref_lp), (ids, lp) = _both(shipped, prompts, img, 64, procs, seed)
        assert torch.equal(ids, ref)
        assert lp.shape == ref_lp.shape
        torch.testing.assert_close(lp, ref_lp, atol=1e-4, rtol=1e-4)
        if constrained:
            texts = shipped.tokenizer.batch_decode(ids[:, 1:])
            assert all(parse_action(t.strip("\n")) is not None for t in texts)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [
    {},  # the preset's shape, tied head
    {"tie_word_embeddings": False},
    {"feed_forward_proj": "gated-gelu", "num_layers": 3, "num_decoder_layers": 1},
])
def test_decode_matches_generate_on_other_shapes(prompts, shape):
    p = AutoUIPolicy.sim_preset(seed=1, **{"d_model": 48, "d_kv": 12, "d_ff": 96,
                                           "num_heads": 4, "img_dim": 16, **shape})
    img = _features(p, len(prompts), seed=2)
    # greedy: argmax of the raw scores
    (ref, _), (ids, _) = _both(p, prompts, img, 20, list, 0)
    assert torch.equal(ids, ref)
    # sampled at temperature 0.7: random weights write long rows, so the cap is reached
    (ref, ref_lp), (ids, lp) = _both(p, prompts, img, 20,
                                     lambda: [CategoricalSampler(0.7)], 5)
    assert torch.equal(ids, ref) and ids.shape[1] == 21
    torch.testing.assert_close(lp, ref_lp, atol=1e-4, rtol=1e-4)


def test_decode_stops_when_every_row_has_ended_and_pads_after_eos(shipped, demo):
    prompts, img = demo
    torch.manual_seed(0)
    enc = shipped._encode_prompts(prompts)
    ids = decode(shipped.model, enc["input_ids"], enc["attention_mask"], img, 64,
                 shipped.tokenizer.eos_token_id, shipped.tokenizer.pad_token_id,
                 [CategoricalSampler(1.0)])
    eos, pad = shipped.tokenizer.eos_token_id, shipped.tokenizer.pad_token_id
    assert (ids[:, 0] == shipped.model.config.decoder_start_token_id).all()
    lengths = []
    for row in ids[:, 1:].tolist():
        if eos in row:  # eos, then only pads
            lengths.append(row.index(eos) + 1)
            assert all(x == pad for x in row[lengths[-1]:])
        else:  # no eos: the row ran to the cap
            lengths.append(64)
            assert pad not in row
    assert ids.shape[1] - 1 == max(lengths)  # it stopped when the last row ended
    assert min(lengths) < max(lengths)
    # zero tokens allowed: only the decoder start
    assert decode(shipped.model, enc["input_ids"], enc["attention_mask"], img, 0, eos,
                  pad).shape == (len(prompts), 1)
