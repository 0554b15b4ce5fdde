"""Copy-constrained typing (digirl_lite.policy.copying, issue 32 item 5): a TYPE action's text
is a span of the instruction, word-aligned, compared case-insensitively; the mask binds only
inside a TYPE's typed text and never empties a row the grammar left open."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from digirl_lite.actions import Action, ActionType, format_action, parse_action
from digirl_lite.paths import data_dir
from digirl_lite.policy import AutoUIPolicy
from digirl_lite.policy.copying import copy_logits_processor, span_ok
from digirl_lite.policy.grammar import action_logits_processor
from digirl_lite.prompts import build_prompt

AITW = Path(__file__).resolve().parents[3] / "shared" / "data" / "aitw_tasks"


@pytest.mark.parametrize("text,complete,want", [
    ("crucial mx500 ssd", True, True),
    ("Crucial MX500 SSD", True, True),  # case-insensitive, like the simulator's search box
    ("a crucial mx500 ssd", True, True),  # a span (which span is the model's choice)
    ("up a crsunial mx500 ssd", True, False),  # a misspelling (measured on the split)
    ("crucial mx5", True, False),  # ends inside a word
    ("crucial mx5", False, True),  # ... but may still grow into a span
    ("rucial", False, False),  # starts inside a word
    ("ssd ssd", False, False),  # a stutter
    ("ebay.com", True, True),
    ("", True, False),
    ("", False, True),
])
def test_span_rule(text, complete, want):
    assert span_ok("At ebay.com, look up a crucial mx500 ssd", text, complete) is want


def _lines():
    files = sorted((data_dir() / "tasks").glob("*.txt"))
    files += sorted(AITW.glob("*.txt")) if AITW.is_dir() else []
    assert len(files) >= 6
    for f in files:
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                yield f.name, line


def test_what_the_expert_types_is_a_span_of_every_task_line():
    """The premise of the mask: on every shipped list and split, and every AitW line the
    simulator reads, the texts the simulator's expert types (the query, the shop's address)
    are spans of the instruction."""
    from digirl_lite.envs.sim.catalog import SITES
    from digirl_lite.envs.sim.tasks import UnsupportedTaskError, parse_task

    checked, bad = 0, []
    for name, line in _lines():
        try:
            task = parse_task(line)
        except UnsupportedTaskError:
            continue  # AitW lines outside the simulator
        typed = [t for t in (task.query, SITES[task.site].domain if task.site else None) if t]
        for text in typed:
            checked += 1
            if not span_ok(line, text):
                bad.append((name, line, text))
    assert checked > 1500
    assert not bad, bad[:5]


def _type_head(tok) -> list[int]:
    """The ids of a TYPE action up to (and including) its typed text's opening quote."""
    full = tok([format_action(Action.type_text("x"))], max_length=None)["input_ids"][0].tolist()
    ids = full[:-3]  # "x", the closing quote, eos
    assert tok.batch_decode([ids])[0].endswith('"typed_text": "')
    return ids


@pytest.mark.slow
def test_random_scores_type_only_spans(tok):
    """Whatever the model's scores, under the grammar and the copy mask every TYPE written is
    a span of its own row's instruction, and no row is ever left without a token."""
    instructions = ["At ebay.com, look up a Crucial MX500 SSD",
                    "i need keychron k2 keyboard from bestbuy.com and grab the top match",
                    "What's the news in Chile?",
                    'Go to newegg.com, search for "Sony WH-CH720N headphones"']
    b = 48
    rows = [instructions[i % len(instructions)] for i in range(b)]
    prompts = [build_prompt(r) for r in rows]
    head = _type_head(tok)
    gen = torch.Generator().manual_seed(0)
    grammar = action_logits_processor(tok, 64)
    copy = copy_logits_processor(tok, prompts)
    ids = torch.tensor([[0] + head] * b)
    for _ in range(40):
        scores = torch.randn(b, tok.vocab_size, generator=gen) * 3
        scores = copy(ids, grammar(ids, scores))
        assert torch.isfinite(scores).any(dim=1).all()
        ids = torch.cat([ids, scores.argmax(-1, keepdim=True)], 1)
    texts = []
    for row, s in zip(rows, tok.batch_decode(ids[:, 1:])):
        a = parse_action(s)
        assert a.action_type is ActionType.TYPE, s
        assert span_ok(row, a.typed_text), (row, a.typed_text)
        texts.append(a.typed_text.lower())
    assert len(set(texts)) > 8  # the mask leaves the choice of span to the scores


@pytest.mark.slow
def test_without_the_mask_random_scores_leave_the_spans(tok):
    """The test above can fail: the grammar alone types text no span allows."""
    head = _type_head(tok)
    gen = torch.Generator().manual_seed(0)
    grammar = action_logits_processor(tok, 64)
    ids = torch.tensor([[0] + head] * 16)
    for _ in range(64 - len(head)):
        scores = grammar(ids, torch.randn(16, tok.vocab_size, generator=gen) * 3)
        ids = torch.cat([ids, scores.argmax(-1, keepdim=True)], 1)
    acts = [parse_action(s) for s in tok.batch_decode(ids[:, 1:])]
    assert not all(span_ok("At ebay.com, look up a Crucial MX500 SSD", a.typed_text)
                   for a in acts)


def test_no_span_leaves_the_row_to_the_grammar(tok):
    """An instruction with no word to copy: the copy rule allows nothing the grammar does
    (an empty TYPE text), so the row keeps the grammar's mask and still parses."""
    prompts = [build_prompt("?!")] * 2 + ["no goal in this prompt"] * 2
    head = _type_head(tok)
    grammar = action_logits_processor(tok, 64)
    copy = copy_logits_processor(tok, prompts)
    ids = torch.tensor([[0] + head] * 4)
    gen = torch.Generator().manual_seed(1)
    for _ in range(64 - len(head)):  # the grammar's budget: it ends the action within 64
        g = grammar(ids, torch.randn(4, tok.vocab_size, generator=gen))
        s = copy(ids, g.clone())
        assert torch.equal(torch.isfinite(s), torch.isfinite(g))
        ids = torch.cat([ids, s.argmax(-1, keepdim=True)], 1)
    for s in tok.batch_decode(ids[:, 1:]):
        assert parse_action(s).action_type is ActionType.TYPE


@pytest.mark.slow
def test_shipped_policy_types_spans_and_is_untouched_elsewhere(shipped):
    """The shipped policy on expert screens whose goals are rewritten in held-out phrasings,
    sampled: with ``copy_text`` every TYPE is a span of its goal; every row whose unmasked
    draw (same per-row stream) is not a TYPE is drawn the same with the mask (it binds only
    inside a typed text)."""
    from digirl_lite.envs.sim.demos import generate_demos
    from digirl_lite.envs.sim.phrasings import HELD_OUT_PHRASINGS, rephrase
    from digirl_lite.envs.sim.tasks import parse_task
    from digirl_lite.prompts import task_from_prompt
    from digirl_lite.vision.sim_encoder import SimScreenEncoder

    trajs, screens, _ = generate_demos("webshop", n=8, seed=0)
    steps = [s for t in trajs for s in t.steps][:48]
    goals, prompts = [], []
    for i, st in enumerate(steps):
        task = task_from_prompt(st.prompt)
        goal = rephrase(parse_task(task), HELD_OUT_PHRASINGS, random.Random(i))
        goals.append(goal)
        prompts.append(st.prompt.replace(task, goal))
    feats = torch.from_numpy(SimScreenEncoder(dim=512, seed=0).encode(
        [screens.image(st.screen_id) for st in steps]))
    n_type = n_same = 0
    for rep in range(2):
        kw = dict(temperature=1.0, max_new_tokens=64, constrained=True,
                  row_seeds=[i + 100 * rep for i in range(len(steps))])
        free = shipped.sample(prompts, feats, **kw)
        masked = shipped.sample(prompts, feats, copy_text=True, **kw)
        for g, f, m in zip(goals, free, masked):
            fa, ma = parse_action(f.text), parse_action(m.text)
            if ma.action_type is ActionType.TYPE:
                n_type += 1
                assert span_ok(g, ma.typed_text), (g, ma.typed_text)
            if fa.action_type is not ActionType.TYPE:
                n_same += 1
                assert m.text == f.text and m.token_ids == f.token_ids
    assert n_type >= 5 and n_same >= 20


@pytest.mark.parametrize("constrained, copy_once", [(True, False), (True, True),
                                                     (False, False)])
@pytest.mark.slow
def test_on_policy_updates_score_under_the_sampling_masks(shipped, constrained, copy_once):
    """PPO's and GRPO's ratio (issue 47, item 5): the shipped policy's tokens sampled under
    the grammar and the copy mask (with the texts typed before), scored again under the
    same Masks, give the recorded log-probabilities, so the first update's ratios are 1 and
    its KL to the sampler 0; scored without the masks, the ratios leave 1 (what the config
    refused before the scoring put them again)."""

    from digirl_lite.envs.sim.demos import generate_demos
    from digirl_lite.policy.base import Masks
    from digirl_lite.policy.updates import PPOBatch, ppo_update
    from digirl_lite.vision.sim_encoder import SimScreenEncoder

    trajs, screens, _ = generate_demos("webshop", n=4, seed=0)
    steps = [s for t in trajs for s in t.steps][:24]  # expert screens: searches to type
    prompts = [s.prompt for s in steps]
    typed = [[] if i % 2 == 0 else ["sony"] for i in range(len(prompts))]
    feats = torch.from_numpy(SimScreenEncoder(dim=512, seed=0).encode(
        [screens.image(s.screen_id) for s in steps]))
    masks = Masks(constrained, True, copy_once, 64)
    drawn = shipped.sample(prompts, feats, 1.0, 64, generator_seed=1, constrained=constrained,
                           copy_text=True, typed=typed if copy_once else None)
    assert sum(parse_action(d.text).action_type == ActionType.TYPE for d in drawn) >= 2

    def first_update(m):
        p = AutoUIPolicy.load(data_dir() / "policies" / "sft-webshop")
        opt = torch.optim.AdamW(p.parameters(), lr=1e-4)
        batch = PPOBatch(prompts, feats, [d.token_ids for d in drawn],
                         [d.log_probs for d in drawn],
                         [[1.0] * len(d.token_ids) for d in drawn], None,
                         typed=typed if copy_once else None)
        return ppo_update(p, opt, batch, value_coef=0.0, masks=m)

    same = first_update(masks)
    assert same["ratio_max"] == pytest.approx(1.0, abs=1e-3)
    assert same["ratio_min"] == pytest.approx(1.0, abs=1e-3)
    assert abs(same["kl"]) < 1e-4
    unmasked = first_update(None)
    assert unmasked["ratio_max"] > 1.01 or unmasked["ratio_min"] < 0.99


def test_on_policy_learners_take_the_masks_on_the_autoui_policy_only():
    from digirl_lite.errors import ConfigError
    from digirl_lite.train.config import sim_quick

    for algo in ("ppo", "grpo"):
        cfg = sim_quick(algorithm=algo, copy_typed_text=True, constrained_decoding=True)
        assert cfg.copy_typed_text and cfg.constrained_decoding
        with pytest.raises(ConfigError, match="copy_typed_text"):
            sim_quick(algorithm=algo, copy_typed_text=True, policy="vlm",
                      policy_path=str(data_dir()))


class _Chosen:
    """A span chooser (the protocol copy_logits_processor takes): fixed spans per instruction,
    in the lower-cased instruction's characters."""

    def __init__(self, texts):
        self.texts = texts

    def spans(self, instruction):
        src = " ".join(instruction.lower().split())
        out = []
        for t in self.texts[instruction]:
            i = src.find(t)
            assert i >= 0, t
            out.append((i, i + len(t)))
        return out


def _draw(tok, prompts, seed=2, **kw):
    """Random scores through the grammar and the copy mask: each row's typed text."""
    head = _type_head(tok)
    gen = torch.Generator().manual_seed(seed)
    grammar = action_logits_processor(tok, 64)
    copy = copy_logits_processor(tok, prompts, **kw)
    ids = torch.tensor([[0] + head] * len(prompts))
    for _ in range(40):
        scores = copy(ids, grammar(ids, torch.randn(len(prompts), tok.vocab_size,
                                                    generator=gen) * 3))
        assert torch.isfinite(scores).any(dim=1).all()
        ids = torch.cat([ids, scores.argmax(-1, keepdim=True)], 1)
    return [parse_action(s).typed_text.lower() for s in tok.batch_decode(ids[:, 1:])]


@pytest.mark.slow
def test_a_span_chooser_narrows_typing_to_its_spans(tok):
    """With a chooser, random scores type only its spans (the address or the product), each
    whole; without one they typed many others (the test above)."""
    want = {"At ebay.com, look up a Crucial MX500 SSD": ["ebay.com", "crucial mx500 ssd"],
            "i need keychron k2 keyboard from bestbuy.com and grab the top match":
                ["bestbuy.com", "keychron k2 keyboard"]}
    rows = [list(want)[i % 2] for i in range(32)]
    typed = _draw(tok, [build_prompt(r) for r in rows], seed=1, spans=_Chosen(want))
    for row, t in zip(rows, typed):
        assert t in want[row], (row, t)
    assert {t for t in typed} == {t for v in want.values() for t in v}  # each one chosen


@pytest.mark.slow
def test_a_text_typed_already_is_not_copied_again(tok):
    """``typed``: with a chooser, a row whose episode typed the address types only the
    product; a row that typed both may type either again (no span is left otherwise); a row
    that typed nothing, either."""
    ins = "At ebay.com, look up a Crucial MX500 SSD"
    want = {ins: ["ebay.com", "crucial mx500 ssd"]}
    histories = [["eBay.com"], ["ebay.com", "crucial mx500 ssd"], []] * 12
    texts = _draw(tok, [build_prompt(ins)] * len(histories), spans=_Chosen(want),
                  typed=histories)
    for h, t in zip(histories, texts):
        assert t in want[ins], t
        if len(h) == 1:
            assert t == "crucial mx500 ssd"
    assert {t for h, t in zip(histories, texts) if len(h) == 2} == set(want[ins])
    assert {t for h, t in zip(histories, texts) if not h} == set(want[ins])
    with pytest.raises(ValueError, match="typed-text lists"):
        copy_logits_processor(tok, [build_prompt(ins)] * 2, typed=[[]])


@pytest.mark.slow
def test_without_a_chooser_a_typed_text_does_not_close_again(tok):
    """Any-span mode: the typed text is never closed again, its longer and shorter spans
    still are (random scores type it often without ``typed``: the test can fail)."""
    ins = "At ebay.com, look up a Crucial MX500 SSD"
    prompts = [build_prompt(ins)] * 64
    free = _draw(tok, prompts)
    assert "ebay.com" in free
    once = _draw(tok, prompts, typed=[["ebay.com"]] * 64)
    assert "ebay.com" not in once
    assert all(span_ok(ins, t) for t in once)
    assert len(set(once)) > 5


@pytest.mark.slow
def test_the_agent_keeps_each_episodes_typed_texts(shipped):
    """``PolicyBatchAgent(copy_once=True)`` with the shipped policy on the screens where the
    expert types (the chooser offers the address and the product): a slot never types a
    text twice in one episode while the other is left, and a new episode (step 0) types
    again what the last one typed."""
    from digirl_lite.envs.base import Observation
    from digirl_lite.envs.sim.catalog import SITES
    from digirl_lite.envs.sim.demos import generate_demos
    from digirl_lite.envs.sim.tasks import parse_task
    from digirl_lite.policy.agent import PolicyBatchAgent
    from digirl_lite.prompts import task_from_prompt
    from digirl_lite.vision.cache import FeatureCache
    from digirl_lite.vision.sim_encoder import SimScreenEncoder

    trajs, screens, _ = generate_demos("webshop", n=40, seed=0)
    want, steps = {}, []
    for st in (s for t in trajs for s in t.steps if s.action.action_type is ActionType.TYPE):
        task = task_from_prompt(st.prompt)
        t = parse_task(task)
        if t.query and len(steps) < 16:
            want[task] = [SITES[t.site].domain.lower(), t.query.lower()]
            steps.append(st)
    assert len(steps) >= 8
    with pytest.raises(ValueError, match="copy_once needs copy_text"):
        PolicyBatchAgent(shipped, None, screens, copy_once=True)
    agent = PolicyBatchAgent(shipped, FeatureCache(SimScreenEncoder(dim=512, seed=0)),
                             screens, temperature=1.0, constrained=True,
                             copy_text=_Chosen(want), copy_once=True)
    slots = list(range(len(steps)))
    typed: dict[int, list[str]] = {s: [] for s in slots}
    last: dict[int, list[str]] = {}
    repeats = again = 0
    for step in (1, 2, 3, 0, 1):
        if step == 0:  # a new episode
            last, typed = typed, {s: [] for s in slots}
        observations = [Observation(screens.image(st.screen_id), st.prompt,
                                    task_from_prompt(st.prompt), step, st.screen_id)
                        for st in steps]
        for s, text in zip(slots, agent.act_batch(slots, observations)):
            a = parse_action(text)
            if a.action_type is not ActionType.TYPE:
                continue
            t = a.typed_text.lower()
            offered = want[task_from_prompt(steps[s].prompt)]
            assert t in offered, (t, offered)
            if t in typed[s] and not set(offered) <= set(typed[s]):
                repeats += 1
            again += t in last.get(s, [])
            typed[s].append(t)
    assert repeats == 0
    assert again >= 2  # the new episode forgot the last one's texts


def test_typed_memory_resets_at_a_new_episode_whose_first_steps_it_did_not_see():
    """A harness around the agent (Darwin-Claw's units) may decide an episode's first steps:
    the per-slot memory of typed texts still starts afresh for the new episode."""
    from digirl_lite.envs.base import Observation
    from digirl_lite.policy.agent import PolicyBatchAgent

    agent = PolicyBatchAgent(None, None, None, copy_text=True, copy_once=True)

    def obs(step: int, task: str = "buy a usb cable") -> Observation:
        return Observation(screenshot=None, prompt="", task=task, step=step)

    assert agent.typed_before([0], [obs(0)]) == [[]]
    agent._record_typed([0], [format_action(Action(ActionType.TYPE, typed_text="usb"))])
    assert agent.typed_before([0], [obs(1)]) == [["usb"]]  # the same episode
    assert agent.typed_before([0], [obs(3)]) == [["usb"]]
    # the next episode of the same task, its step 0 decided around the agent
    assert agent.typed_before([0], [obs(1)]) == [[]]
