"""Grammar-constrained decoding of the action string (digirl_lite.policy.grammar)."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from digirl_lite.actions import Action, ActionType, format_action, parse_action
from digirl_lite.paths import data_dir
from digirl_lite.policy import AutoUIPolicy, HFTokenizer
from digirl_lite.policy.grammar import (
    ActionGrammar,
    ActionLogitsProcessor,
    ActionVocabulary,
    action_logits_processor,
)

TOK = data_dir() / "tokenizer" / "spiece.model"
PROMPT = "Previous Actions: Goal: Go to ebay.com</s>"
G = ActionGrammar()
ALPHABET = sorted(set(format_action(Action.tap(x=0.5, y=0.5)) + format_action(
    Action.key(ActionType.PRESS_BACK)) + "".join(t.value for t in ActionType)
    + "0123456789-.,[] xyz\n"))


def accepts(text: str) -> bool:
    s = G.feed(G.start, text)
    return s is not None and s[0] == "end"


@pytest.fixture(scope="module")
def policy():
    return AutoUIPolicy.sim_preset(seed=0)


def hf_tokenizer() -> HFTokenizer:
    """A transformers T5 tokenizer (the tokenizers backend, Metaspace decoding: a piece's
    leading space dropped at the start) over the simulator's pieces: the HF path, offline."""
    import sentencepiece as spm
    from transformers import T5Tokenizer

    sp = spm.SentencePieceProcessor()
    sp.Load(str(TOK))
    return HFTokenizer(T5Tokenizer(vocab=[(sp.IdToPiece(i), sp.GetScore(i))
                                          for i in range(sp.GetPieceSize())], extra_ids=0))


# -- the automaton -----------------------------------------------------------------------
coord = st.integers(0, 10_000).map(lambda k: k / 10_000)
actions = st.one_of(
    st.builds(lambda y0, x0, y1, x1: Action(ActionType.DUAL_POINT, (y0, x0), (y1, x1)),
              coord, coord, coord, coord),
    st.text(st.characters(blacklist_characters='"\n', blacklist_categories=("Cs",)),
            min_size=1, max_size=20).map(Action.type_text),
    st.sampled_from([t for t in ActionType if t not in (ActionType.DUAL_POINT,
                                                         ActionType.TYPE,
                                                         ActionType.INVALID)]).map(Action.key),
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(actions)
def test_every_canonical_action_string_is_in_the_language(action):
    text = format_action(action)
    assert accepts(text)
    assert all(G.feed(G.start, text[:k]) is not None for k in range(len(text)))


@pytest.mark.parametrize("text", [
    'Action Decision: "action_type": "DUAL_POINT", "touch_point": "[-1.0, -1.0]", '
    '"lift_point": "[-1.0, -1.0]", "typed_text": ""',  # a tap needs coordinates
    'Action Decision: "action_type": "DUAL_POINT", "touch_point": "[1.5000, 0.5000]", '
    '"lift_point": "[0.6200, 0.5000]", "typed_text": ""',  # outside [0, 1]
    'Action Decision: "action_type": "TYPE", "touch_point": "[-1.0, -1.0]", '
    '"lift_point": "[-1.0, -1.0]", "typed_text": ""',  # TYPE with no text
    'Action Decision: "action_type": "CLICK", "touch_point": "[-1.0, -1.0]", '
    '"lift_point": "[-1.0, -1.0]", "typed_text": ""',
    "0.8852 0.3763, 0.87940.3212DUAL_POINT",  # the number salad of issue 16
])
def test_strings_parse_action_rejects_are_not_in_the_language(text):
    assert not parse_action(text).is_valid
    assert not accepts(text)


def test_random_walks_through_the_automaton_end_in_valid_actions():
    rng = random.Random(0)
    for _ in range(100):
        state, text = G.start, ""
        while state[0] != "end":
            options = [c for c in ALPHABET if G.step(state, c) is not None]
            assert options, f"a dead end after {text!r}"
            c = rng.choice(options)
            state, text = G.step(state, c), text + c
        assert parse_action(text).is_valid, text


# -- one tokenizer's tables --------------------------------------------------------------
@pytest.mark.parametrize("make", ["sp", "hf"])
def test_token_strings_rebuild_what_the_tokenizer_decodes(policy, make):
    """The decoded text of a token sequence is the first token's text alone followed by the
    others' texts after a token: what the automaton reads is what parse_action will read."""
    tok = policy.tokenizer if make == "sp" else hf_tokenizer()
    v = ActionVocabulary(tok)
    usable = [i for i, s in enumerate(v.strings) if s and v.first_strings[i] is not None]
    assert len(usable) > 0.9 * v.size
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.choice(usable) for _ in range(rng.randrange(1, 12))]
        written = v.first_strings[ids[0]] + "".join(v.strings[i] for i in ids[1:])
        assert tok.batch_decode([ids + [v.eos_id]])[0] == written, ids
    assert v.eos_id in v.ends


@pytest.mark.slow
def test_the_processor_never_masks_every_token(policy):
    """In every state reached by the grammar, with any budget (none left included), and in
    states the mask can never lead to, some token stays allowed."""
    v = ActionVocabulary(policy.tokenizer)
    rng = random.Random(1)
    for _ in range(8):
        rows = []
        for _ in range(8):  # random allowed walks of random lengths, some past the cap
            state, ids = v.grammar.start, [0]
            for _ in range(rng.randrange(0, 45)):
                ok = v.allowed(state, rng.randrange(-2, 40)).nonzero().flatten().tolist()
                t = rng.choice(ok)
                ids.append(t)
                state = v.advance(state, t)
            rows.append(ids)
        rows.append([0] + [rng.randrange(v.size) for _ in range(10)])  # a bypassed mask
        n = max(len(r) for r in rows)
        ids = torch.tensor([r + [0] * (n - len(r)) for r in rows])
        out = ActionLogitsProcessor(v, max_new_tokens=40)(ids, torch.zeros(len(rows), v.size))
        assert torch.isfinite(out).any(dim=-1).all()


def test_the_mask_renormalises_the_model_distribution(policy):
    v = ActionVocabulary(policy.tokenizer)
    scores = torch.randn(1, v.size)
    out = ActionLogitsProcessor(v, 64)(torch.zeros(1, 1, dtype=torch.long), scores)
    keep = torch.isfinite(out[0])
    assert 0 < int(keep.sum()) < v.size
    assert torch.equal(out[0, keep], scores[0, keep])  # allowed logits untouched
    p = out.softmax(-1)[0]
    q = scores[0, keep].softmax(-1)
    assert torch.allclose(p[keep], q) and float(p[~keep].sum()) == 0.0


# -- sampling from a random policy --------------------------------------------------------
def _sample(policy, n, constrained, max_new_tokens=48, seed=0):
    img = np.random.default_rng(seed).normal(size=(n, policy.img_dim)).astype(np.float32)
    return policy.act([PROMPT] * n, img, max_new_tokens=max_new_tokens, generator_seed=seed,
                      constrained=constrained)


@pytest.mark.slow
def test_every_constrained_sample_of_a_random_policy_is_a_valid_action(policy):
    out = _sample(policy, 64, constrained=True)
    bad = [s for s in out if not parse_action(s).is_valid]
    assert not bad, bad[:3]
    kinds = {parse_action(s).action_type for s in out}
    assert len(kinds) >= 3  # the mask leaves the choice of action to the model
    free = _sample(policy, 64, constrained=False)
    assert sum(not parse_action(s).is_valid for s in free) > 48


@pytest.mark.slow
def test_a_tight_cap_still_ends_every_action(policy):
    out = _sample(policy, 16, constrained=True, max_new_tokens=16, seed=3)
    assert all(parse_action(s).is_valid for s in out), out


@pytest.mark.slow
def test_constrained_sampling_works_with_a_transformers_tokenizer(policy):
    hf = AutoUIPolicy(policy.model, hf_tokenizer())
    out = _sample(hf, 16, constrained=True, max_new_tokens=64, seed=2)
    assert all(parse_action(s).is_valid for s in out), [s for s in out
                                                         if not parse_action(s).is_valid]


def test_one_vocabulary_per_tokenizer(policy):
    a = action_logits_processor(policy.tokenizer, 32)
    b = action_logits_processor(policy.tokenizer, 64)
    assert a.vocab is b.vocab and a is not b


def test_import_digirl_lite_does_not_load_the_grammar():
    code = ("import sys, digirl_lite, digirl_lite.policy, digirl_lite.train; "
            "print('digirl_lite.policy.grammar' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["False", "False"]
