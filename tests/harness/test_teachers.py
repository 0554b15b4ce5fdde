"""DarwinX's teachers (issue 48, item 1): the default teacher acts from the screen alone, the
loop's evidence never reads the simulator's state, the state-reading expert only by a name
that says privileged."""

from __future__ import annotations

import dataclasses
import inspect
import io
import re
import tokenize

import pytest

from digirl_lite.actions import Action, ActionType, format_action
from digirl_lite.envs.sim.env import SimPhoneEnv
from digirl_lite.errors import ConfigError
from digirl_lite.harness import teachers
from digirl_lite.harness.evolve import EvolveConfig
from digirl_lite.harness.rules import goal_span
from digirl_lite.harness.teachers import TEACHERS, ScreenTeacher, make_teacher


class _Blind(SimPhoneEnv):
    """The simulated phone as a real device gives it: no ``obs.state``."""

    def reset(self, *args, **kwargs):
        obs, info = super().reset(*args, **kwargs)
        return dataclasses.replace(obs, state=None), info

    def step(self, action_text):
        obs, *rest = super().step(action_text)
        return (dataclasses.replace(obs, state=None), *rest)


class _BlindFactory:
    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs

    def __call__(self, slot: int = 0) -> _Blind:
        return _Blind(seed=slot, ui_tree=True, **self.kwargs)


class _NoState:
    """An observation whose ``state`` raises on access (every other field as given)."""

    def __init__(self, obs) -> None:
        self._obs = obs

    def __getattr__(self, name):
        return getattr(self._obs, name)

    @property
    def state(self):
        raise AssertionError("the teacher read obs.state")


def _play(world: str, n: int, layout: str = "older") -> list[bool]:
    tasks = [t.text for t in SimPhoneEnv._load_task_list(f"{world}_test")][:n]
    env = SimPhoneEnv(tasks=world, ui_tree=True, seed=0, layout=layout)
    out = []
    for i, task in enumerate(tasks):
        obs, _ = env.reset(task=task, seed=i)
        agent = ScreenTeacher()
        while True:
            obs, r, term, trunc, _ = env.step(agent.act(_NoState(obs)))
            if term or trunc:
                break
        out.append(r > 0)
    return out


@pytest.mark.slow
def test_the_screen_teacher_solves_most_test_tasks_of_both_worlds_and_fails_on_some():
    """Measured (first 96 test tasks, these seeds): Web Shopping 95/96, General 91/96 (an
    app named by another word, "gallery", "dialer"; searches that run out of the General
    horizon after voice input). Here the first tasks of each list, on state-raising
    observations: floors well below what it does, and General not all solved."""
    shop = _play("webshop", 12)
    general = _play("general", 28)
    assert sum(shop) >= 8
    assert 16 <= sum(general) < len(general)


def test_the_screen_teacher_names_no_simulator_element_site_or_app():
    from digirl_lite.envs.sim import screen, world
    from digirl_lite.envs.sim.catalog import APPS, SITES

    src = inspect.getsource(teachers)
    # the screens' elements are laid out in envs/sim/screen.py (world.py re-exports it)
    ids = set(re.findall(r'Element\(\s*f?"([^"{]+)', inspect.getsource(screen)))
    ids |= {n.id for n in world.ui_nodes(world.initial_state(1, "older")) if n.id}
    names = {t.lower() for a in APPS.values() for t in (a.key, a.label, *a.aliases)}
    names |= {t.lower() for s in SITES.values() for t in (s.key, s.domain, s.title)}
    assert len(ids) > 20 and {"chrome", "ebay.com", "settings", "dialer"} <= names
    # the code's strings and names (docstrings and comments are prose about phones)
    toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    code = []
    for i, t in enumerate(toks):
        if t.type == tokenize.STRING:
            prev = next((p for p in reversed(toks[:i]) if p.type not in (
                tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                tokenize.COMMENT)), None)
            if prev is None or prev.string == ":":  # a docstring
                continue
            code.append(t.string.lower())
        elif t.type == tokenize.NAME:
            code.append(t.string.lower())
    words = {w for c in code for w in re.findall(r"[a-z0-9]+", c)}
    named = [i for i in ids if any(i.lower() in c for c in code)]
    assert not named, f"the teacher names simulator element ids {named}"
    named = [n for n in names if n in words or (not n.isalnum() and any(n in c for c in code))]
    assert not named, f"the teacher names apps or sites {named}"


def test_goal_span_reads_any_quotes_verbs_and_questions():
    assert goal_span("Go to ebay.com, search for 'apple airpods'") == "apple airpods"
    assert goal_span('Go to x.com, search for "a b", and select the first entry') == "a b"
    assert goal_span("At ebay.com, look up a crucial mx500 ssd") == "crucial mx500 ssd"
    assert goal_span("look up sony wh-1000xm4 on costco.com and open the top result") == \
        "sony wh-1000xm4"
    assert goal_span("Google the capital of Egypt") == "capital of Egypt"
    assert goal_span("What time does Denny's close?") == "What time does Denny's close"
    assert goal_span("How much does the Google Nest Hub cost?") == \
        "How much does the Google Nest Hub cost"
    assert goal_span("Open the Settings") is None


@pytest.mark.slow
def test_the_loop_s_collection_and_evidence_run_without_obs_state(tmp_path):
    """The default teacher and the loop's evidence on phones that give no ``obs.state``
    (as a real device): the teacher solves what the agent never did, and its episodes
    become teacher evidence with the screens' trees, which the proposer turns into rules."""
    from digirl_lite.harness.darwinx import DarwinX
    from digirl_lite.harness.harness import Harness, HarnessAgent
    from digirl_lite.harness.proposers import ScriptedProposer
    from digirl_lite.harness.runner import HarnessRunner, evidence_from
    from digirl_lite.rollout.fleet import SyncFleet

    class Home:  # the frozen agent: it never solves a task
        def propose(self, inputs):
            return [format_action(Action.key(ActionType.PRESS_HOME))] * len(inputs)

        retry = propose

    assert EvolveConfig().teacher == "screen"  # the default of the recipe's config
    teacher = make_teacher(EvolveConfig().teacher)
    fleet = SyncFleet(_BlindFactory(tasks="webshop"), 2, backend="local")
    runner = HarnessRunner(lambda c, s: HarnessAgent(c, Home()), fleet, None, teacher,
                           seed_torch=False)
    tasks = ['Go to ebay.com, search for "desk lamp"', "Go to target.com"]
    outs = runner.run(Harness().components, tasks, 7)
    teach = runner.run_teacher(tasks, 7)
    assert all(o.success is False for o in outs) and all(o.success for o in teach)
    ev = evidence_from(outs, teach)
    assert {e.kind for e in ev} == {"failure", "teacher"}
    assert all(s.tree for e in ev for s in e.steps)  # trees from what the agent saw
    cands = ScriptedProposer().candidates(ev)
    assert any('"teach-type-' in c for _, c in cands)
    archive = DarwinX(runner, ScriptedProposer(), tasks, tmp_path / "dx", budget=30,
                      k_screen=1, k_confirm=1, probe_k=1, seed=0).run()
    judged = [e["content"] for n in archive.nodes for e in n.edits]
    assert any('"teach-' in c for c in judged)  # the teacher's rules reached the gate
    fleet.close()


def test_a_phone_without_privileged_state_gives_no_obs_state():
    env = SimPhoneEnv(tasks="webshop", ui_tree=True, privileged_state=False)
    obs, _ = env.reset(task="Go to ebay.com", seed=0)
    assert obs.state is None and obs.ui_tree
    obs, *_ = env.step(format_action(Action.key(ActionType.PRESS_HOME)))
    assert obs.state is None and env.state is not None  # the phone itself still has one
    obs, _ = SimPhoneEnv(tasks="webshop").reset(task="Go to ebay.com", seed=0)
    assert obs.state is not None  # elsewhere (the scripted experts' demonstrations) as before


@pytest.mark.slow
def test_the_recipe_s_default_path_runs_with_no_obs_state(tmp_path, monkeypatch):
    """Issue 48, "Done when": the recipe's quick run (here smaller) with its defaults puts
    no simulator state on any observation, and it completes on phones that give none at
    all (as a real device): the frozen policy, the screen teacher, the evidence, the
    proposer and the evolved harness's evaluation never needed it."""
    from digirl_lite.harness.evolve import QUICK, run_evolution

    made: list[bool] = []
    observe = SimPhoneEnv._observe

    def no_state(self):
        obs, blanks = observe(self)
        made.append(obs.state is not None)
        return dataclasses.replace(obs, state=None), blanks  # a real device: none at all

    monkeypatch.setattr(SimPhoneEnv, "_observe", no_state)
    cfg = EvolveConfig(**{**QUICK, "budget": 8, "evo_tasks": 2, "eval_tasks": 2,
                          "k_screen": 1, "k_confirm": 1, "probe_k": 1, "n_envs": 2})
    assert (cfg.teacher, cfg.evidence) == ("screen", ("failure", "self", "teacher"))
    s = run_evolution(cfg, tmp_path, log=lambda *a: None)
    assert set(s["stages"]) == {"frozen", "frozen_constrained", "evolved"}
    assert s["evolution"]["generations"] >= 1 and s["stages"]["evolved"]["judged_episodes"] == 2
    assert made and not any(made)  # the default path's phones made no obs.state
    assert "screen-only teacher" in (tmp_path / "report.md").read_text()
    # only the privileged teacher's phones carry it
    assert teachers.reads_state("privileged_expert") and not any(
        teachers.reads_state(t) for t in TEACHERS if t != "privileged_expert")


def test_teacher_choices_and_an_unknown_one():
    assert TEACHERS == ("screen", "privileged_expert", "none")
    assert make_teacher("none") is None
    for name in ("screen", "privileged_expert"):
        assert hasattr(make_teacher(name), "act_batch")
    with pytest.raises(ConfigError, match="teacher.*'expert'.*privileged_expert"):
        EvolveConfig(teacher="expert").check()
    with pytest.raises(ValueError, match="not one of"):
        make_teacher("expert")


@pytest.mark.slow
def test_a_cached_run_does_not_hand_one_teacher_s_episodes_to_another(tmp_path):
    """The runner's cache keys the teacher's episodes by the teacher: a run folder resumed
    with another ``teacher`` plays them again instead of reusing the other's."""
    from digirl_lite.envs.sim.env import SimEnvFactory
    from digirl_lite.harness.runner import HarnessRunner
    from digirl_lite.rollout.fleet import SyncFleet

    tasks = ['Go to ebay.com, search for "logitech g203"']
    cache = tmp_path / "episodes.jsonl"
    fleet = SyncFleet(SimEnvFactory(tasks="webshop", ui_tree=True), 1, backend="local")
    played: dict[str, list[int]] = {}
    for name in ("screen", "privileged_expert", "screen"):
        runner = HarnessRunner(lambda c, s: None, fleet, cache, make_teacher(name),
                               seed_torch=False)
        runner.run_teacher(tasks, 3)
        played[name] = played.get(name, []) + [runner.episodes_run]
    fleet.close()
    assert played == {"screen": [1, 0], "privileged_expert": [1]}
