"""The simulated phone served over the WebDriver / Appium protocol, driven by the unchanged
Android client (appium-python-client -> AppiumDevice / AndroidEnv): sessions, screenshots,
gestures, the vendor scripts, pixel equality with SimPhoneEnv, faults, W3C errors, and
phones in their own processes."""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from needs import optional_import
from PIL import Image

from digirl_lite.actions import (
    KEYCODE_ENTER,
    KEYCODE_HOME,
    Action,
    ActionType,
    Gesture,
    format_action,
    to_gesture,
)
from digirl_lite.data.records import Ending, ScreenTable
from digirl_lite.envs.base import TRUNCATION_INFRA
from digirl_lite.envs.sim import Copier, Faults, ScriptedExpert, SimPhoneEnv, Surprises
from digirl_lite.envs.sim.agents import expert_action
from digirl_lite.envs.sim.serve import (
    INFO,
    IS_SUCCESS,
    SET_TASK,
    SimPhoneServer,
    spawn_phones,
)
from digirl_lite.envs.sim.world import find, is_success
from digirl_lite.judge.guards import is_blank

optional_import("appium")  # the android extra: a skip outside CI, a failure under CI=true
from selenium.common.exceptions import (  # noqa: E402 - after the skip: needs the extra
    InvalidArgumentException,
    UnknownMethodException,
)

from digirl_lite.envs.android import (  # noqa: E402
    AndroidConfig,
    AndroidEnv,
    AppiumDevice,
    DeviceUnavailable,
)

CAPS = {"platformName": "Android", "appium:automationName": "UiAutomator2"}
NONE = Surprises.none()
NO_BLANK_PAGES = Surprises(blank=0.0)  # the other surprises at their defaults (see serve.py)
SHOP3 = 'Go to costco.com, search for "bose soundsport free", and select the first entry'
TASKS = [SHOP3, "What is the capital of France?", "Open the Settings"]


@pytest.fixture
def phone():
    with SimPhoneServer(surprises=NONE) as server:
        yield server


def config(url: str, **kw) -> AndroidConfig:
    """Impatient settings: a test should not wait out the production retry pauses."""
    return AndroidConfig(server_url=url, capabilities=CAPS, **{
        "call_timeout_s": 10, "connect_retries": 0, "retry_wait_s": 0.01, "settle_s": 0,
        "blank_wait_s": 0, **kw})


def request(url: str, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, data=body, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def pixels(img: Image.Image) -> np.ndarray:
    return np.asarray(img.convert("RGB"))


def same(a: Image.Image, b: Image.Image) -> bool:
    return np.array_equal(pixels(a), pixels(b))


def tap_on(env: SimPhoneEnv, element_id: str) -> Gesture:
    el = find(env.state, element_id)
    assert el is not None, element_id
    return Gesture("tap", start=el.center, end=el.center)


# -- protocol ----------------------------------------------------------------------------------
def test_session_lifecycle_and_status(phone):
    assert request(phone.url, "GET", "/status") == (200, {"value": {
        "ready": True, "message": "digirl-sim-phone ready"}})
    first = AppiumDevice(config(phone.url, connect_retries=1))
    sid = first.driver.session_id
    assert first.driver.caps["platformName"] == "Android"
    assert request(phone.url, "GET", f"/session/{sid}/window/rect")[0] == 200
    second = AppiumDevice(config(phone.url))  # replaces the first session, as a reconnect does
    status, body = request(phone.url, "GET", f"/session/{sid}/window/rect")
    assert status == 404 and body["value"]["error"] == "invalid session id"
    second_sid = second.driver.session_id
    second.quit()
    assert request(phone.url, "GET", f"/session/{second_sid}/screenshot")[0] == 404
    assert first.screenshot().size == (1080, 2280)  # its session is gone: it reconnects
    assert first.reconnects == 1
    first.quit()


def test_screenshot_is_a_full_size_png_of_the_screen(phone):
    dev = AppiumDevice(config(phone.url))
    sid = dev.driver.session_id
    status, body = request(phone.url, "GET", f"/session/{sid}/screenshot")
    png = base64.b64decode(body["value"])
    assert status == 200 and png.startswith(b"\x89PNG\r\n\x1a\n")
    assert Image.open(io.BytesIO(png)).size == (1080, 2280)
    twin = SimPhoneEnv(surprises=NONE)
    obs, _ = twin.reset("Go to ebay.com")
    assert same(dev.screenshot(), obs.screenshot)
    assert dev.window_size() == (1080, 2280)
    assert request(phone.url, "GET", f"/session/{sid}/window/current/size")[1] == {
        "value": {"width": 1080, "height": 2280}}  # the JSON wire protocol's path
    dev.quit()
    with SimPhoneServer(width=270, height=570) as small:
        dev = AppiumDevice(config(small.url))
        assert dev.screenshot().size == (270, 570)
        assert dev.window_size() == (1080, 2280)  # gestures stay in the world's pixels
        dev.quit()


@pytest.mark.slow
def test_gestures_change_the_screen_as_in_process():
    """Every kind of driver call ``perform`` makes (tap, swipe, Home and Enter keycodes,
    back, typing into the active element), and Android's BACK keycode 4, against an
    in-process twin (screenshots drawn small: the test is about the gestures)."""
    kw = {"surprises": NONE, "width": 270, "height": 570}
    twin = SimPhoneEnv(**kw)
    twin.reset("Go to ebay.com", seed=0)
    phone = SimPhoneServer(**kw).start()
    dev = AppiumDevice(config(phone.url))
    dev.driver.execute_script(SET_TASK, {"task": "Go to ebay.com", "seed": 0})
    back_key = Gesture("key", keycode=4)  # over the wire: press_keycode(4)
    steps = [
        lambda: tap_on(twin, "icon:chrome"),
        lambda: Gesture("type", text="ignored"),  # nothing focused: changes nothing
        lambda: tap_on(twin, "address_bar"),
        lambda: Gesture("type", text="ebay.com"),
        lambda: Gesture("key", keycode=KEYCODE_ENTER),
        lambda: tap_on(twin, "search_box"),
        lambda: Gesture("type", text="red shoes"),
        lambda: Gesture("key", keycode=KEYCODE_ENTER),
        lambda: Gesture("swipe", start=(540.0, 1800.0), end=(540.0, 1000.0)),  # scroll down
        lambda: Gesture("swipe", start=(540.0, 1000.0), end=(540.0, 1400.0)),  # and back up
        lambda: back_key,
        lambda: Gesture("back"),
        lambda: Gesture("key", keycode=KEYCODE_HOME),
    ]
    before = dev.screenshot()
    unchanged = 0
    for make in steps:
        g = make()
        twin.apply_gesture(Gesture("back") if g is back_key else g)
        dev.perform(g)
        now = dev.screenshot()
        assert same(now, twin.capture()[0]), g
        unchanged += same(now, before)
        before = now
    assert unchanged == 1  # only the typing with nothing focused
    assert twin.state.page.kind == "launcher"
    dev.quit()
    phone.close()


@pytest.mark.slow
def test_an_expert_over_the_wire_sees_the_same_pixels_as_in_process():
    """Same seed, same gestures, every surprise on and the blank-capture and latency faults
    drawing: the served phone and SimPhoneEnv draw identical screens at every step (the
    expert reads the in-process twin's state, never the server's)."""
    kw = {"surprises": Surprises(), "faults": Faults(blank_screenshot=0.2,
                                                     latency_median_s=0.0005), "seed": 11}
    twin = SimPhoneEnv(**kw)
    blanks = surprises = 0
    with SimPhoneServer(**kw) as server:
        dev = AppiumDevice(config(server.url))
        for seed, task in enumerate(TASKS):
            twin.load_task(task, seed)
            dev.driver.execute_script(SET_TASK, {"task": task, "seed": seed})
            for _ in range(40):
                action = expert_action(twin.state, twin.task)
                if action.ends_episode:
                    break
                g = to_gesture(action, 1080, 2280)
                surprises += len(twin.apply_gesture(g))
                dev.perform(g)
                shot, screen_id = twin.capture()
                blanks += screen_id == "blank"
                assert same(dev.screenshot(), shot), (task, g)
            assert is_success(twin.state, twin.task)
            assert dev.driver.execute_script(IS_SUCCESS) == {"success": True,
                                                             "reached_first_milestone": True}
        dev.quit()
    assert blanks and surprises  # the faults and surprises did happen


@pytest.mark.slow
def test_android_env_episodes_match_sim_phone_env_with_blank_capture_retries():
    """Whole episodes through AndroidEnv (its blank-screen retries included) against
    SimPhoneEnv.step: same screenshots, same blank captures per step, the same
    infrastructure truncations. Screenshots are drawn small to keep the test fast."""
    kw = {"surprises": NO_BLANK_PAGES, "faults": Faults(blank_screenshot=0.3, blank_retries=2),
          "width": 270, "height": 570}
    twin = SimPhoneEnv(**kw)
    blanks = 0
    with SimPhoneServer(**kw) as server:
        dev = AppiumDevice(config(server.url))
        env = AndroidEnv(config(server.url, blank_retries=2), horizon=20, device=dev)
        for seed, (task, agent) in enumerate([(SHOP3, ScriptedExpert()), (SHOP3, Copier(seed=1)),
                                              (TASKS[1], Copier(seed=2))]):
            obs, _ = twin.reset(task, seed=seed)
            dev.driver.execute_script(SET_TASK, {"task": task, "seed": seed})
            wire, _ = env.reset(task)
            assert same(wire.screenshot, obs.screenshot)
            while True:
                text = agent.act(obs)
                obs, _, term, trunc, info = twin.step(text)
                wire, _, _, _, w_info = env.step(text)
                # the twin's oracle ends a success early; AndroidEnv has no judge here
                assert w_info["truncation"] == info["truncation"]
                assert w_info["blank_captures"] == info["blank_captures"]
                blanks += info["blank_captures"]
                if info["truncation"] == TRUNCATION_INFRA:
                    assert "blank screenshot" in w_info["reason"]
                    break
                assert same(wire.screenshot, obs.screenshot)
                if term or trunc:
                    break
            success = dev.driver.execute_script(IS_SUCCESS)["success"]
            assert success == is_success(twin.state, twin.task)
        env.close()
    assert blanks > 0


# -- the vendor scripts and W3C errors ---------------------------------------------------------
def test_set_task_is_success_and_info(phone):
    d = AppiumDevice(config(phone.url)).driver
    assert d.execute_script(INFO) == {"world": "webshop", "day": 1, "seed": 0, "task": None}
    with pytest.raises(InvalidArgumentException, match="no task set"):
        d.execute_script(IS_SUCCESS)
    with pytest.raises(InvalidArgumentException, match="installing apps is not simulated"):
        d.execute_script(SET_TASK, {"task": "Install Candy Crush", "seed": 1})
    with pytest.raises(InvalidArgumentException, match="seed must be"):
        d.execute_script(SET_TASK, {"task": "Open the Settings", "seed": "one"})
    with pytest.raises(UnknownMethodException, match="digirl: setTask"):
        d.execute_script("mobile: shell", {"command": "ls"})
    assert d.execute_script(SET_TASK, {"task": "Open the Settings", "seed": 4}) == {
        "horizon": 10, "task": "Open the Settings"}
    assert d.execute_script(IS_SUCCESS) == {"success": False,
                                            "reached_first_milestone": False}
    twin = SimPhoneEnv(surprises=NONE)
    twin.load_task("Open the Settings")
    d.tap([tuple(round(v) for v in find(twin.state, "icon:settings").center)])
    assert d.execute_script(IS_SUCCESS) == {"success": True,
                                            "reached_first_milestone": True}
    assert d.execute_script(INFO)["seed"] == 4
    # no task: drawn from the world's list, as SimPhoneEnv.reset(None, seed) draws it
    drawn = d.execute_script(SET_TASK, {"seed": 9})
    assert drawn == {"horizon": 20, "task": SimPhoneEnv().load_task(None, 9).text}


def test_w3c_errors_for_unknown_commands_sessions_and_bad_input(phone):
    def error(method, path, body=None):
        status, answer = request(phone.url, method, path, body)
        v = answer["value"]
        assert set(v) == {"error", "message", "stacktrace"} and v["message"]
        return status, v["error"]

    assert error("GET", "/no/such/command") == (404, "unknown command")
    assert error("DELETE", "/status") == (405, "unknown method")
    assert error("GET", "/session/deadbeef/screenshot") == (404, "invalid session id")
    sid = AppiumDevice(config(phone.url)).driver.session_id
    assert error("POST", f"/session/{sid}/actions", b"{not json") == (400, "invalid argument")
    keys = {"actions": [{"type": "key", "id": "k", "actions": [{"type": "keyDown",
                                                                "value": "a"}]}]}
    assert error("POST", f"/session/{sid}/actions", json.dumps(keys).encode()) == (
        500, "unsupported operation")
    assert error("POST", f"/session/{sid}/element/nope/value", b'{"text": "x"}') == (
        404, "no such element")
    assert error("POST", f"/session/{sid}/appium/device/press_keycode",
                 b'{"keycode": "home"}') == (400, "invalid argument")
    # the press_keycode path of older clients (newer ones send "mobile: pressKey")
    assert request(phone.url, "POST", f"/session/{sid}/appium/device/press_keycode",
                   b'{"keycode": 3}') == (200, {"value": None})


# -- faults ------------------------------------------------------------------------------------
def test_blank_captures_are_served_white_and_retried_by_the_client():
    with SimPhoneServer(faults={"blank_screenshot": 1.0}) as server:
        dev = AppiumDevice(config(server.url))
        assert is_blank(dev.screenshot())
        env = AndroidEnv(config(server.url, blank_retries=2), device=dev)
        with pytest.raises(DeviceUnavailable, match="blank"):
            env.reset("Go to ebay.com")
        env.close()


@pytest.mark.slow
def test_a_loading_page_loads_while_the_client_waits():
    """The blank surprise over the wire: the first screenshot after the gesture shows the
    white page; AndroidEnv's blank guard looks again and the page has loaded (a real page
    would have), so the agent never sees it and the episode goes on."""
    with SimPhoneServer(surprises=Surprises(popup=0, consent=0, voice=0, reorder=0,
                                            blank=1.0)) as server:
        twin = SimPhoneEnv(surprises=Surprises.none())
        twin.reset("Go to ebay.com", seed=0)
        dev = AppiumDevice(config(server.url))
        dev.execute("digirl: setTask", {"task": "Go to ebay.com", "seed": 0})
        dev.perform(tap_on(twin, "icon:chrome"))  # Chrome opens on a page that loads blank
        assert is_blank(dev.screenshot())
        assert not is_blank(dev.screenshot())  # looked again: loaded
        env = AndroidEnv(config(server.url), device=dev, reset="task")
        env.reset("Go to ebay.com", seed=0)
        obs, _, _, trunc, info = env.step(format_action(Action.tap(x=0.5, y=0.2)))
        assert not is_blank(obs.screenshot) and not trunc
        dev.quit()


def test_latency_is_slept_in_gesture_calls():
    with SimPhoneServer(faults={"latency_median_s": 0.15, "latency_sigma": 0.0}) as server:
        dev = AppiumDevice(config(server.url))
        t = time.perf_counter()
        dev.perform(Gesture("back"))
        assert time.perf_counter() - t >= 0.15
        dev.quit()


@pytest.mark.slow
def test_a_crash_takes_the_phone_down_and_is_an_infrastructure_truncation():
    with SimPhoneServer(faults={"crash": 1.0}, crash_down_s=1.0) as server:
        env = AndroidEnv(config(server.url, connect_retries=2, retry_wait_s=0.05),
                         reset=lambda: None)  # no Home press: that would crash already
        env.reset("Go to ebay.com")
        *_, trunc, info = env.step(format_action(Action.tap(x=0.5, y=0.5)))
        assert trunc and info["truncation"] == TRUNCATION_INFRA
        assert "simulated device crash" in info["reason"]
        status, body = request(server.url, "GET", "/status")
        assert status == 500 and body["value"]["error"] == "unknown error"
        time.sleep(1.0)
        assert request(server.url, "GET", "/status")[0] == 200  # back, on the launcher
        twin = SimPhoneEnv(surprises=NONE)
        assert same(env.reset("Go to ebay.com")[0].screenshot, twin.reset("Go to ebay.com")[0]
                    .screenshot)
        env.close()


# -- phones in their own processes -------------------------------------------------------------
@pytest.mark.slow
def test_the_command_line_prints_its_url_and_serves_the_configured_phone():
    argv = [sys.executable, "-m", "digirl_lite.envs.sim.serve", "--port", "0", "--world",
            "general", "--seed", "7", "--day", "3", "--surprises", '{"popup": 0.0}',
            "--faults", '{"blank_screenshot": 0.0}']
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.fullmatch(r"digirl-sim-phone listening on (http://127\.0\.0\.1:\d+)\n", line)
        assert m, line
        d = AppiumDevice(config(m[1])).driver
        assert d.execute_script(INFO) == {"world": "general", "day": 3, "seed": 7,
                                          "task": None}
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()


@pytest.mark.slow
def test_spawned_phones_and_a_killed_phone_is_a_lost_device():
    phones = spawn_phones(2, seed=5, surprises=NONE)
    try:
        assert len({p.url for p in phones}) == 2
        seeds = [AppiumDevice(config(p.url)).driver.execute_script(INFO)["seed"] for p in phones]
        assert seeds == [5, 6]
        env = AndroidEnv(config(phones[0].url, connect_retries=1))
        env.reset("Go to ebay.com")
        phones[0].kill()
        *_, trunc, info = env.step(format_action(Action.key(ActionType.PRESS_HOME)))
        assert trunc and info["truncation"] == TRUNCATION_INFRA
        with pytest.raises(DeviceUnavailable):
            env.reset("Go to ebay.com")
        assert request(phones[1].url, "GET", "/status")[0] == 200  # the other one is fine
    finally:
        for p in phones:
            p.close()
    assert not any(p.alive() for p in phones)


@pytest.mark.slow
def test_spawn_phones_reports_a_phone_that_does_not_start():
    with pytest.raises(RuntimeError, match=r"(?s)phone 0 exited with code 1:\n.*does not exist"):
        spawn_phones(1, world="no-such-task-list")



# -- ground truth over the wire (issue 32) -----------------------------------------------------
class _SaysFailure:
    """A judge that calls every screen a failure (so the truth and the verdict differ)."""

    def reset(self) -> None:
        pass

    def judge(self, task, prev, cur, *, history=None, state=None):
        from digirl_lite.data.records import Verdict
        from digirl_lite.judge import JudgeResult

        return JudgeResult(Verdict.FAILURE, reply="Status: failure")


def _counting(dev: AppiumDevice) -> list[str]:
    """The execute-scripts ``dev`` sends from now on, by name."""
    sent, execute = [], dev.execute

    def spy(script, args=None):
        sent.append(script)
        return execute(script, args)

    dev.execute = spy
    return sent


@pytest.mark.slow
def test_android_env_reads_the_truth_from_a_served_phone(phone):
    """The served phone told the task (reset "task") answers its own check at each
    episode's last step: the expert's episode is true while the judge said failure; a
    tapper never reached the site. One check per episode, before the teardown."""
    from phone_agents import Tapper, TwinExpert

    from digirl_lite.rollout import run_episode

    dev = AppiumDevice(config(phone.url))
    sent = _counting(dev)
    env = AndroidEnv(config(phone.url), judge=_SaysFailure(), device=dev, reset="task",
                     horizon=10)
    t = run_episode(env, TwinExpert(0), ScreenTable(), traj_id="x", task="Go to ebay.com",
                    seed=0)
    assert t.ending is Ending.AGENT_STOP and t.true_success is True  # judged failure, true
    assert sent.count(IS_SUCCESS) == 1
    infos = []
    t = run_episode(env, Tapper(0), ScreenTable(), traj_id="y", task="Go to ebay.com", seed=0,
                    on_step=infos.append)
    assert t.true_success is False and infos[-1]["reached_first_milestone"] is False
    assert all("true_success" not in i for i in infos[:-1])  # asked at the last step only
    env.ground_truth = False
    t = run_episode(env, TwinExpert(0), ScreenTable(), traj_id="z", task="Go to ebay.com",
                    seed=0)
    assert t.true_success is None and sent.count(IS_SUCCESS) == 2
    env.close()
    # under the device's own check as the judge, the last step's verdict is the truth:
    # one check per step, none more
    from digirl_lite.envs.sim.oracle import EnvJudge

    env = AndroidEnv(config(phone.url), judge=EnvJudge(), device=dev, horizon=10)
    t = run_episode(env, TwinExpert(0), ScreenTable(), traj_id="e", task="Go to ebay.com",
                    seed=0)
    assert t.is_success and t.true_success is True
    assert sent.count(IS_SUCCESS) == 2 + len(t)
    env.close()


@pytest.mark.slow
def test_a_device_without_the_check_gives_no_truth_and_is_not_asked_again(phone):
    """A device that refuses ``digirl: isSuccess`` (a real phone would) records no truth,
    the episode goes on as before, and the next episodes do not ask; a Home reset (the
    device does not know the task) never asks."""
    from phone_agents import Tapper

    from digirl_lite.rollout import run_episode

    phone._httpd.phone._scripts.pop(IS_SUCCESS)  # this phone has no success check
    dev = AppiumDevice(config(phone.url))
    sent = _counting(dev)
    env = AndroidEnv(config(phone.url), judge=_SaysFailure(), device=dev, reset="task")
    for k in range(2):
        t = run_episode(env, Tapper(0), ScreenTable(), traj_id=f"t{k}", task="Go to ebay.com")
        assert t.ending is Ending.AGENT_STOP and t.true_success is None
    assert sent.count(IS_SUCCESS) == 1
    home = AndroidEnv(config(phone.url), judge=_SaysFailure(), device=dev)
    t = run_episode(home, Tapper(0), ScreenTable(), traj_id="h", task="Go to ebay.com")
    assert t.true_success is None and sent.count(IS_SUCCESS) == 1
    env.close()


@pytest.mark.slow
def test_an_evaluation_over_the_wire_reports_the_truth(phone):
    """A fleet of served phones under the device's own check as the judge: the report
    carries the environment's truth, which agrees with the verdicts."""
    from phone_agents import Tapper, TwinExpert

    from digirl_lite.envs.setup import EndpointEnvFactory
    from digirl_lite.rollout.fleet import LocalFleet, ScriptedBatchAgent
    from digirl_lite.train.evaluate import evaluate

    devices = [{"server_url": phone.url, "settle_s": 0.0, "blank_wait_s": 0.0,
                "retry_wait_s": 0.01, "connect_retries": 0, "call_timeout_s": 10.0}]
    make = EndpointEnvFactory(devices, {"judge": "env"}, horizon=6, reset="task")
    tasks = ["Go to ebay.com", "Go to costco.com"]
    agents = {"expert": (TwinExpert, 1.0), "tapper": (Tapper, 0.0)}
    for name, (agent, rate) in agents.items():
        report, eps = evaluate(LocalFleet(make, n_envs=1), ScriptedBatchAgent(agent), tasks,
                               n_tasks=None, id_prefix=name)
        assert report["truth"] == "environment" and report["true_episodes"] == 2, name
        assert report["true_success_rate"] == report["success_rate"] == rate, name
        assert report["judge_agreement"]["accuracy"] == 1.0
    assert report["failure_kinds"]["never_reached_site"] == 2  # the phone's answer
