"""The stored pile and the demonstrations: deterministic from a seed, and what they hold."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from needs import aitw_file

from digirl_lite.data import Ending, load_trajectories
from digirl_lite.envs.sim import SimPhoneEnv
from digirl_lite.envs.sim.demos import generate_demos, generate_pile
from digirl_lite.rollout import RECORD_SIZE

ROOT = Path(__file__).resolve().parents[2]


def _content(trajs):
    """Everything but wall-clock timings."""
    return [(t.traj_id, t.task, t.ending, t.final_reward, t.seeds,
             [(s.prompt, s.action_text, s.reward, s.done, s.screen_id, s.next_screen_id,
               s.mc_return, s.verdict) for s in t.steps]) for t in trajs]


@pytest.mark.slow
def test_pile_is_deterministic_in_its_seed():
    a, sa, stats_a = generate_pile("webshop", n=16, seed=3)
    b, sb, _ = generate_pile("webshop", n=16, seed=3)
    assert _content(a) == _content(b)
    assert sa.ids == sb.ids
    c, _, _ = generate_pile("webshop", n=16, seed=4)
    assert [t.steps for t in c] != [t.steps for t in a]
    assert stats_a.trajectories == 16
    assert stats_a.steps == sum(len(t) for t in a)
    assert all(t.source.value == "offline" and t.horizon == 20 for t in a)
    assert {t.ending for t in a} <= {Ending.SUCCESS, Ending.AGENT_STOP, Ending.BUDGET}


@pytest.mark.slow
def test_pile_failures_come_mostly_from_surprises():
    trajs, _, stats = generate_pile("webshop", n=60, seed=0)
    failures = sum(not t.is_success for t in trajs)
    assert 0.05 <= stats.success_rate <= 0.35
    # the copier fails by not recovering from pop-ups and voice input, as in the paper
    assert stats.failures_after_surprise > 0.7 * failures
    assert stats.surprises_seen.get("popup", 0) > 0


@pytest.mark.slow
def test_demos_are_clean_expert_successes():
    trajs, screens, stats = generate_demos("general", n=12, seed=1)
    assert stats.success_rate == 1.0 and stats.surprises_seen == {}
    assert all(t.is_success and t.horizon == 10 for t in trajs)
    for sid in screens.ids:
        assert screens.image(sid).size == RECORD_SIZE


@pytest.mark.slow
def test_slipping_demonstrators_take_detours_and_recover():
    """sft_slip_rate's demonstrations (issue 16, item 6): the demonstrator slips (a step that
    is not the expert's) and recovers, so its successes on the same tasks are longer than the
    clean ones and hold off-plan steps, which clean demonstrations never do; rate 0 is the
    clean expert exactly, and the rate keys the starting policy."""
    from digirl_lite.envs.sim.agents import expert_action
    from digirl_lite.envs.sim.tasks import parse_task
    from digirl_lite.train.config import sim_webshop
    from digirl_lite.train.starting import sft_key
    from digirl_lite.viz.regrading import replay_states

    def off_plan(t):
        states = replay_states(t, surprises={"popup": 0, "consent": 0, "voice": 0,
                                             "reorder": 0, "blank": 0})
        task = parse_task(t.task)
        return sum(s.action != expert_action(st, task) for st, s in zip(states, t.steps))

    clean, _, _ = generate_demos("webshop", n=30, seed=2)
    same, _, _ = generate_demos("webshop", n=30, seed=2, slip_rate=0.0)
    assert _content(same) == _content(clean)
    slipped, _, stats = generate_demos("webshop", n=30, seed=2, slip_rate=0.15)
    assert [t.task for t in slipped] == [t.task for t in clean]
    assert stats.success_rate >= 0.8  # it recovers (a few run out of the 20 steps)
    assert all(off_plan(t) == 0 for t in clean)
    longer = 0
    for a, b in zip(clean, slipped):
        if b.is_success:
            assert len(b) >= len(a)
            if len(b) > len(a):
                longer += 1
                assert off_plan(b) >= 1
    assert longer >= 5
    assert sft_key(sim_webshop(sft_slip_rate=0.1)) != sft_key(sim_webshop())
    with pytest.raises(ValueError, match="sft_slip_rate must be a probability"):
        sim_webshop(sft_slip_rate=1.5)


@pytest.mark.slow
def test_make_pile_recipe_writes_loadable_stores(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "recipes"))
    try:
        import make_pile
    finally:
        sys.path.pop(0)
    report = make_pile.main(["--world", "general", "--n", "10", "--demos", "5", "--seed", "2",
                             "--out", str(tmp_path)])
    root = tmp_path / "general-seed2"
    pile, _ = load_trajectories(root / "pile")
    demos, _ = load_trajectories(root / "demos")
    assert len(pile) == 10 and len(demos) == 5
    assert _content(pile) == _content(generate_pile("general", n=10, seed=2)[0])
    assert json.loads((root / "stats.json").read_text())["pile"]["trajectories"] == 10
    assert report["demos"]["success_rate"] == 1.0
    with pytest.raises(SystemExit, match="already exists"):
        make_pile.main(["--world", "general", "--n", "10", "--demos", "5", "--seed", "2",
                        "--out", str(tmp_path)])


@pytest.mark.aitw
def test_real_aitw_lists_run_in_the_simulator():
    env = SimPhoneEnv(aitw_file("webshop_test.txt"))
    assert len(env.tasks) == 360
    general = SimPhoneEnv(aitw_file("general_test.txt"), skip_unsupported=True)
    assert 0.75 * 432 <= len(general.tasks) < 432
    obs, info = env.reset(seed=0)
    assert obs.task in {t.text for t in env.tasks}


@pytest.mark.slow
def test_varied_products_make_new_searchable_tasks():
    """Demonstrations on new products: the quoted product is replaced, the rest of the task
    kept, and the expert still solves them."""
    from digirl_lite.envs.sim.drills import vary_products
    from digirl_lite.envs.sim.tasks import load_task_file, parse_task
    from digirl_lite.paths import data_dir

    base = load_task_file(data_dir() / "tasks" / "webshop_train.txt")
    varied = vary_products(base, 200, seed=3)
    assert varied == vary_products(base, 200, seed=3)  # deterministic
    quoted = [parse_task(t).query for t in varied if parse_task(t).query]
    train_products = {parse_task(t).query for t in base if parse_task(t).query}
    assert len(quoted) > 100 and len(set(quoted) - train_products) > 0.9 * len(set(quoted))
    trajs, _, stats = generate_demos("webshop", n=20, seed=3, varied_products=True)
    assert stats.success_rate == 1.0
    assert not {t.task for t in trajs} <= set(base)


def test_copy_drills_ask_for_new_products_and_target_them():
    """Each drill's goal quotes the product it targets; products are new (not the train
    list's), vary, and the stream is reproducible from its seed."""
    from itertools import islice

    from digirl_lite.envs.sim.drills import copy_drills
    from digirl_lite.envs.sim.tasks import load_task_file, parse_task
    from digirl_lite.paths import data_dir
    from digirl_lite.prompts import task_from_prompt

    drills = list(islice(copy_drills(seed=4), 300))
    assert drills == list(islice(copy_drills(seed=4), 300))
    assert drills != list(islice(copy_drills(seed=5), 300))
    train = {parse_task(t).query for t in load_task_file(data_dir() / "tasks" /
                                                         "webshop_train.txt")}
    for prompt, product in drills:
        task = task_from_prompt(prompt)
        assert parse_task(task).query == product
        assert prompt.startswith("Previous Actions: Goal: ")
    products = [p for _, p in drills]
    assert len(set(products)) > 290 and not set(products) & train


@pytest.mark.slow
def test_general_varies_the_names_in_its_searches():
    """General's demonstrations and drills name places, shops and landmarks beyond its train
    list (every held-out search names one that no train task does): searches get new names,
    other tasks are kept, the expert still solves them, and each drill targets its query."""
    from itertools import islice

    from digirl_lite.envs.sim.drills import copy_drills, vary_queries
    from digirl_lite.envs.sim.tasks import load_task_file, parse_task
    from digirl_lite.paths import data_dir
    from digirl_lite.prompts import task_from_prompt

    base = load_task_file(data_dir() / "tasks" / "general_train.txt")
    varied = vary_queries(base, 200, seed=3)
    assert varied == vary_queries(base, 200, seed=3)
    kinds = [parse_task(t).kind for t in varied]
    new = [t for t in varied if t not in base]
    assert all(parse_task(t).kind == "search" for t in new)
    assert len(new) > 0.6 * kinds.count("search")
    assert {t for t, k in zip(varied, kinds) if k == "open_app"} <= set(base)
    trajs, _, stats = generate_demos("general", n=20, seed=3, varied_products=True)
    assert stats.success_rate == 1.0 and not {t.task for t in trajs} <= set(base)

    drills = list(islice(copy_drills(seed=4, world="general"), 200))
    assert drills == list(islice(copy_drills(seed=4, world="general"), 200))
    train = {parse_task(t).query for t in base}
    for prompt, query in drills:
        assert parse_task(task_from_prompt(prompt)).query == query
    assert len({q for _, q in drills} - train) > 100


@pytest.mark.slow
def test_demonstrators_close_a_share_of_pop_ups_with_back():
    """sft_popup_back_share (issue 47): the demonstrator closes that share of pop-ups with
    BACK rather than their X (people close a dialog either way), and still succeeds; share 0
    is the expert exactly; the share keys the starting policy and must be a probability."""
    from digirl_lite.actions import ActionType
    from digirl_lite.envs.sim.world import Surprises
    from digirl_lite.train.config import sim_webshop
    from digirl_lite.train.starting import sft_key
    from digirl_lite.viz.regrading import replay_states

    rates = {"popup": 0.6, "consent": 0.0, "voice": 0.0, "reorder": 0.0, "blank": 0.0}

    def closes(trajs):  # how each pop-up the phone showed was closed: BACK or a tap
        out = {"back": 0, "tap": 0}
        for t in trajs:
            states = replay_states(t, surprises=rates)
            for st, s in zip(states, t.steps):
                if st.overlay == "popup":
                    back = s.action.action_type == ActionType.PRESS_BACK
                    out["back" if back else "tap"] += 1
        return out

    kw = {"world": "general", "n": 40, "seed": 5, "surprises": Surprises(**rates),
          "surprise_rate": 1.0}
    clean, _, _ = generate_demos(**kw)
    assert _content(generate_demos(**kw, popup_back_share=0.0)[0]) == _content(clean)
    assert closes(clean)["back"] == 0 and closes(clean)["tap"] >= 10
    mixed, _, stats = generate_demos(**kw, popup_back_share=0.5)
    got = closes(mixed)
    assert got["back"] >= 5 and got["tap"] >= 5, got
    assert stats.success_rate >= 0.95
    assert sft_key(sim_webshop(sft_popup_back_share=0.5)) != sft_key(sim_webshop())
    with pytest.raises(ValueError, match="sft_popup_back_share must be a probability"):
        sim_webshop(sft_popup_back_share=1.5)
