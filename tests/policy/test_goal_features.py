"""Goal features (digirl_lite.policy.goal_features, issue 32 item 5): the frozen MiniLM's token
states of the goal, aligned to the policy's tokens by their characters and added to its token
embeddings through one trained map."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from digirl_lite.paths import data_dir
from digirl_lite.policy import AutoUIPolicy, SPTokenizer
from digirl_lite.policy.goal_features import GoalFeatures, goal_span
from digirl_lite.policy.tokenizer import SIM_TOKENIZER_FILE
from digirl_lite.prompts import build_prompt

AITW = Path(__file__).resolve().parents[3] / "shared" / "data" / "aitw_tasks"
LAST = ('Action Decision: "action_type": "TYPE", "touch_point": "[-1.0, -1.0]", '
        '"lift_point": "[-1.0, -1.0]", "typed_text": "crucial"')


@pytest.fixture(scope="module")
def feats():
    return GoalFeatures("minilm")


@pytest.fixture(scope="module")
def policy(feats):
    torch.manual_seed(0)
    p = AutoUIPolicy.sim_preset(seed=0, goal_features="minilm")
    p.goal_features = feats  # one MiniLM for the module
    return p


def _lines() -> list[str]:
    lines = []
    for f in ("webshop_test.txt", "webshop_unseen_phrasings.txt", "general_test.txt"):
        lines += (data_dir() / "tasks" / f).read_text().splitlines()[:40]
    if AITW.is_dir():  # the real AitW lines where the checkout has them (as test_copying)
        lines += (AITW / "webshop_test.txt").read_text().splitlines()[:20]
    return [x for x in lines if x.strip()] + ["Goal: 日本語 café x", "ünïcödé razér kiyo"]


def test_token_spans_are_the_tokens_characters(tok):
    for line in _lines():
        prompt = build_prompt(line, LAST)
        ids, spans = tok.encode_spans(prompt)
        assert ids == tok.encode(prompt)
        assert len(spans) == len(ids)
        text = "".join(prompt[a:b] for a, b in spans)
        assert text == prompt  # the spans tile the prompt, in order
        for (a, b), i in zip(spans, ids):
            piece = tok.sp.IdToPiece(i).replace("\u2581", " ")
            if not piece.startswith("<0x") and i != tok.eos_token_id:
                assert prompt[a:b] == piece, (prompt, piece)
        cut_ids, cut_spans = tok.encode_spans(prompt, max_length=12)
        assert cut_ids == tok.encode(prompt, max_length=12) and cut_spans == spans[-12:]


def test_encoder_token_states_carry_their_characters(feats):
    text = "At ebay.com, look up a Crucial MX500 ssd"
    (spans, states), = feats.encoder.token_states([text])
    assert states.shape == (len(spans), 384)
    pieces = feats.encoder.tokenizer.tokenize(text)
    assert len(pieces) == len(spans)
    for (a, b), piece in zip(spans, pieces):
        assert text[a:b].lower() == piece.removeprefix("##")
    # unpadded states: alone or in a batch with a longer text, the same numbers
    (_, again), _ = feats.encoder.token_states([text, text + " and the first result " * 3])
    assert torch.allclose(states, again, atol=1e-5)


def test_features_are_the_overlapping_states_on_the_goal_only(tok, feats):
    goal = "At ebay.com, look up a crucial mx500 ssd"
    prompt = build_prompt(goal, LAST)
    enc = feats.encode(tok, [prompt, build_prompt("Go to costco.com")], max_length=512)
    plain = tok([prompt, build_prompt("Go to costco.com")], max_length=512)
    assert torch.equal(enc["input_ids"], plain["input_ids"])
    assert torch.equal(enc["attention_mask"], plain["attention_mask"])
    ids, spans = tok.encode_spans(prompt)
    start, task = goal_span(prompt)
    assert task == goal and prompt[start:start + len(goal)] == goal
    (wp, states), = feats.encoder.token_states([goal])
    lang = enc["lang"][0]
    n_goal = 0
    for k, (a, b) in enumerate(spans):
        over = [j for j, (c, d) in enumerate(wp) if c + start < b and d + start > a and b > a]
        if not over:
            assert lang[k].abs().sum() == 0, prompt[a:b]
            continue
        n_goal += 1
        assert b > start  # nothing before the goal (the previous action typed "crucial")
        assert torch.allclose(lang[k], states[over].mean(0), atol=1e-5)
    assert n_goal >= 10
    assert enc["lang"][1, int(plain["attention_mask"][1].sum()):].abs().sum() == 0  # pads


@pytest.mark.slow
def test_policy_reads_the_features_and_trains_only_its_own_weights(policy):
    prompts = [build_prompt("At ebay.com, look up a crucial mx500 ssd"),
               build_prompt('Go to costco.com, search for "razer kiyo", and select the first '
                            'entry', LAST)]
    img = np.zeros((2, policy.img_dim), np.float32)
    samples = policy.sample(prompts, img, temperature=1.0, generator_seed=1,
                            max_new_tokens=24)
    tok_lp, _, mask = policy.token_ids_log_probs_and_values(
        prompts, img, [s.token_ids for s in samples])
    for row, s in enumerate(samples):
        n = len(s.token_ids)
        assert np.allclose(tok_lp[row, :n].detach().numpy(), s.log_probs, atol=1e-4)
    # the features change what the policy computes
    actions = [s.text for s in samples]
    with_feats = policy.log_prob(prompts, img, actions).detach()
    with torch.no_grad():
        w = policy.model.lang_dense.weight.clone()
        policy.model.lang_dense.weight.zero_()
        without = policy.log_prob(prompts, img, actions)
        policy.model.lang_dense.weight.copy_(w)
    assert not torch.allclose(with_feats, without, atol=1e-3)
    # the encoder is frozen and outside the policy's parameters; lang_dense trains
    names = {n for n, _ in policy.model.named_parameters()}
    assert "lang_dense.weight" in names and not any("encoder.layer" in n for n in names)
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    before_enc = [p.clone() for p in policy.goal_features.encoder.model.parameters()][:3]
    (-policy.log_prob(prompts, img, actions).sum()).backward()
    assert policy.model.lang_dense.weight.grad.abs().sum() > 0
    opt.step()
    opt.zero_grad()
    assert not torch.equal(policy.model.lang_dense.weight, w)
    for p, q in zip(before_enc, policy.goal_features.encoder.model.parameters()):
        assert torch.equal(p, q)
    with torch.no_grad():
        policy.model.lang_dense.weight.copy_(w)


@pytest.mark.slow
def test_saved_policy_loads_with_its_features(policy, tmp_path):
    prompts = [build_prompt("i need a sony wh-ch720n from newegg.com")]
    img = np.zeros((1, policy.img_dim), np.float32)
    action = [LAST]
    policy.save(tmp_path / "p")
    again = AutoUIPolicy.load(tmp_path / "p")
    assert again.goal_features is not None and again.goal_features.name == "minilm"
    assert again.model.lang_dim == 384
    assert torch.allclose(again.log_prob(prompts, img, action),
                          policy.log_prob(prompts, img, action), atol=1e-5)


def test_config_names_the_field(tmp_path, policy):
    from digirl_lite.errors import ConfigError
    from digirl_lite.policy.factory import initial_policy
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.starting import sft_key

    with pytest.raises(ConfigError, match="goal_features"):
        sim_quick(goal_features="bert")
    with pytest.raises(ConfigError, match="goal_features"):
        sim_quick(goal_features="minilm", starting_policy="shipped")
    with pytest.raises(ConfigError, match="goal_features"):
        sim_quick(goal_features="minilm", policy="vlm", policy_path=str(tmp_path))
    on = sim_quick(goal_features="minilm", starting_policy="sft")
    off = sim_quick(starting_policy="sft")
    assert sft_key(on) != sft_key(off)  # a cached starting policy is never the other's
    policy.save(tmp_path / "with")
    with pytest.raises(ConfigError, match="goal_features"):
        initial_policy(sim_quick(starting_policy=str(tmp_path / "with")))
    got = initial_policy(sim_quick(starting_policy=str(tmp_path / "with"),
                                   goal_features="minilm"))
    assert got.goal_features is not None


def test_cache_keeps_the_latest_goals_and_answers_the_same(tok, feats):
    small = GoalFeatures("minilm", encoder=feats.encoder, cache_size=2)
    goals = ["Go to ebay.com", "look up razer kiyo on bestbuy.com", "i need a stroller"]
    first = [small.encode(tok, [build_prompt(g)], 512)["lang"] for g in goals]
    assert list(small._cache) == goals[1:]
    again = small.encode(tok, [build_prompt(goals[0])], 512)["lang"]  # recomputed
    assert torch.allclose(again, first[0], atol=1e-5)
    assert list(small._cache) == [goals[2], goals[0]]


def test_goal_token_dropout_trains_through_the_features_and_acts_with_everything(feats):
    from digirl_lite.errors import ConfigError
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.starting import sft_key

    torch.manual_seed(0)
    p = AutoUIPolicy.sim_preset(seed=0, goal_features="minilm", goal_token_dropout=0.9)
    p.goal_features = feats
    assert p.model.config.lang_token_dropout == 0.9
    prompts = [build_prompt("At ebay.com, look up a crucial mx500 ssd", LAST)]
    img = np.zeros((1, p.img_dim), np.float32)
    p.model.eval()
    a, b = p.log_prob(prompts, img, [LAST]), p.log_prob(prompts, img, [LAST])
    assert torch.equal(a, b)  # acting and scoring in eval mode: every embedding kept
    p.model.train()
    drawn = {round(float(p.log_prob(prompts, img, [LAST]).detach()), 4) for _ in range(4)}
    assert len(drawn) > 1  # training mode drops goal embeddings at random
    # the prompt's tokens before the goal keep theirs: the encoder's input there is unchanged
    enc = p._encode_prompts(prompts)
    goal = enc["lang"].abs().sum(-1) > 0
    assert goal.any() and (~goal).any()
    p.model.eval()
    with pytest.raises(ConfigError, match="goal_token_dropout"):
        sim_quick(goal_token_dropout=0.5)  # without goal features
    with pytest.raises(ConfigError, match="goal_token_dropout"):
        sim_quick(goal_features="minilm", goal_token_dropout=0.5, algorithm="ppo",
                  starting_policy="sft")
    on = sim_quick(goal_features="minilm", goal_token_dropout=0.5, starting_policy="sft")
    assert sft_key(on) != sft_key(sim_quick(goal_features="minilm", starting_policy="sft"))


def test_goal_token_dropout_1_reads_the_goal_through_the_features_alone_when_acting(feats):
    from digirl_lite.errors import ConfigError
    from digirl_lite.train.config import sim_quick

    p = AutoUIPolicy.sim_preset(seed=0, goal_features="minilm", goal_token_dropout=1.0)
    p.goal_features = feats
    prompts = [build_prompt("At ebay.com, look up a crucial mx500 ssd", LAST)]
    img = np.zeros((1, p.img_dim), np.float32)
    p.model.eval()
    alone = p.log_prob(prompts, img, [LAST])
    enc = p._encode_prompts(prompts)
    goal = enc["lang"].abs().sum(-1) > 0
    seen = []
    hook = p.model.encoder.register_forward_pre_hook(
        lambda mod, args, kw: seen.append(kw["inputs_embeds"].detach()), with_kwargs=True)
    assert torch.equal(p.log_prob(prompts, img, [LAST]), alone)
    hook.remove()
    with torch.no_grad():  # at the goal's tokens the encoder reads the features alone
        from_features = p.model.lang_dense(enc["lang"])
    assert torch.allclose(seen[0][goal], from_features[goal], atol=1e-6)
    assert not torch.allclose(seen[0][~goal], from_features[~goal])  # elsewhere the tokens'
    p.model.lang_token_dropout = 0.0  # the same weights reading the goal's embeddings too
    assert not torch.allclose(p.log_prob(prompts, img, [LAST]), alone, atol=1e-3)
    # always dropped is the same in training and acting: PPO's ratio can use it
    sim_quick(goal_features="minilm", goal_token_dropout=1.0, algorithm="ppo",
              starting_policy="sft")
    with pytest.raises(ConfigError, match=r"goal_token_dropout must be in \[0, 1\]"):
        sim_quick(goal_features="minilm", goal_token_dropout=1.5, starting_policy="sft")


@pytest.mark.slow
def test_pretrained_token_table_is_frozen_distinct_and_saved(feats, tmp_path):
    """``token_embeddings`` "minilm": every piece of the vocabulary gets its own row (copying
    tells them apart), words MiniLM knows as alike sit closer than unlike ones, the table is
    never trained (nor the head tied to it) and comes back from a save; the config names the
    field and keys the starting policy with it."""
    from digirl_lite.errors import ConfigError
    from digirl_lite.policy.factory import initial_policy
    from digirl_lite.policy.goal_features import pretrained_token_table
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.starting import sft_key

    tok = SPTokenizer(data_dir() / "tokenizer" / SIM_TOKENIZER_FILE)
    table = pretrained_token_table(tok, 128, encoder=feats.encoder)
    assert table.shape == (tok.vocab_size, 128)
    assert len({tuple(r) for r in table.round(decimals=4).tolist()}) == tok.vocab_size
    assert torch.allclose(table.std(0), torch.ones(128), atol=1e-3)
    sp = tok.sp

    def row(word):
        i = sp.PieceToId("\u2581" + word)
        assert i != sp.unk_id(), word
        return torch.nn.functional.normalize(table[i, :118], dim=0)

    # prepositions sit closer to each other than to a product's word (MiniLM: 0.62 and 0.06)
    assert row("for") @ row("in") > row("for") @ row("phone") + 0.3
    assert row("to") @ row("in") > row("to") @ row("pro") + 0.3
    with pytest.raises(ValueError, match="d_model"):
        pretrained_token_table(tok, 8, encoder=feats.encoder)

    p = AutoUIPolicy.sim_preset(seed=0, token_embeddings="minilm")
    assert torch.equal(p.model.shared.weight, table)
    assert not p.model.shared.weight.requires_grad
    assert p.model.lm_head.weight is p.model.shared.weight  # the tied head is the table too
    prompts = [build_prompt("At ebay.com, look up a crucial mx500 ssd")]
    img = np.zeros((1, p.img_dim), np.float32)
    opt = torch.optim.AdamW([q for q in p.parameters() if q.requires_grad], lr=0.1)
    enc_before = p.model.encoder.block[0].layer[0].SelfAttention.q.weight.clone()
    (-p.log_prob(prompts, img, [LAST]).sum()).backward()
    opt.step()
    assert torch.equal(p.model.shared.weight, table)
    assert not torch.equal(p.model.encoder.block[0].layer[0].SelfAttention.q.weight, enc_before)
    p.save(tmp_path / "lex")
    again = AutoUIPolicy.load(tmp_path / "lex")
    assert torch.equal(again.model.shared.weight, table)
    assert not again.model.shared.weight.requires_grad
    assert torch.allclose(again.log_prob(prompts, img, [LAST]), p.log_prob(prompts, img, [LAST]),
                          atol=1e-5)

    with pytest.raises(ValueError, match="token_embeddings must be one of"):
        AutoUIPolicy.sim_preset(seed=0, token_embeddings="glove")
    with pytest.raises(ConfigError, match="token_embeddings must be one of"):
        sim_quick(token_embeddings="glove", starting_policy="sft")
    with pytest.raises(ConfigError, match="token_embeddings: the shipped"):
        sim_quick(token_embeddings="minilm", starting_policy="shipped")
    with pytest.raises(ConfigError, match="token_embeddings: the table is the Auto-UI"):
        sim_quick(token_embeddings="minilm", policy="vlm", policy_path=str(tmp_path))
    on = sim_quick(token_embeddings="minilm", starting_policy="sft")
    assert sft_key(on) != sft_key(sim_quick(starting_policy="sft"))
    with pytest.raises(ConfigError, match="token_embeddings is 'trained'"):
        initial_policy(sim_quick(starting_policy=str(tmp_path / "lex")))
    got = initial_policy(sim_quick(starting_policy=str(tmp_path / "lex"),
                                   token_embeddings="minilm"))
    assert torch.equal(got.model.shared.weight, table)


def test_a_goal_word_no_train_text_held_is_read_through_the_features_alone(feats, tmp_path):
    """``goal_unseen_words`` "features": the words of the run's train texts are the policy's
    known words; a goal word outside them ("start": the held-out split's opening verb) has
    its tokens' own embeddings dropped, when acting and after a save, and only it."""
    from digirl_lite.envs.setup import train_goal_words
    from digirl_lite.errors import ConfigError
    from digirl_lite.policy.goal_features import goal_words
    from digirl_lite.train.config import sim_quick

    cfg = sim_quick(world="general", goal_features="minilm", goal_token_dropout=0.5,
                    sft_phrasing_share=0.5, starting_policy="sft",
                    goal_unseen_words="features")
    words = train_goal_words(cfg)
    assert {"open", "launch", "fire", "settings", "weather", "capital"} <= words
    held = (data_dir() / "tasks" / "general_unseen_phrasings.txt").read_text().splitlines()
    verbs = {goal_words(t)[0][2] for t in held if t.lower().startswith("start")}
    assert verbs == {"start"} and not verbs & words  # the split's verb is no train word
    p = AutoUIPolicy.sim_preset(seed=0, goal_features="minilm", goal_token_dropout=0.5)
    p.goal_features = GoalFeatures("minilm", encoder=feats.encoder)
    p.model.eval()
    task = "start the Settings app"
    prompts = [build_prompt(task, LAST)]
    img = np.zeros((1, p.img_dim), np.float32)
    before = p.log_prob(prompts, img, [LAST])
    p.read_unseen_words_through_features(words)
    enc = p._encode_prompts(prompts)
    assert enc["lang"].shape[-1] == p.model.lang_dim + 1
    flagged = enc["lang"][0, :, -1] > 0.5
    at, _ = goal_span(prompts[0])
    spans = p.tokenizer(prompts, max_length=None, spans=True)["spans"][0]
    start_tokens = torch.tensor([a < at + 5 and b > at for a, b in spans] +
                                [False] * (len(flagged) - len(spans)))
    assert torch.equal(flagged, start_tokens) and flagged.any()
    seen = []
    hook = p.model.encoder.register_forward_pre_hook(
        lambda mod, args, kw: seen.append(kw["inputs_embeds"].detach()), with_kwargs=True)
    after = p.log_prob(prompts, img, [LAST])
    hook.remove()
    with torch.no_grad():  # at "start" the encoder reads the features alone
        from_features = p.model.lang_dense(enc["lang"][..., :-1])
    assert torch.allclose(seen[0][0][flagged], from_features[0][flagged], atol=1e-6)
    goal = enc["lang"][0, :, :-1].abs().sum(-1) > 0
    assert not torch.allclose(seen[0][0][goal & ~flagged], from_features[0][goal & ~flagged])
    assert not torch.allclose(after, before, atol=1e-4)
    p.save(tmp_path / "p")
    again = AutoUIPolicy.load(tmp_path / "p")
    again.goal_features.encoder = feats.encoder
    assert again.goal_features.known_words == words
    assert torch.allclose(again.log_prob(prompts, img, [LAST]), after, atol=1e-5)
    from digirl_lite.policy.factory import initial_policy

    with pytest.raises(ConfigError, match="goal_unseen_words is 'embeddings'"):
        initial_policy(sim_quick(world="general", goal_features="minilm",
                                 starting_policy=str(tmp_path / "p")))
    with pytest.raises(ConfigError, match="goal_unseen_words must be one of"):
        sim_quick(goal_features="minilm", starting_policy="sft", goal_unseen_words="drop")
    with pytest.raises(ConfigError, match="goal_unseen_words 'features'"):
        sim_quick(goal_unseen_words="features")


def test_a_run_built_with_goal_unseen_words_features_reads_the_train_words(tmp_path,
                                                                           make_trainer):
    """The run sets the known words from its own train texts when it builds its starting
    policy (here a saved directory), keeps them through a save, and a run whose config
    says otherwise refuses that policy."""
    from digirl_lite.envs.setup import train_goal_words
    from digirl_lite.errors import ConfigError
    from digirl_lite.train.config import sim_quick

    AutoUIPolicy.sim_preset(seed=0, goal_features="minilm").save(tmp_path / "start")
    cfg = sim_quick(world="general", goal_features="minilm",
                    starting_policy=str(tmp_path / "start"), goal_unseen_words="features")
    t = make_trainer(cfg, tmp_path / "a")
    t.build_starting_policy()
    assert t.policy.model.config.goal_known_words == sorted(train_goal_words(cfg))
    assert t.policy.goal_features.known_words == train_goal_words(cfg)
    t.policy.save(tmp_path / "saved")
    plain = sim_quick(world="general", goal_features="minilm",
                      starting_policy=str(tmp_path / "saved"))
    with pytest.raises(ConfigError, match="goal_unseen_words is 'embeddings'"):
        make_trainer(plain, tmp_path / "b").build_starting_policy()
    with pytest.raises(ConfigError, match="changes nothing at goal_token_dropout 1"):
        sim_quick(goal_features="minilm", goal_token_dropout=1.0, starting_policy="sft",
                  goal_unseen_words="features")
