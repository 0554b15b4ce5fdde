"""Issue 47: the paper's setting on the simulated phone: demonstrations on an older phone
(``sft_phone``), today's live dialogs (``sim_layout``), and the ground truth that shows the
mechanism (the ways back an episode took, why a failure failed)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from phone_agents import play

from digirl_lite.actions import Action, ActionType, to_gesture
from digirl_lite.envs.sim.agents import Copier, ScriptedExpert
from digirl_lite.envs.sim.env import SimPhoneEnv
from digirl_lite.envs.sim.tasks import load_task_file, parse_task
from digirl_lite.envs.sim.world import (
    FAILURE_CAUSES,
    HEIGHT,
    RECOVERIES,
    WIDTH,
    Page,
    PhoneState,
    failure_cause,
    find,
    hit_test,
    initial_state,
    minimal_reset,
    recoveries_between,
    transition,
)
from digirl_lite.paths import data_dir

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
SHOP = Page("chrome", "shop_home", site="costco")


def test_current_layout_moves_every_dialog_button_off_where_the_older_one_had_it():
    """A tap where the older layout had a dialog's button lands on the current dialog's
    backdrop or box (nothing happens); the current button closes it; BACK closes a pop-up and
    leaves voice input on both layouts; the layout survives a minimal reset."""
    for overlay, button in (("popup", "popup:close"), ("popup", "popup:nothanks"),
                            ("voice", "voice:cancel"), ("consent", "consent:accept")):
        old = PhoneState(page=SHOP, overlay=overlay)
        new = PhoneState(page=SHOP, overlay=overlay, layout="current")
        x, y = find(old, button).center
        assert find(new, button).box != find(old, button).box
        assert getattr(hit_test(new, x, y), "id", None) != button
        assert transition(new, to_gesture(Action.tap(x=x / WIDTH, y=y / HEIGHT), WIDTH, HEIGHT)
                          ).overlay == overlay
        cx, cy = find(new, button).center
        assert transition(new, to_gesture(Action.tap(x=cx / WIDTH, y=cy / HEIGHT), WIDTH, HEIGHT)
                          ).overlay is None
        if overlay != "consent":
            back = to_gesture(Action.key(ActionType.PRESS_BACK), WIDTH, HEIGHT)
            assert transition(new, back).overlay is None
            assert transition(old, back).overlay is None
    # the current cookie banner covers a shop's search box: a tap on it is absorbed
    banner = PhoneState(page=SHOP, overlay="consent", layout="current")
    x, y = find(PhoneState(page=SHOP), "search_box").center
    assert hit_test(banner, x, y).id == "consent:box"
    assert minimal_reset(banner).layout == "current"
    assert initial_state(1, "current").layout == "current"
    with pytest.raises(ValueError, match="layout must be one of older, current"):
        PhoneState(layout="newer")


@pytest.mark.slow
@pytest.mark.parametrize("world", ["webshop", "general"])
def test_the_expert_solves_the_live_phone_and_the_copier_fails_it_on_decisions(world):
    """The tasks stay solvable on today's phone as the paper setting makes it (the scripted
    expert, at least 95% of the test list's first 48 tasks), while a copier of clean
    demonstrations fails mostly on decisions: a pop-up not closed, voice input not left
    (issue 47, item 2)."""
    from digirl_lite.train.config import load_config

    tasks = load_task_file(data_dir() / "tasks" / f"{world}_test.txt")[:48]
    results = {}
    for name, make in (("expert", lambda i: ScriptedExpert()),
                       ("copier", lambda i: Copier(seed=i))):
        env = SimPhoneEnv(world, seed=0, layout="current", surprises=load_config(
            ROOT / "recipes" / "configs" / "paper_setting.json", world=world).sim_surprises)
        wins, causes = 0, Counter()
        for i, t in enumerate(tasks):
            _, info = play(env, make(i), t, seed=500 + i)
            wins += bool(info["true_success"])
            assert (info["failure_cause"] is None) == bool(info["true_success"])
            if info["failure_cause"]:
                causes[info["failure_cause"]] += 1
        results[name] = (wins, causes)
    assert results["expert"][0] >= 0.95 * len(tasks)
    wins, causes = results["copier"]
    assert wins < 0.5 * len(tasks)
    assert set(causes) <= set(FAILURE_CAUSES)
    decisions = causes["popup_not_closed"] + causes["voice_not_left"]
    assert decisions > causes["mistyped"] and decisions > sum(causes.values()) / 2


def test_recoveries_and_failure_causes_from_the_state():
    """What the environment reports for the reports: a pop-up closed, voice input left, a
    BACK off a page; and why a failure failed, checked in the documented order."""
    back = to_gesture(Action.key(ActionType.PRESS_BACK), WIDTH, HEIGHT)
    popup = PhoneState(page=SHOP, overlay="popup")
    assert recoveries_between(popup, transition(popup, back), back) == ["popup"]
    product = PhoneState(page=Page("chrome", "shop_product", site="costco", query="tv",
                                   item=3, order=tuple(range(8))),
                         history=(Page(), SHOP))
    assert recoveries_between(product, transition(product, back), back) == ["back"]
    home = to_gesture(Action.key(ActionType.PRESS_HOME), WIDTH, HEIGHT)
    assert recoveries_between(SHOP_STATE, transition(SHOP_STATE, home), home) == []
    assert set(RECOVERIES) == {"popup", "voice", "consent", "back"}

    task = parse_task('Go to costco.com, search for "tv", and select the first entry')
    assert failure_cause(popup, task) == "popup_not_closed"
    assert failure_cause(PhoneState(page=SHOP, overlay="voice"), task) == "voice_not_left"
    assert failure_cause(SHOP_STATE, task, typed=("costco.com", "tc")) == "mistyped"
    assert failure_cause(product, task, typed=("costco.com", "tv")) == "wrong_result"
    assert failure_cause(SHOP_STATE, task, stopped=True) == "stopped_early"
    assert failure_cause(initial_state(), task) == "wrong_place"
    assert failure_cause(SHOP_STATE, task) == "stuck"
    done = PhoneState(page=Page("chrome", "shop_product", site="costco", query="tv", item=0,
                                order=tuple(range(8))))
    assert failure_cause(done, task) is None


SHOP_STATE = PhoneState(page=SHOP, history=(Page(),))


@pytest.mark.slow
def test_layout_and_demonstration_phone_are_checked_by_name_and_reach_the_phones(tmp_path):
    """``sim_layout`` and ``sft_phone``: an unknown name is a ConfigError naming the field and
    the allowed values before anything runs; the layout reaches the run's phones and keys its
    pile; the older demonstration phone keeps the shipped starting policies' key."""
    from digirl_lite.envs.setup import make_phones
    from digirl_lite.errors import ConfigError
    from digirl_lite.train.config import DigiRLConfig, sim_quick
    from digirl_lite.train.starting import sft_key
    from digirl_lite.train.trainer import Trainer

    with pytest.raises(ConfigError, match="sim_layout must be one of older, current, got 'new'"):
        DigiRLConfig(sim_layout="new")
    with pytest.raises(ConfigError, match="sft_phone must be one of older, live, got 'old'"):
        DigiRLConfig(sft_phone="old")
    with pytest.raises(ConfigError, match="^sim_layout: the simulated phone's"):
        DigiRLConfig(env="android", sim_layout="current")
    cfg = sim_quick(sim_layout="current")
    assert make_phones(cfg, seed=0).make_env(0).layout == "current"
    assert make_phones(sim_quick(), seed=0).make_env(0).layout == "older"
    keys = {Trainer(c, tmp_path / str(i), cache_dir=None, progress=False).pile_key()
            for i, c in enumerate((sim_quick(), cfg))}
    assert len(keys) == 2
    for world in ("webshop", "general"):
        shipped = json.loads((data_dir() / "policies" / f"sft-{world}" / "sft.json").read_text())
        assert sft_key(sim_quick(world=world)) == shipped["key"]
    assert sft_key(sim_quick(sft_phone="live", sim_layout="current")) != sft_key(sim_quick())


def test_the_paper_setting_config_loads_on_both_worlds():
    """recipes/configs/paper_setting.json (the fourth design: the paper4 grid's setting, and
    the paper3 grids' on Web Shopping) builds a config on each world: the shipped starting
    policy fine-tuned on the older phone's demonstrations (General: 42% of their pop-ups
    closed with BACK; Web Shopping: none, per_world), today's layout (General: pop-ups on half
    the page loads, per_world), the copy path; the first, second and third designs
    (paper_setting_v1.json: the shipped policies; _v2: half closed with BACK; _v3: a third on
    General) still load, each with its own SFT key."""
    from digirl_lite.train.config import load_config
    from digirl_lite.train.starting import sft_key, shipped_policy_dir

    configs = ROOT / "recipes" / "configs"
    for world in ("webshop", "general"):
        cfg = load_config(configs / "paper_setting.json", world=world)
        assert (cfg.starting_policy, cfg.sim_layout, cfg.sft_phone,
                cfg.sft_popup_back_share) == ("shipped", "current", "older",
                                              {"webshop": 0.0, "general": 0.42}[world])
        ships = shipped_policy_dir(cfg)  # a fresh clone loads it, no 75-min fine-tuning
        assert ships.name == {"webshop": "sft-webshop",  # the main job's
                              "general": f"sft-{sft_key(cfg)}"}[world]
        assert json.loads((ships / "sft.json").read_text())["key"] == sft_key(cfg)
        assert cfg.copy_typed_text and cfg.constrained_decoding
        assert cfg.sim_surprises == {"popup": {"webshop": 0.4, "general": 0.5}[world],
                                     "sponsored": 0.3}
        v1 = load_config(configs / "paper_setting_v1.json", world=world)
        assert (v1.starting_policy, v1.sft_popup_back_share) == ("shipped", 0.0)
        # Web Shopping's third- and fourth-design start is the first design's (the shipped one)
        assert (sft_key(v1) == sft_key(cfg)) == (world == "webshop")
        v2 = load_config(configs / "paper_setting_v2.json", world=world)
        assert v2.sft_popup_back_share == 0.5 and sft_key(v2) not in (sft_key(v1), sft_key(cfg))
        v3 = load_config(configs / "paper_setting_v3.json", world=world)
        assert v3.sim_surprises == {"popup": 0.4, "sponsored": 0.3}
        assert v3.sft_popup_back_share == {"webshop": 0.0, "general": 0.35}[world]
        assert (sft_key(v3) == sft_key(cfg)) == (world == "webshop")  # only General changed
        # superseded: its General start is fine-tuned (shipped at the paper3 grids' commit)
        assert v3.starting_policy == {"webshop": "shipped", "general": "sft"}[world]
        assert v3.as_dict() | {"sft_popup_back_share": cfg.sft_popup_back_share,
                               "sim_surprises": cfg.sim_surprises,
                               "starting_policy": "shipped"} == cfg.as_dict()


def test_per_world_fields_of_a_config_file_apply_to_their_world_only(tmp_path):
    """A config file's per_world adds its world's fields under the overrides; a world it
    does not know, or a value that is not a dict of fields, is a ConfigError naming it."""
    from digirl_lite.errors import ConfigError
    from digirl_lite.train.config import load_config

    p = tmp_path / "c.json"
    p.write_text(json.dumps({"sft_popup_back_share": 0.35,
                             "per_world": {"webshop": {"sft_popup_back_share": 0.0}}}))
    assert load_config(p, world="webshop").sft_popup_back_share == 0.0
    assert load_config(p, world="general").sft_popup_back_share == 0.35
    assert load_config(p, world="webshop", sft_popup_back_share=0.5).sft_popup_back_share == 0.5
    p.write_text(json.dumps({"per_world": {"shopping": {"seed": 1}}}))
    with pytest.raises(ConfigError, match="per_world names unknown worlds"):
        load_config(p)
    p.write_text(json.dumps({"per_world": {"webshop": 0.0}}))
    with pytest.raises(ConfigError, match="per_world must map"):
        load_config(p)


def test_the_main_job_runs_the_paper_setting_on_its_own_budget():
    """Issue 47 item 6: the recipe's default config (no --config, no --quick) is
    recipes/configs/main.json: the paper setting (its base, paper_setting.json, per_world
    included) on the main job's budget; --quick stays the shipped world's smoke preset."""
    import argparse
    import runpy

    from digirl_lite.train.cli import config_from_args
    from digirl_lite.train.config import load_config

    recipe = runpy.run_path(str(ROOT / "recipes" / "offline_to_online.py"))
    main = recipe["MAIN_CONFIG"]
    assert main == ROOT / "recipes" / "configs" / "main.json"
    args = argparse.Namespace(config=None, quick=False, seed=None, world=None, set=[],
                              processes=1)
    for world in ("webshop", "general"):
        args.world = world
        cfg = config_from_args(args, default_config=main)
        paper = load_config(ROOT / "recipes" / "configs" / "paper_setting.json", world=world)
        budget = {"pile_size": 256, "offline_critic_updates": 100,
                  "offline_actor_updates": 100, "iterations": 10, "eval_every": 10}
        assert cfg.as_dict() == {**paper.as_dict(), **budget}
    args.world, args.quick = None, True
    quick = config_from_args(args, default_config=main)
    assert (quick.sim_layout, quick.copy_typed_text, quick.pile_size) == ("older", False, 24)


def test_a_config_file_may_build_on_a_base_file(tmp_path):
    """``"base"``: the fields of a file beside it, overridden by its own (per_world merged
    world by world); a missing base, a base that leads back to itself or one that is not a
    path is a ConfigError naming the file."""
    from digirl_lite.errors import ConfigError
    from digirl_lite.train.config import load_config

    (tmp_path / "a.json").write_text(json.dumps({
        "seed": 3, "iterations": 7,
        "per_world": {"general": {"sft_popup_back_share": 0.35, "seed": 4}}}))
    (tmp_path / "b.json").write_text(json.dumps({
        "base": "a.json", "iterations": 2, "per_world": {"general": {"seed": 5}}}))
    b = load_config(tmp_path / "b.json")
    assert (b.seed, b.iterations) == (3, 2)
    g = load_config(tmp_path / "b.json", world="general")
    assert (g.seed, g.iterations, g.sft_popup_back_share) == (5, 2, 0.35)
    (tmp_path / "c.json").write_text(json.dumps({"base": "none.json"}))
    with pytest.raises(ConfigError, match="no config file .*none.json .*the base of"):
        load_config(tmp_path / "c.json")
    (tmp_path / "a.json").write_text(json.dumps({"base": "b.json"}))
    with pytest.raises(ConfigError, match="its bases lead back to it"):
        load_config(tmp_path / "b.json")
    (tmp_path / "d.json").write_text(json.dumps({"base": 3}))
    with pytest.raises(ConfigError, match="base must be a config file's path"):
        load_config(tmp_path / "d.json")
