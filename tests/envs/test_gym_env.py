"""The simulated phone as a Gymnasium environment (issue 31, item 1): registered on import,
``check_env`` on both worlds, vector environments, the structured action space, rewards and
endings, and bad input."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import digirl_lite
from digirl_lite.actions import Action, format_action

WEBSHOP_TASK = "Go to ebay.com, search for 'logitech g910'"


@pytest.mark.slow
@pytest.mark.parametrize("env_id", sorted(digirl_lite.GYM_IDS))
@pytest.mark.parametrize("ui_tree", [False, True])
def test_check_env_passes_on_both_worlds(env_id, ui_tree):
    env = gym.make(env_id, ui_tree=ui_tree, render_mode="rgb_array", screen_size=(96, 48))
    check_env(env.unwrapped, skip_render_check=False)
    obs, info = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    assert obs["screenshot"].shape == (96, 48, 3) and obs["screenshot"].dtype == np.uint8
    assert obs["goal"] == info["task"] and obs["goal"] in obs["prompt"] and obs["step"] == 0
    assert ("ui_tree" in obs) == ui_tree
    if ui_tree:
        assert "clickable" in obs["ui_tree"]
    frame = env.render()
    assert frame.shape == (96, 48, 3) and np.array_equal(frame, obs["screenshot"])
    env.close()


@pytest.mark.slow
def test_make_works_from_a_fresh_interpreter_with_only_the_import():
    code = ("import gymnasium as gym, digirl_lite; e = gym.make('digirl_lite/SimPhone-v0'); "
            "o, i = e.reset(seed=0); print(o['screenshot'].shape, type(e.unwrapped).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.split() == ["(456,", "216,", "3)", "SimPhoneGymEnv"]


@pytest.mark.slow
def test_an_expert_episode_ends_terminated_with_the_ground_truth_reward():
    """The scripted expert drives the Gymnasium env to success: reward 1 on the last step,
    terminated (not truncated), info's ground truth agrees."""
    from digirl_lite.envs.sim.agents import ScriptedExpert

    env = gym.make("digirl_lite/SimPhone-v0", task=WEBSHOP_TASK)
    obs, info = env.reset(seed=0)
    expert = ScriptedExpert()
    total, steps = 0.0, 0
    terminated = truncated = False
    while not (terminated or truncated):
        text = expert.act(env.unwrapped.sim._obs)
        obs, reward, terminated, truncated, info = env.step(text)
        total += reward
        steps += 1
    assert terminated and not truncated and info["success"] is True and total == 1.0
    assert obs["step"] == steps and info["verdict"] == "success"


def test_unparseable_actions_are_steps_not_exceptions_and_the_budget_truncates():
    env = gym.make("digirl_lite/SimPhone-v0", task=WEBSHOP_TASK, horizon=3)
    obs, _ = env.reset(seed=1)
    for k, bad in enumerate(["tap the button please", "", "Action Type: DUAL_POINT"]):
        obs, reward, terminated, truncated, info = env.step(bad)
        assert reward == 0.0 and not terminated and info["invalid_reason"]
        assert info["action"] is None and obs["step"] == k + 1
    assert truncated and info["truncation"] == "budget"
    assert "Previous Actions: " in obs["prompt"]


@pytest.mark.slow
def test_the_structured_action_space():
    env = gym.make("digirl_lite/SimPhone-v0", task=WEBSHOP_TASK, action_space="structured")
    check_env(env.unwrapped)
    env.reset(seed=0)
    types = list(env.unwrapped.action_space["action_type"].n * [None])
    assert len(types) == 7
    from digirl_lite.envs.sim.gym import ACTION_TYPES

    home = {"action_type": ACTION_TYPES.index("PRESS_HOME"),
            "touch_point": np.zeros(2, np.float32), "lift_point": np.zeros(2, np.float32),
            "typed_text": ""}
    _, _, _, _, info = env.step(home)
    assert info["action"] == format_action(Action("PRESS_HOME")) and not info["invalid_reason"]
    tap = dict(home, action_type=ACTION_TYPES.index("DUAL_POINT"),
               touch_point=np.array([0.5, 0.25], np.float32),
               lift_point=np.array([0.5, 0.25], np.float32))
    _, _, _, _, info = env.step(tap)
    assert info["action"] == format_action(Action.tap(x=0.25, y=0.5))
    # a TYPE with no text is not an action: an unparseable step, not an exception
    _, reward, _, _, info = env.step(dict(home, action_type=ACTION_TYPES.index("TYPE")))
    assert reward == 0.0 and info["invalid_reason"] and info["action"] is None


@pytest.mark.slow
def test_vector_environments():
    envs = gym.make_vec("digirl_lite/SimPhone-v0", num_envs=3, screen_size=(64, 32))
    obs, info = envs.reset(seed=[0, 1, 2])
    assert obs["screenshot"].shape == (3, 64, 32, 3) and len(obs["goal"]) == 3
    obs, reward, terminated, truncated, info = envs.step(
        [format_action(Action("PRESS_HOME"))] * 3)
    assert reward.shape == (3,) and list(obs["step"]) == [1, 1, 1]
    envs.close()


def test_a_judge_by_argument_and_ground_truth_beside_it():
    env = gym.make("digirl_lite/SimPhone-v0", task=WEBSHOP_TASK,
                   judge={"judge": "noisy_oracle", "false_success_rate": 1.0,
                          "false_failure_rate": 0.0, "seed": 0})
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(format_action(Action("PRESS_HOME")))
    # a judge that always says success: reward 1 and the episode ends, though the task is not
    # done: the ground truth says so
    assert reward == 1.0 and terminated and info["success"] is False


@pytest.mark.parametrize("kwargs, match", [
    ({"world": "banking"}, "unknown world 'banking'"),
    ({"split": "dev"}, "unknown split 'dev'"),
    ({"screen_sise": (10, 10)}, r"unknown option\(s\) \['screen_sise'\]"),
    ({"action_space": "pixels"}, "unknown action_space 'pixels'"),
    ({"task": "Install Candy Crush"}, "digirl_lite/SimPhone"),
    ({"judge": {"judge": "oracel"}}, "unknown judge 'oracel'"),
])
def test_bad_options_are_clear_errors_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gym.make("digirl_lite/SimPhone-v0", **kwargs)


def test_text_outside_the_charset_is_replaced_not_refused():
    from digirl_lite.envs.sim.gym import _text

    assert _text("café “x” \U0001F600") == "café “x” \ufffd"


def test_bad_reset_options_are_clear_errors_and_the_env_still_works():
    env = gym.make("digirl_lite/SimPhone-v0")
    with pytest.raises(ValueError, match="unknown reset option 'weather'"):
        env.reset(seed=0, options={"weather": "rain"})
    with pytest.raises(ValueError, match="Install Candy Crush"):
        env.reset(seed=0, options={"task": "Install Candy Crush"})
    obs, info = env.reset(seed=0, options={"task": WEBSHOP_TASK, "day": 3})
    assert obs["goal"] == WEBSHOP_TASK and env.unwrapped.sim.day == 3
