"""Web Shopping as people phrase it (issue 32, item 5): the free-form parser, the two
disjoint sets of phrasings, and the held-out split files."""

from __future__ import annotations

import random
import re

import pytest
from phone_agents import play

from digirl_lite.envs.sim.catalog import HELD_OUT_SITES, SITES, TRAIN_SITES
from digirl_lite.envs.sim.phrasings import (
    HELD_OUT_PHRASINGS,
    TRAIN_PHRASING_SETS,
    TRAIN_PHRASINGS,
    WIDE_TRAIN_PHRASINGS,
    add_typo,
    rephrase,
    rephrase_tasks,
)
from digirl_lite.envs.sim.tasks import UnsupportedTaskError, load_task_file, parse_task
from digirl_lite.paths import data_dir

TASKS = data_dir() / "tasks"


def _key(text: str) -> tuple:
    t = parse_task(text)
    return t.kind, t.site, t.level, t.query


@pytest.mark.parametrize("text, want", [
    ("look up sony wh-1000xm4 on costco.com and open the top result",
     ("webshop", "costco", 3, "sony wh-1000xm4")),
    ("take me to ebay.com", ("webshop", "ebay", 1, None)),
    ("search walmart.com for 'fire 7'", ("webshop", "walmart", 2, "fire 7")),
    ("at bestbuy.com, find me a razer viper mini then pick the first one",
     ("webshop", "bestbuy", 3, "razer viper mini")),
    ("i need logitech g305 from newegg.com", ("webshop", "newegg", 2, "logitech g305")),
    ("Can you find \"Dell P2422H\" on target.com, go with the first option",
     ("webshop", "target", 3, "Dell P2422H")),
    ("i'm looking for hp envy 13 over at ebay.com", ("webshop", "ebay", 2, "hp envy 13")),
    ("pull up bhphotovideo.com please", ("webshop", "bhphoto", 1, None)),
    # typos in the words around the product are read; the product is kept as written
    ("fnid me dji mini 3 pro on target.com and slect the frist one",
     ("webshop", "target", 3, "dji mini 3 pro")),
    ("Go to costco.com, serach for 'x y', and select the first entry",
     ("webshop", "costco", 3, "x y")),
    # the AitW forms and General read as before
    ("Go to costco.com, search for \"bose soundsport free\", and select the first entry",
     ("webshop", "costco", 3, "bose soundsport free")),
    ("Open the clock", ("open_app", None, 0, None)),
    ("Search for hotels in Boston", ("search", None, 0, "hotels in Boston")),
])
def test_free_form_web_shopping_parses(text, want):
    assert _key(text) == want
    assert parse_task(text).text == text


def test_free_form_unknown_site_names_it():
    with pytest.raises(UnsupportedTaskError, match="site 'amazon.com' is not one of"):
        parse_task("can you look up 'hp envy 13' on amazon.com")
    with pytest.raises(UnsupportedTaskError, match="amazon.com"):
        parse_task("take me to amazon.com")


def test_the_two_phrasing_sets_share_no_wording():
    def words(p):  # every template's wording, the slots and punctuation out
        return {re.sub(r"[{][dq][}]|[,.]", "", t).strip().lower()
                for t in (*p.level1, *p.level2, *p.select)}

    held = words(HELD_OUT_PHRASINGS)
    verbs = {"look up", "find me", "i need", "show me", "get me", "take me to", "pull up",
             "bring up", "top result", "first one", "first option", "top match"}
    for name, phrasings in TRAIN_PHRASING_SETS.items():
        train = words(phrasings)
        assert not train & held, name
        for v in verbs:  # the held-out split's ways of asking never appear in a train template
            assert not any(v in w for w in train), (name, v)
            assert any(v in w for w in held), v
    # the wide set, written after the split was measured, keeps off its verbs and "top" too
    for w in words(WIDE_TRAIN_PHRASINGS):
        assert not re.search(r"\b(find|need|show|get|take|want|top|up)\b", w), w
    assert set(words(TRAIN_PHRASINGS)) < set(words(WIDE_TRAIN_PHRASINGS))


@pytest.mark.parametrize("name", sorted(TRAIN_PHRASING_SETS))
def test_every_template_reads_back(name):
    """Each template on its own (rephrase retries a draw that does not parse: a template the
    parser never reads would pass unseen there), quoted, bare and with an article."""
    p = TRAIN_PHRASING_SETS[name]
    for q in ("bose 700", "'hp envy 13'", "a razer viper mini"):
        for t in p.level1:
            assert _key(t.format(d="ebay.com")) == ("webshop", "ebay", 1, None), t
        for t in p.level2:
            if q.startswith("a ") and t.startswith("Go to {d}, search for"):
                continue  # AitW's form keeps the words as written; rephrase draws again
            text = t.format(d="ebay.com", q=q)
            want = q.strip("'").removeprefix("a ")
            assert _key(text) == ("webshop", "ebay", 2, want), text
            for sel in p.select:
                assert _key(text + sel) == ("webshop", "ebay", 3, want), text + sel


@pytest.mark.parametrize("which", ["train", "test"])
def test_rephrase_keeps_site_level_and_product(which):
    lines = load_task_file(TASKS / f"webshop_{which}.txt")
    rng = random.Random(7)
    for phrasings in (TRAIN_PHRASINGS, WIDE_TRAIN_PHRASINGS, HELD_OUT_PHRASINGS):
        out = [rephrase(line, phrasings, rng) for line in lines]
        assert [_key(o) for o in out] == [_key(line) for line in lines]
        assert sum(o != line for o, line in zip(out, lines)) > 0.8 * len(lines)


def test_rephrase_tasks_share_and_determinism():
    lines = load_task_file(TASKS / "webshop_train.txt")
    a = rephrase_tasks(lines, 0.5, seed=3)
    assert a == rephrase_tasks(lines, 0.5, seed=3)
    changed = sum(x != y for x, y in zip(a, lines))
    assert 0.35 * len(lines) < changed < 0.6 * len(lines)
    assert rephrase_tasks(lines, 0.0, seed=3) == lines
    general = load_task_file(TASKS / "general_train.txt")
    assert rephrase_tasks(general, 1.0, seed=0) == general  # only Web Shopping is rephrased
    with pytest.raises(ValueError, match="share"):
        rephrase_tasks(lines, 1.5, seed=0)


def test_add_typo_is_one_edit_keeping_the_ends():
    from digirl_lite.envs.sim.tasks import _one_edit

    rng = random.Random(0)
    for _ in range(200):
        w = rng.choice(["search", "select", "first", "entry", "please", "option"])
        t = add_typo(w, rng)
        assert t != w or w[1:-1] != w[1:-1][::-1]  # a swap of equal letters can be a no-op
        assert t[0] == w[0] and t[-1] == w[-1]
        assert t == w or _one_edit(t, w)


def test_unseen_phrasings_split_is_the_test_list_rephrased():
    test = load_task_file(TASKS / "webshop_test.txt")
    split = load_task_file(TASKS / "webshop_unseen_phrasings.txt")
    assert len(split) == len(test)
    assert [_key(s) for s in split] == [_key(t) for t in test]
    assert not set(split) & set(test)
    assert sum(s == s.lower() for s in split) > 0.5 * len(split)  # mostly lower case
    train_text = "\n".join(load_task_file(TASKS / "webshop_train.txt")).lower()
    for s in split:  # written apart: no held-out wording appears in the train list
        for v in ("look up", "find me", "i need", "show me", "take me to", "top result"):
            if v in s.lower():
                assert v not in train_text


def test_the_final_split_is_the_test_list_in_templates_of_its_own():
    """``webshop_final_phrasings``: the test list line by line in :data:`FINAL_PHRASINGS`,
    whose templates (each reading back on its own) are none of another set's, and which no
    preset evaluates by default (a split for a claim, measured once)."""
    from digirl_lite.envs.sim.phrasings import FINAL_PHRASINGS
    from digirl_lite.train.config import sim_webshop

    def templates(p):
        return {t.lower() for t in (*p.level1, *p.level2, *p.select)}

    final = templates(FINAL_PHRASINGS)
    for other in (*TRAIN_PHRASING_SETS.values(), HELD_OUT_PHRASINGS):
        assert not final & templates(other)
    p = FINAL_PHRASINGS
    for q in ("bose 700", "'hp envy 13'", "a razer viper mini"):
        for t in p.level1:
            assert _key(t.format(d="ebay.com")) == ("webshop", "ebay", 1, None), t
        for t in p.level2:
            text, want = t.format(d="ebay.com", q=q), q.strip("'").removeprefix("a ")
            assert _key(text) == ("webshop", "ebay", 2, want), text
            for sel in p.select:
                assert _key(text + sel) == ("webshop", "ebay", 3, want), text + sel
    test = load_task_file(TASKS / "webshop_test.txt")
    split = load_task_file(TASKS / "webshop_final_phrasings.txt")
    held = load_task_file(TASKS / "webshop_unseen_phrasings.txt")
    assert [_key(s) for s in split] == [_key(t) for t in test]
    assert not set(split) & (set(test) | set(held))
    assert "final_phrasings" not in sim_webshop().eval_splits


def test_unseen_products_split_names_no_train_or_test_product_and_held_out_sites():
    seen = {parse_task(t).query.lower() for f in ("train", "test")
            for t in load_task_file(TASKS / f"webshop_{f}.txt") if parse_task(t).query}
    seen_words = {w for q in seen for w in q.split()}
    split = [parse_task(t) for t in load_task_file(TASKS / "webshop_unseen_products.txt")]
    products = {t.query.lower() for t in split if t.query}
    assert len(products) == 48 and not products & seen
    # each product holds a word (a kind, brand or model) no train or test product has
    assert all(set(p.split()) - seen_words for p in products)
    sites = [t.site for t in split]
    assert set(HELD_OUT_SITES) <= set(sites)
    assert 0.15 < sum(s in HELD_OUT_SITES for s in sites) / len(sites) < 0.35
    for f in ("train", "test"):  # the held-out shops appear in no train or test task
        assert not {parse_task(t).site for t in load_task_file(TASKS / f"webshop_{f}.txt")} \
            & set(HELD_OUT_SITES)
    assert set(TRAIN_SITES) | set(HELD_OUT_SITES) == set(SITES)


@pytest.mark.slow
def test_the_expert_solves_every_split_task():
    from digirl_lite.envs.sim import SimPhoneEnv
    from digirl_lite.envs.sim.agents import ScriptedExpert

    for split in ("unseen_products", "unseen_phrasings", "final_phrasings"):
        env = SimPhoneEnv(str(TASKS / f"webshop_{split}.txt"), seed=0)
        wins = sum(play(env, ScriptedExpert(), task, seed=i)[0] > 0
                   for i, task in enumerate(env.tasks[:24]))
        assert wins == 24, split


def test_phrasing_share_rephrases_the_train_tasks_only():
    from digirl_lite.envs.setup import task_list
    from digirl_lite.train.config import sim_webshop

    plain = sim_webshop()
    varied = sim_webshop(phrasing_share=0.5)
    a, b = task_list(plain, "train"), task_list(varied, "train")
    assert [(t.site, t.level, t.query) for t in a] == [(t.site, t.level, t.query) for t in b]
    changed = sum(x.text != y.text for x, y in zip(a, b))
    assert 0.35 * len(a) < changed < 0.6 * len(a)
    assert [t.text for t in task_list(varied, "test")] == [t.text for t in
                                                           task_list(plain, "test")]
    # fixed by the run's seed
    assert [t.text for t in task_list(sim_webshop(phrasing_share=0.5, seed=1), "train")] != \
        [t.text for t in b]


def test_sft_phrasing_share_is_part_of_the_starting_policys_key():
    import json

    from digirl_lite.train.config import sim_webshop
    from digirl_lite.train.starting import sft_key

    shipped = json.loads((data_dir() / "policies" / "sft-webshop" / "sft.json").read_text())
    assert sft_key(sim_webshop()) == shipped["key"]  # 0 keys as before
    assert sft_key(sim_webshop(sft_phrasing_share=0.5)) != shipped["key"]


def test_phrasing_shares_are_checked():
    from digirl_lite.errors import ConfigError
    from digirl_lite.train.config import sim_webshop

    for name in ("phrasing_share", "sft_phrasing_share"):
        with pytest.raises(ValueError, match=name):
            sim_webshop(**{name: 1.5})
    with pytest.raises(ConfigError, match="phrasing_share"):
        sim_webshop(env="android", phrasing_share=0.5)
    for name in ("phrasing_share", "sft_phrasing_share"):  # General has one set, "base"
        assert getattr(sim_webshop(world="general", **{name: 0.5}), name) == 0.5
        with pytest.raises(ConfigError, match="train_phrasings: General has one"):
            sim_webshop(world="general", train_phrasings="wide", **{name: 0.5})


@pytest.mark.slow
def test_train_phrasings_wide_reaches_every_use_and_key(tmp_path):
    """``train_phrasings`` "wide": the train tasks, the demonstrations and the copy drills are
    written with the wide set; the starting policy's and the pile's keys change with it (a
    cached "base" policy is never read for "wide"); "base" keys as before."""
    from itertools import islice

    from digirl_lite.envs.setup import task_list
    from digirl_lite.envs.sim.drills import copy_drills
    from digirl_lite.errors import ConfigError
    from digirl_lite.train.config import sim_quick, sim_webshop
    from digirl_lite.train.starting import sft_key
    from digirl_lite.train.trainer import Trainer

    base = sim_webshop(phrasing_share=1.0, sft_phrasing_share=1.0)
    wide = sim_webshop(phrasing_share=1.0, sft_phrasing_share=1.0, train_phrasings="wide")
    a, b = task_list(base, "train"), task_list(wide, "train")
    assert [(t.site, t.level, t.query) for t in a] == [(t.site, t.level, t.query) for t in b]
    only_wide = ("hey", "ok,", "please", "would you", "navigate", " via ", " in ", "check")
    assert not any(w in t.text.lower() for t in a for w in only_wide)
    assert sum(any(w in t.text.lower() for w in only_wide) for t in b) > 0.2 * len(b)
    drills = [p for p, _ in islice(copy_drills(seed=0, phrasing_share=1.0, phrasings="wide"),
                                   200)]
    assert sum(any(w in p.lower() for w in only_wide) for p in drills) > 40
    assert sft_key(wide) != sft_key(base)
    assert sft_key(sim_webshop(sft_phrasing_share=1.0, train_phrasings="base")) == sft_key(base)
    keys = [Trainer(c, tmp_path / str(i), cache_dir=None, progress=False).pile_key()
            for i, c in enumerate((sim_quick(phrasing_share=1.0),
                                   sim_quick(phrasing_share=1.0, train_phrasings="wide"),
                                   sim_quick(phrasing_share=1.0, train_phrasings="base")))]
    assert keys[0] != keys[1] and keys[0] == keys[2]
    with pytest.raises(ConfigError, match="train_phrasings must be one of"):
        sim_webshop(phrasing_share=0.5, train_phrasings="narrow")
    with pytest.raises(ConfigError, match="train_phrasings 'wide' changes nothing"):
        sim_webshop(train_phrasings="wide")
