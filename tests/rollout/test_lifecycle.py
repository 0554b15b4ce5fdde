"""The task lifecycle and the reset between episodes (spec/DARWIN.md A.2, A.3) on the
simulated phone, in single episodes and in a fleet; the config fields that set them. The
Android side runs against the Appium server in tests/envs/test_android.py."""

from __future__ import annotations

import json

import pytest

from digirl_lite.actions import Action, ActionType, format_action
from digirl_lite.data.records import Ending, ScreenTable
from digirl_lite.envs.lifecycle import DeviceCommand, PhaseFailed, device_commands, hard_reset_due
from digirl_lite.envs.sim import (
    ScriptedExpert,
    SimEnvFactory,
    SimPhase,
    SimPhoneEnv,
    Surprises,
    load_tasks,
    parse_task,
    task_with_phases,
)
from digirl_lite.errors import ConfigError
from digirl_lite.rollout import ScriptedBatchAgent, SyncFleet, run_episode

NONE = Surprises.none()
COMPLETE = format_action(Action.key(ActionType.STATUS_TASK_COMPLETE))
HOME = format_action(Action.key(ActionType.PRESS_HOME))
SEARCH = "Go to bestbuy.com, search for 'usb cable'"


def _expert_episode(env: SimPhoneEnv, obs):
    """The scripted expert from ``obs`` to the episode's end: the last observation, the last
    reward and every step's info."""
    agent, infos = ScriptedExpert(), []
    while True:
        obs, r, term, trunc, info = env.step(agent.act(obs))
        infos.append(info)
        if term or trunc:
            return obs, r, infos


def test_hard_reset_due_every_k_episodes():
    assert [hard_reset_due(n, 3) for n in range(6)] == [False] * 3 + [True] * 3
    assert not any(hard_reset_due(n, 0) for n in range(10))
    assert all(hard_reset_due(n, 1) for n in range(1, 10))
    with pytest.raises(ValueError):
        hard_reset_due(-1, 2)


def test_a_setup_starts_the_task_where_it_says_and_the_expert_finishes_it():
    task = task_with_phases({"task": SEARCH, "setup": {"site": "bestbuy", "typed": "usb"}})
    env = SimPhoneEnv([task], surprises=NONE)
    obs, info = env.reset()
    assert info["setup"] == "done" and info["reset"] == "hard"
    s = obs.state
    assert (s.page.site, s.page.kind, s.focus, s.typed) == ("bestbuy", "shop_home",
                                                             "search_box", "usb")
    # the same task without its setup starts on the launcher
    plain, _ = SimPhoneEnv([SEARCH], surprises=NONE).reset()
    assert plain.state.page.kind == "launcher" and plain.screen_id != obs.screen_id
    # from there an expert needs fewer steps than from the launcher
    traj = run_episode(env, ScriptedExpert(), ScreenTable(), traj_id="t")
    full = run_episode(SimPhoneEnv([SEARCH], surprises=NONE), ScriptedExpert(), ScreenTable(),
                       traj_id="u")
    assert traj.ending is Ending.SUCCESS and full.ending is Ending.SUCCESS
    assert len(traj) < len(full)


def test_setup_on_a_product_page_and_on_google_results():
    s = SimPhoneEnv([task_with_phases({
        "task": "Go to ebay.com, search for 'lamp', and select the first entry",
        "setup": {"site": "ebay", "query": "lamp", "item": 0}})], surprises=NONE)
    obs, info = s.reset()
    assert obs.state.page.kind == "shop_product" and info["success"]  # done before a step
    g = SimPhoneEnv([task_with_phases({"task": "What is the capital of France?",
                                       "setup": {"query": "capital of france"}})],
                    surprises=NONE)
    obs, _ = g.reset()
    assert obs.state.page.kind == "google_results" and obs.state.page.query == \
        "capital of france"


@pytest.mark.parametrize("bad", [
    {"site": "nowhere.com"}, {"app": "chrome", "site": "ebay"}, {"item": 1},
    {"site": "ebay", "query": "x", "item": 8}, {"typed": "x"}, {"colour": "red"},
])
def test_bad_phases_raise_naming_what(bad):
    with pytest.raises(ValueError, match="setup"):
        task_with_phases({"task": "Go to ebay.com", "setup": bad})


def test_a_failing_setup_is_an_infrastructure_truncation_naming_the_phase():
    task = task_with_phases({"task": SEARCH, "setup": {"site": "bestbuy"}})
    env = SimPhoneEnv([task], surprises=NONE, faults={"setup_failure": 1.0})
    with pytest.raises(PhaseFailed) as e:
        env.reset()
    assert e.value.phase == "setup" and "setup phase failed" in str(e.value)
    with pytest.raises(RuntimeError, match="call reset"):  # no execution without a setup
        env.step(COMPLETE)
    traj = run_episode(env, ScriptedExpert(), ScreenTable(), traj_id="t", seed=3)
    assert traj.ending is Ending.INFRA and not traj.steps
    assert traj.truncation_reason.startswith("setup phase failed")
    assert not traj.is_usable and traj.final_reward == 0.0
    # a task without a setup never draws the fault
    ok = run_episode(SimPhoneEnv([SEARCH], surprises=NONE, faults={"setup_failure": 1.0}),
                     ScriptedExpert(), ScreenTable(), traj_id="u")
    assert ok.ending is Ending.SUCCESS


def test_a_failing_setup_in_a_fleet_is_infra_and_not_counted_against_the_agent():
    task = task_with_phases({"task": SEARCH, "setup": {"site": "bestbuy"}})
    make = SimEnvFactory(tasks=[task], surprises=NONE, faults={"setup_failure": 1.0})
    with SyncFleet(make, 2) as fleet:
        eps = fleet.collect(ScriptedBatchAgent(lambda s: ScriptedExpert()), [task] * 3,
                            ScreenTable(), id_prefix="f")
    trajs = [e.trajectory for e in eps]
    assert [t.ending for t in trajs] == [Ending.INFRA] * 3
    assert all("setup phase failed" in t.truncation_reason for t in trajs)
    assert not any(t.is_usable for t in trajs)


def test_teardown_runs_after_the_execution_and_not_before():
    task = task_with_phases({"task": "Go to ebay.com", "teardown": {"home": True}})
    env = SimPhoneEnv([task], surprises=NONE)
    obs, r, infos = _expert_episode(env, env.reset()[0])
    info = infos[-1]
    assert not any("teardown" in i for i in infos[:-1])
    # the agent's last screen is the shop (success); the teardown then took the phone home
    assert r == 1.0 and obs.state.page.site == "ebay"
    assert info["teardown"] == "done" and env.state.page.kind == "launcher"
    assert "ebay" in env.state.sites_seen  # home keeps the state


def test_teardown_runs_after_a_failure_too_but_not_after_an_infra_fault():
    task = task_with_phases({"task": "Go to ebay.com", "setup": {"site": "target"},
                             "teardown": {"forget_sites": True}})
    env = SimPhoneEnv([task], surprises=NONE)
    env.reset()
    *_, r, term, _, info = env.step(COMPLETE)  # a wrong stop: the agent's failure
    assert term and r == 0.0 and info["teardown"] == "done" and env.state.sites_seen == ()
    crash = SimPhoneEnv([task], surprises=NONE, faults={"crash": 1.0})
    crash.reset()
    *_, trunc, info = crash.step(COMPLETE)
    assert trunc and info["truncation"] == "infrastructure" and "teardown" not in info
    assert crash.state.sites_seen == ("target",)


def test_a_failed_teardown_keeps_the_outcome_and_makes_the_next_reset_hard():
    task = task_with_phases({"task": "Go to ebay.com", "teardown": {"home": True}})
    env = SimPhoneEnv([task], surprises=NONE, faults={"teardown_failure": 1.0},
                      hard_reset_every=0)
    _, r, infos = _expert_episode(env, env.reset()[0])
    assert r == 1.0 and infos[-1]["teardown"].startswith("failed")
    _, info = env.reset()
    assert info["reset"] == "hard" and env.state.sites_seen == ()
    _, info = env.reset()
    assert info["reset"] == "minimal"


def _visit(env: SimPhoneEnv, site_task: str, seed: int):
    """One episode that opens ``site_task``'s site; returns the reset info."""
    obs, info = env.reset(task=site_task, seed=seed)
    return info, _expert_episode(env, obs)[0]


def test_minimal_reset_keeps_the_sites_seen_and_a_hard_reset_every_k_clears_them():
    # consent banners always show on a site's first visit: kept state means no banner
    sur = Surprises(popup=0.0, consent=1.0, voice=0.0, reorder=0.0, blank=0.0)
    env = SimPhoneEnv(["Go to ebay.com"], surprises=sur, hard_reset_every=3)
    kinds, banners = [], []
    for i in range(7):
        info, obs = _visit(env, "Go to ebay.com", seed=i)
        kinds.append(info["reset"])
        assert obs.state.page.site == "ebay" and info["success"] is False
        banners.append(obs.state.overlay == "consent")
        assert env.state.sites_seen == ("ebay",)
    assert kinds == ["hard", "minimal", "minimal", "hard", "minimal", "minimal", "hard"]
    assert banners == [k == "hard" for k in kinds]  # the banner comes back after a hard reset
    # on the launcher after a minimal reset, with the day option applied
    obs, info = env.reset(task="Go to ebay.com", options={"day": 5})
    assert info["reset"] == "minimal" and obs.state.page.kind == "launcher"
    assert obs.state.day == 5 and obs.state.sites_seen == ("ebay",)


def test_default_every_episode_is_a_hard_reset_as_before():
    sur = Surprises(popup=0.0, consent=1.0, voice=0.0, reorder=0.0, blank=0.0)
    env = SimPhoneEnv(["Go to ebay.com"], surprises=sur)
    for i in range(3):
        info, obs = _visit(env, "Go to ebay.com", seed=i)
        assert info["reset"] == "hard" and obs.state.overlay == "consent"
    with pytest.raises(ValueError, match="hard_reset_every"):
        SimPhoneEnv(["Go to ebay.com"], hard_reset_every=-1)


def test_task_files_hold_tasks_with_phases(tmp_path):
    f = tmp_path / "tasks.txt"
    f.write_text("Go to ebay.com\n" + json.dumps(
        {"task": SEARCH, "setup": {"site": "bestbuy"}, "teardown": {"home": True}}) + "\n")
    tasks = load_tasks(f)
    assert tasks[0] == parse_task("Go to ebay.com") and tasks[0].setup is None
    assert tasks[1].setup == SimPhase(site="bestbuy") and tasks[1].teardown.home
    f.write_text('{"task": "Go to ebay.com", "setup": {"site": "ebay"}, "extra": 1}\n')
    with pytest.raises(ValueError, match=r"tasks.txt:1: unknown keys \['extra'\]"):
        load_tasks(f)
    from digirl_lite.envs.sim.tasks import load_task_file

    with pytest.raises(ValueError, match="the simulator's"):
        load_task_file(f)


def test_device_commands_parse_and_name_what_is_wrong():
    cmds = device_commands([{"tap": [10, 20]}, {"swipe": [1, 2, 3, 4]}, {"key": 3},
                            {"back": True}, {"script": "fake: setThing",
                                             "args": {"thing": "x"}, "expect": None}])
    assert [c.kind for c in cmds] == ["tap", "swipe", "key", "back", "script"]
    assert cmds[0] == DeviceCommand("tap", points=(10, 20))
    for bad, what in [({"tap": [1]}, "2 pixel"), ({"tap": [1, 2], "key": 3}, "exactly one"),
                      ({"key": "3"}, "keycode"), ({"tap": [1, 2], "args": {"a": 1}}, "args"),
                      ("tap", "JSON object")]:
        with pytest.raises(ValueError, match=what):
            device_commands([{"key": 3}, bad], "android.setup")
    with pytest.raises(ValueError, match=r"android.setup\[1\]"):
        device_commands([{"key": 3}, {"tap": [1]}], "android.setup")


def test_config_fields_are_checked_before_any_work():
    from digirl_lite.train import DigiRLConfig

    assert DigiRLConfig().hard_reset_every is None
    with pytest.raises(ConfigError, match="hard_reset_every must be >= 0"):
        DigiRLConfig(hard_reset_every=-2)
    devices = {"devices": ["http://127.0.0.1:4723"]}
    with pytest.raises(ConfigError, match="android.hard_reset is not set"):
        DigiRLConfig(env="android", android=devices, hard_reset_every=5)
    with pytest.raises(ConfigError, match="'snapshot' resets every episode"):
        DigiRLConfig(env="android", android={"emulators": {"avd": "a"}}, hard_reset_every=5)
    with pytest.raises(ConfigError, match="fleet='process'"):
        DigiRLConfig(env="android", fleet="process", hard_reset_every=5,
                     android={"emulators": {"avd": "a"}, "reset": "home"})
    DigiRLConfig(env="android", hard_reset_every=5,
                 android={**devices, "hard_reset": [{"script": "mobile: shell",
                                                     "args": {"command": "pm"}}]})
    from digirl_lite.envs.setup import android_plan

    plan = android_plan({**devices, "setup": [{"tap": [5, 5]}], "teardown": [{"key": 4}]})
    assert plan.setup == (DeviceCommand("tap", points=(5, 5)),)
    assert plan.teardown == (DeviceCommand("key", keycode=4),)
    with pytest.raises(ConfigError, match=r"android.teardown\[0\]"):
        android_plan({**devices, "teardown": [{"tap": "here"}]})
    with pytest.raises(ConfigError, match="android.hard_reset: emulators"):
        android_plan({"emulators": {"avd": "a"}, "hard_reset": [{"key": 3}]})


def test_make_phones_passes_hard_reset_every_to_the_simulator():
    from digirl_lite.envs.setup import make_phones
    from digirl_lite.train import DigiRLConfig

    phones = make_phones(DigiRLConfig(hard_reset_every=4), seed=0)
    assert phones.make_env(0).hard_reset_every == 4
    assert make_phones(DigiRLConfig(), seed=0).make_env(0).hard_reset_every == 1
