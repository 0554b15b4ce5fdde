"""TRL trains on the simulated phone (issue 31, item 3): the tools TRL's GRPOTrainer exposes
complete a task through the OpenEnv server with the environment's verdict as the reward, and
the recipe runs GRPO at tiny size through a server it starts."""

from __future__ import annotations

import json

import pytest
from needs import optional_import

TASK = "Go to ebay.com, search for 'logitech g910'"



@pytest.mark.slow
def test_the_tools_complete_a_task_through_the_server_and_the_reward_is_the_verdict(server):
    """The scripted expert, reading a local copy of the phone (same task and seed), is turned
    into tool calls (a tap becomes a tap on the element under it); the served phone ends the
    episode done and the tools' reward is 1."""
    import gymnasium as gym

    import digirl_lite  # noqa: F401
    from digirl_lite.actions import Action, format_action, parse_action
    from digirl_lite.envs.sim.agents import ScriptedExpert
    from digirl_lite.envs.sim.trl_tools import HEIGHT, WIDTH, phone_tools
    from digirl_lite.envs.uitree import parse_tree_text

    tools_cls = phone_tools(server.url)
    tools = tools_cls()
    first = tools.reset(task=TASK, seed=7, prompt="ignored: every dataset column comes in")
    assert first.startswith(f"Goal: {TASK}\nStep 0. Screen:") and "[icon:chrome]" in first
    local = gym.make("digirl_lite/SimPhone-v0", ui_tree=True)
    local.reset(seed=7, options={"task": TASK})
    sim = local.unwrapped.sim
    expert = ScriptedExpert()
    calls = []
    while not tools.done and len(calls) < 20:
        a = parse_action(expert.act(sim._obs))
        if a.action_type.value == "DUAL_POINT":
            y, x = a.touch_yx
            nodes = [n for n in parse_tree_text(tools._obs.ui_tree)
                     if n.clickable and n.bounds[0] <= x * WIDTH <= n.bounds[2]
                     and n.bounds[1] <= y * HEIGHT <= n.bounds[3]]
            node = min(nodes, key=lambda n: (n.bounds[2] - n.bounds[0])
                       * (n.bounds[3] - n.bounds[1]))
            text = tools.tap(node.id)
            cx, cy = node.center
            local.step(format_action(Action.tap(x=cx / WIDTH, y=cy / HEIGHT)))
            calls.append(("tap", node.id))
        elif a.action_type.value == "TYPE":
            text = tools.type_text(a.typed_text)
            local.step(format_action(a))
            calls.append(("type_text", a.typed_text))
        else:
            name = {"PRESS_ENTER": "press_enter", "PRESS_BACK": "press_back",
                    "PRESS_HOME": "press_home", "STATUS_TASK_COMPLETE": "task_complete"}[
                a.action_type.value]
            text = getattr(tools, name)()
            local.step(format_action(a))
            calls.append((name, None))
    assert tools.done and tools.success, calls
    assert tools.get_reward() == 1.0 and "the task is done" in text
    assert ("type_text", "logitech g910") in calls
    with pytest.raises(ValueError, match="episode is over"):
        tools.press_back()
    # a tap on an id the screen does not have spends the step as an unparseable action
    tools.reset(task=TASK, seed=8)
    text = tools.tap("no-such-button")
    assert "There is no element 'no-such-button'" in text and "did not parse" in text
    assert tools.steps == 1 and tools.get_reward() == 0.0 and not tools.done


@pytest.mark.slow
def test_the_recipe_runs_grpo_on_the_served_phone_at_tiny_size(tmp_path, server):
    """TRL's GRPOTrainer with the tools as its environment_factory, a tiny random Qwen3 and a
    server the recipe starts and stops: one training step, one episode per rollout, the
    environment's reward logged by TRL under the tools' name. The random model writes no
    tool call, so a tool call in Qwen3's format is parsed with the tokenizer's response
    parser (as TRL does) and run against the tools: it reaches the phone."""
    optional_import("trl", 'pip install -e ".[trl]"')
    optional_import("openenv", 'pip install -e ".[openenv]"')
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "recipes" / "trl_grpo.py"
    spec = importlib.util.spec_from_file_location("trl_grpo", path)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    summary = recipe.main(["--tiny", "--max-steps", "1", "--batch", "2", "--num-generations",
                           "2", "--max-completion-length", "64", "--tasks", "4",
                           "--out", str(tmp_path)])
    assert summary["steps"] == 1 and summary["train_seconds"] > 0
    assert summary["episodes_served"] >= 2  # a session and a reset per rollout
    logged = summary["rewards"][0]
    assert "rewards/PhoneTools/mean" in logged and 0.0 <= float(logged["reward"]) <= 1.0
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 1
    assert "Traceback" not in (tmp_path / "openenv_server.log").read_text()
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema

    from digirl_lite.envs.sim.trl_tools import phone_tools

    tok = add_response_schema(AutoTokenizer.from_pretrained(summary["model"]))
    reply = ('<tool_call>\n{"name": "tap", "arguments": {"element": "icon:chrome"}}\n'
             "</tool_call><|im_end|>")
    (call,) = tok.parse_response(reply, prefix="")["tool_calls"]
    tools = phone_tools(server.url)()
    before = tools.reset(task=TASK, seed=3)
    after = getattr(tools, call["function"]["name"])(**call["function"]["arguments"])
    assert tools.steps == 1 and "Step 1" in after and after != before
    assert "[icon:chrome]" not in after  # Chrome opened: the launcher is gone
