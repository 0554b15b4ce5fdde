"""The simulated phone as an OpenEnv environment (issue 31, items 2 and 5): the real server
(``python -m digirl_lite.envs.sim.openenv``) in a subprocess, driven by the package's client,
by OpenEnv's own generic client and by raw WebSocket and HTTP requests; the scripted expert
to success, unparseable actions, bad options and malformed requests.

openenv-core's import alone takes seconds (it loads gradio and fastmcp), so it is imported
inside the fixtures, and every test that needs it is marked slow.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from needs import optional_import

from digirl_lite.actions import Action, format_action

ROOT = Path(__file__).resolve().parents[2]
TASK = "Go to ebay.com, search for 'logitech g910'"
HOME = format_action(Action("PRESS_HOME"))
START_TIMEOUT_S = 120.0  # the server imports openenv-core (gradio, fastmcp): slow on a busy CI


@pytest.fixture(scope="module")
def oe():
    """The module under test (skips, or fails under CI, without openenv-core)."""
    optional_import("openenv", 'pip install -e ".[openenv]"')
    import digirl_lite.envs.sim.openenv as oe

    return oe


@pytest.fixture(scope="module")
def server(oe, tmp_path_factory):
    """The real server on a free port of 127.0.0.1 (:class:`LocalServer`); stopped (this
    process only, by its pid) when the module's tests are done."""
    log = tmp_path_factory.mktemp("openenv") / "server.log"
    try:
        srv = oe.LocalServer(["--max-sessions", "4", "--log-level", "warning"], log=str(log),
                             start_timeout_s=START_TIMEOUT_S)
    except RuntimeError as e:
        pytest.fail(str(e))
    with srv:
        yield srv


@pytest.fixture
def client(oe, server):
    with oe.SimPhoneClient(base_url=server.url).sync() as env:
        yield env


# -- the package's client -----------------------------------------------------------------
@pytest.mark.slow
def test_the_package_client_drives_the_expert_to_success_as_the_gym_env_does(oe, client):
    """The scripted expert plays a local Gymnasium copy (same task, same seed); its action
    texts replayed over the wire give the same screens, prompts, rewards and ending."""
    from digirl_lite.envs.sim.agents import ScriptedExpert
    from digirl_lite.envs.sim.gym import SimPhoneGymEnv

    local = SimPhoneGymEnv()
    obs, _ = local.reset(seed=0, options={"task": TASK})
    result = client.reset(task=TASK, seed=0)
    assert isinstance(result.observation, oe.SimPhoneObservation)
    assert result.observation.goal == TASK and result.observation.step == 0
    assert result.reward is None and not result.done
    assert np.array_equal(result.observation.screenshot_array(), obs["screenshot"])
    expert, rewards, terminated = ScriptedExpert(), [], False
    while not terminated:
        text = expert.act(local.sim._obs)
        obs, reward, terminated, truncated, info = local.step(text)
        assert not truncated
        result = client.step(text)
        o = result.observation
        assert (result.reward, result.done, o.terminated, o.success) == \
            (reward, terminated, terminated, info["success"])
        assert o.prompt == obs["prompt"] and o.step == obs["step"] and o.invalid_reason is None
        assert np.array_equal(o.screenshot_array(), obs["screenshot"])
        rewards.append(result.reward)
    assert rewards[-1] == 1.0 and sum(rewards) == 1.0 and o.success and o.info["verdict"] == \
        "success"
    assert o.metadata == {"success": True, "invalid_reason": None, "truncation": None}
    state = client.state()
    assert isinstance(state, oe.SimPhoneState)
    assert (state.step_count, state.success, state.done, state.task, state.world) == \
        (len(rewards), True, True, TASK, "webshop")
    with pytest.raises(RuntimeError, match="no episode is running"):  # the episode is over
        client.step(HOME)
    local.close()


@pytest.mark.slow
def test_an_unparseable_action_is_a_step_with_reward_zero_never_an_error(client):
    client.reset(task=TASK, seed=1, horizon=3)
    for k, bad in enumerate(["tap the button please", {"action_type": "TYPE"}]):
        result = client.step(bad)
        o = result.observation
        assert result.reward == 0.0 and not result.done and o.step == k + 1
        assert o.invalid_reason and o.action is None and not o.success
    assert "TYPE needs a non-empty typed_text" in o.invalid_reason  # the structured one's why
    result = client.step({"action_type": "PRESS_HOME"})  # the third: the budget H = 3 ends it
    o = result.observation
    assert o.action == HOME and o.invalid_reason is None
    assert result.done and o.truncated and not o.terminated and o.truncation == "budget"
    assert client.state().step_count == 3


@pytest.mark.slow
def test_reset_options_last_one_episode_and_sessions_are_separate_phones(oe, server, client):
    o = client.reset(world="general", ui_tree=True, screenshot=False, screen_size=[64, 32],
                     seed=3).observation
    assert o.screenshot is None and "clickable" in o.ui_tree and o.screen_size == (64, 32)
    state = client.state()
    assert state.world == "general" and state.horizon == 10
    o = client.reset(seed=3).observation  # the server's options again
    assert o.ui_tree is None and o.screenshot_array().shape == (456, 216, 3)
    assert client.state().world == "webshop"
    with oe.SimPhoneClient(base_url=server.url).sync() as other:
        other.reset(task=TASK, seed=0, day=3)
        client.step(HOME)
        client.step(HOME)
        assert other.state().step_count == 0 and other.state().day == 3
        assert client.state().step_count == 2 and client.state().day == 1


@pytest.mark.slow
@pytest.mark.parametrize("options, named", [
    ({"world": "banking"}, "unknown world 'banking'"),
    ({"task": "Install Candy Crush"}, "Install Candy Crush"),
    ({"weather": "rain"}, r"unknown option\(s\) \['weather'\]"),
    ({"split": "dev"}, "unknown split 'dev'"),
    ({"seed": -1}, "seed must be an int >= 0"),
])
def test_an_unknown_world_task_or_option_is_a_clear_error_and_the_session_goes_on(
        server, client, options, named):
    import requests

    with pytest.raises(RuntimeError, match=named):
        client.reset(**options)
    with pytest.raises(RuntimeError, match="no episode is running"):
        client.step(HOME)  # a refused reset starts nothing
    result = client.reset(task=TASK, seed=0)  # the same session, unharmed
    assert result.observation.goal == TASK
    assert client.step(HOME).observation.step == 1
    reply = requests.post(f"{server.url}/reset", json=options, timeout=30)
    if "seed" in options:  # OpenEnv's own request model refuses a negative seed
        assert reply.status_code == 422 and "seed" in reply.text
    else:
        assert reply.status_code == 400 and json.loads(reply.text)["detail"]
        assert re.search(named, reply.json()["detail"])
    assert server.alive()


# -- OpenEnv's own clients, raw requests --------------------------------------------------
@pytest.mark.slow
def test_openenv_generic_client_drives_it_with_plain_dicts(server):
    from openenv.core import GenericEnvClient

    with GenericEnvClient(base_url=server.url).sync() as env:
        result = env.reset(task=TASK, seed=0, screenshot=False)
        assert result.observation["goal"] == TASK and result.observation["screenshot"] is None
        result = env.step({"text": HOME})
        assert result.reward == 0.0 and result.done is False
        assert result.observation["action"] == HOME and result.observation["step"] == 1
        result = env.step({"action_type": "DUAL_POINT", "touch_point": [0.5, 0.25],
                           "lift_point": [0.5, 0.25]})
        assert result.observation["action"] == format_action(Action.tap(x=0.25, y=0.5))
        state = env.state()
        assert state["step_count"] == 2 and state["task"] == TASK and state["success"] is False


@pytest.mark.slow
def test_malformed_requests_get_error_replies_and_the_server_keeps_serving(server):
    """Over the WebSocket every bad message gets an error reply on the same connection, which
    then plays on; over HTTP, 4xx replies; the server answers throughout."""
    import requests
    from websockets.sync.client import connect

    def ask(ws, message) -> dict:
        ws.send(message if isinstance(message, str) else json.dumps(message))
        return json.loads(ws.recv(timeout=60))

    with connect(f"ws://127.0.0.1:{server.port}/ws", max_size=2 ** 25) as ws:
        assert ask(ws, "{not json")["data"]["code"] == "INVALID_JSON"
        assert ask(ws, {"type": "dance"})["data"]["code"] == "UNKNOWN_TYPE"
        for data in ({"text": HOME, "action_type": "TYPE"},  # both: not one action
                     {"txt": HOME},                           # a field it does not have
                     {"touch_point": "here", "action_type": "DUAL_POINT"}):
            reply = ask(ws, {"type": "step", "data": data})
            assert reply["type"] == "error" and reply["data"]["code"] == "VALIDATION_ERROR"
        reply = ask(ws, {"type": "step", "data": {"text": HOME}})  # no reset yet
        assert reply["type"] == "error" and "no episode" in reply["data"]["message"]
        reply = ask(ws, {"type": "reset", "data": {"task": TASK, "seed": 0}})
        assert reply["type"] == "observation" and reply["data"]["observation"]["goal"] == TASK
        reply = ask(ws, {"type": "step", "data": {"text": HOME}})
        assert reply["type"] == "observation" and reply["data"]["observation"]["step"] == 1
    url = server.url
    assert requests.post(f"{url}/step", data="{not json", timeout=30,
                         headers={"content-type": "application/json"}).status_code == 422
    assert requests.post(f"{url}/step", json={"action": {"text": 5}},
                         timeout=30).status_code == 422
    assert requests.post(f"{url}/step", json={"action": {"text": HOME, "action_type": "TYPE"}},
                         timeout=30).status_code == 422
    reply = requests.post(f"{url}/step", json={"action": {"text": HOME}}, timeout=30)
    assert reply.status_code == 409 and "/ws" in reply.json()["detail"]  # HTTP is stateless
    reply = requests.post(f"{url}/reset", json={"task": TASK, "seed": 0}, timeout=30)
    assert reply.status_code == 200 and reply.json()["observation"]["goal"] == TASK
    schema = requests.get(f"{url}/schema", timeout=30).json()
    assert {"text", "action_type", "touch_point"} <= set(schema["action"]["properties"])
    assert {"prompt", "screenshot", "success", "invalid_reason"} <= \
        set(schema["observation"]["properties"])
    assert server.alive()


@pytest.mark.slow
def test_clients_hanging_up_leave_no_errors_in_the_server_log(oe, server):
    for seed in range(3):
        with oe.SimPhoneClient(base_url=server.url).sync() as env:
            env.reset(task=TASK, seed=seed, screenshot=False)
    time.sleep(1.0)  # the server closes its side after the client's hang-up
    assert server.alive()
    log = Path(server.log).read_text()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-2000:]


# -- the command and the module -----------------------------------------------------------
@pytest.mark.slow
def test_the_command_refuses_bad_options_naming_them(oe):
    out = subprocess.run([sys.executable, "-m", "digirl_lite.envs.sim.openenv", "--port", "1",
                          "--world", "mars"], cwd=ROOT, capture_output=True, text=True,
                         timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 2 and "unknown world 'mars'" in out.stderr


@pytest.mark.slow
def test_without_openenv_core_the_import_names_the_extra_and_the_package_stays_light():
    code = ("import sys; import digirl_lite, digirl_lite.envs.sim.gym; "
            "assert 'openenv' not in sys.modules, 'digirl_lite imported openenv'; "
            "sys.modules['openenv'] = None\n"
            "try:\n    import digirl_lite.envs.sim.openenv\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert "digirl-lite[openenv]" in out.stdout and "openenv-core" in out.stdout


def test_run_as_a_file_it_says_to_run_it_as_a_module():
    """``python digirl_lite/envs/sim/openenv.py`` would import itself as ``openenv``."""
    out = subprocess.run([sys.executable, str(ROOT / "digirl_lite/envs/sim/openenv.py")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "python -m digirl_lite.envs.sim.openenv" in out.stderr


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_ends_when_the_process_that_started_it_is_killed(oe, tmp_path):
    """A trainer killed by SIGKILL (no ``stop``, no ``with`` exit) leaves no served phone
    behind: the child gets SIGTERM when its parent dies."""
    script = ("import sys, time\n"
              "from digirl_lite.envs.sim.openenv import LocalServer\n"
              f"s = LocalServer(['--log-level', 'warning'], log={str(tmp_path / 'srv.log')!r}, "
              f"start_timeout_s={START_TIMEOUT_S})\n"
              "print(s.proc.pid, flush=True)\n"
              "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(parent.stdout.readline())
        os.kill(server_pid, 0)  # it is running
    finally:
        parent.kill()
        parent.wait(timeout=10)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            return
        try:  # reaped by init, or a zombie of ours? it is not our child: only lookup tells
            with open(f"/proc/{server_pid}/stat") as f:
                if f.read().split(") ")[-1].startswith("Z"):
                    return
        except FileNotFoundError:
            return
        time.sleep(0.2)
    os.kill(server_pid, 9)  # ours to end: this test started it
    raise AssertionError(f"the server {server_pid} outlived the process that started it")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_started_off_the_main_thread_does_not_end_with_that_thread():
    """Linux ends a PR_SET_PDEATHSIG child when the forking *thread* ends: a worker thread
    that starts a phone gets no such hook, the main thread does."""
    import threading

    from digirl_lite.envs.sim.serve.processes import ends_with_parent

    got = []
    t = threading.Thread(target=lambda: got.append(ends_with_parent()))
    t.start()
    t.join()
    assert got == [None] and callable(ends_with_parent())
