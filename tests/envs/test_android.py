"""Android: the command layer, adb quoting, the emulator manager (fake SDK), and a real Appium
server with Appium's fake driver (marked ``android``; without node and .ci/node they skip, and
fail under CI=true)."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from needs import free_port, missing, optional_import
from PIL import Image

from digirl_lite.actions import Action, ActionType, Gesture, format_action, to_gesture
from digirl_lite.data import Ending, ScreenTable
from digirl_lite.data.records import Verdict
from digirl_lite.envs.android import (
    Adb,
    AndroidConfig,
    AndroidEnv,
    AppiumDevice,
    DeviceUnavailable,
    EmulatorConfig,
    EmulatorManager,
    SdkToolMissing,
    adb_input_text_args,
    perform,
)
from digirl_lite.envs.base import TRUNCATION_INFRA
from digirl_lite.envs.lifecycle import PhaseFailed
from digirl_lite.judge import JudgeResult
from digirl_lite.rollout import ScriptedBatchAgent, SyncFleet
from digirl_lite.rollout.fleet import NoDevicesLeft

ROOT = Path(__file__).resolve().parents[2]
NASTY = """it's "quoted"; rm -rf / && $(touch PWNED) `touch PWNED` | cat > x %s 100% \\ end"""


# -- the command layer (what the fake driver lacks: keycodes, back, active element) ---------
class RecordingDriver:
    def __init__(self, refuse_typing: bool = False) -> None:
        self.calls: list[tuple] = []
        self.refuse_typing = refuse_typing
        driver = self

        class Element:
            def send_keys(self, text):
                if driver.refuse_typing:
                    raise RuntimeError("no focused element")
                driver.calls.append(("send_keys", text))

        class SwitchTo:
            @property
            def active_element(self):
                return Element()

        self.switch_to = SwitchTo()

    def tap(self, positions):
        self.calls.append(("tap", positions))

    def swipe(self, x0, y0, x1, y1, ms):
        self.calls.append(("swipe", x0, y0, x1, y1))

    def press_keycode(self, code):
        self.calls.append(("keycode", code))

    def back(self):
        self.calls.append(("back",))


def test_gestures_become_driver_calls():
    d = RecordingDriver()
    w, h = 1080, 2280
    # [y, x] in the action string, (x, y) pixels on the device
    perform(d, to_gesture(Action.tap(x=0.25, y=0.5), w, h))
    perform(d, to_gesture(Action.swipe(x0=0.5, y0=0.8, x1=0.5, y1=0.2), w, h))
    for t in (ActionType.PRESS_HOME, ActionType.PRESS_ENTER, ActionType.PRESS_BACK):
        perform(d, to_gesture(Action(t), w, h))
    perform(d, to_gesture(Action(ActionType.TYPE, typed_text="red shoes"), w, h))
    perform(d, to_gesture(Action(ActionType.STATUS_TASK_COMPLETE), w, h))
    assert d.calls == [("tap", [(270, 1140)]), ("swipe", 540, 1824, 540, 456),
                       ("keycode", 3), ("keycode", 66), ("back",),
                       ("send_keys", "red shoes")]


def test_typing_falls_back_to_adb_with_an_argument_list():
    argvs = []

    def run(argv, **kw):
        argvs.append((argv, kw))
        return subprocess.CompletedProcess(argv, 0, "", "")

    adb = Adb("/sdk/platform-tools/adb", "emulator-5556", run=run)
    perform(RecordingDriver(refuse_typing=True), Gesture("type", text=NASTY), adb)
    (argv, kw), = argvs
    assert isinstance(argv, list) and "shell" not in kw  # no local shell
    assert argv[:4] == ["/sdk/platform-tools/adb", "-s", "emulator-5556", "shell"]
    # adb shell joins what follows and the device's sh parses it: one literal argument
    assert shlex.split(" ".join(argv[4:])) == ["input", "text", NASTY.replace(" ", "%s")]
    with pytest.raises(RuntimeError):  # no adb: the error is not swallowed
        perform(RecordingDriver(refuse_typing=True), Gesture("type", text="x"))


def test_shell_metacharacters_reach_the_device_as_text(tmp_path):
    """A stand-in adb that does what adb does with ``shell``: joins the arguments and runs
    them with ``sh -c`` (where ``input`` prints its arguments)."""
    out, fake = tmp_path / "typed.txt", tmp_path / "adb"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import subprocess, sys\n"
        "args = sys.argv[sys.argv.index('shell') + 1:]\n"
        f"script = 'input() {{ printf \"%s\" \"$2\" > {out}; }}; ' + ' '.join(args)\n"
        f"subprocess.run(['/bin/sh', '-c', script], cwd={str(tmp_path)!r}, check=True)\n")
    fake.chmod(0o755)
    Adb(str(fake), "emulator-5554").type_text(NASTY)
    assert out.read_text() == NASTY.replace(" ", "%s")
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "x").exists()
    assert adb_input_text_args("a b")[2] == "a%sb"


# -- the environment, on a device stand-in ---------------------------------------------------
class StandInDevice:
    """An :class:`AppiumDevice` stand-in: scripted screenshots, recorded gestures."""

    def __init__(self, screens, fail_after: int | None = None) -> None:
        self.screens, self.fail_after = list(screens), fail_after
        self.gestures: list[Gesture] = []
        self.shots = 0

    def screenshot(self):
        self.shots += 1
        if self.fail_after is not None and self.shots > self.fail_after:
            raise DeviceUnavailable("device offline")
        return self.screens[min(self.shots - 1, len(self.screens) - 1)]

    def window_size(self):
        return (1080, 2280)

    def perform(self, g):
        self.gestures.append(g)

    def press_keys(self, codes):
        self.gestures += [Gesture("key", keycode=c) for c in codes]

    def quit(self):
        pass


WHITE = Image.new("RGB", (108, 228), (255, 255, 255))
HOME = Image.new("RGB", (108, 228), (20, 40, 90))
SHOP = Image.new("RGB", (108, 228), (200, 30, 30))


class ScreenJudge:
    def reset(self):
        pass

    def judge(self, task, prev, cur, **kw):
        return JudgeResult(Verdict.SUCCESS if cur.getpixel((0, 0))[0] == 200
                           else Verdict.FAILURE)



def _env(device, **cfg):
    return AndroidEnv(AndroidConfig(settle_s=0, blank_wait_s=0, **cfg), judge=ScreenJudge(),
                      horizon=3, device=device, sleep=lambda s: None)


def test_android_env_steps_judges_and_retries_blank_screens():
    dev = StandInDevice([HOME, WHITE, WHITE, SHOP])
    env = _env(dev)
    obs, _ = env.reset(task="Go to shop.com")
    assert obs.screenshot is HOME and dev.gestures[0].keycode == 3  # minimal reset: Home
    obs, r, term, trunc, info = env.step(format_action(Action.tap(x=0.5, y=0.5)))
    assert (r, term, trunc) == (1.0, True, False) and info["blank_captures"] == 2
    assert dev.gestures[1] == Gesture("tap", start=(540.0, 1140.0), end=(540.0, 1140.0))


def test_a_lost_device_or_a_blank_screen_is_an_infrastructure_truncation():
    env = _env(StandInDevice([HOME], fail_after=1))
    env.reset(task="Go to shop.com")
    *_, trunc, info = env.step(format_action(Action(ActionType.PRESS_BACK)))
    assert trunc and info["truncation"] == TRUNCATION_INFRA and "offline" in info["reason"]
    env = _env(StandInDevice([HOME, WHITE]), blank_retries=2)
    env.reset(task="Go to shop.com")
    *_, trunc, info = env.step(format_action(Action(ActionType.PRESS_BACK)))
    assert trunc and info["truncation"] == TRUNCATION_INFRA and "blank" in info["reason"]
    # in a fleet: a device that cannot even reset leaves the fleet; the only one gone, the
    # collection stops saying so (the task was never the agent's to fail, issue 29)
    fleet = SyncFleet(lambda slot: _env(StandInDevice([WHITE])), 1, quarantine_probe_s=600)
    with pytest.raises(NoDevicesLeft, match="blank screen after reset") as e:
        fleet.collect(ScriptedBatchAgent(lambda s: None), ["Go to shop.com"], ScreenTable(),
                      id_prefix="a")
    assert e.value.episodes == [] and fleet.stats.quarantined == 1
    # a device never quarantined (quarantine_after 0) and a task of one attempt: after the
    # device's free start, the task's one attempt is its infrastructure truncation
    fleet = SyncFleet(lambda slot: _env(StandInDevice([WHITE])), 1, max_task_attempts=1,
                      quarantine_after=0)
    eps = fleet.collect(ScriptedBatchAgent(lambda s: None), ["Go to shop.com"], ScreenTable(),
                        id_prefix="b")
    assert eps[0].trajectory.ending is Ending.INFRA and not eps[0].trajectory.steps


# -- the task lifecycle on the stand-in (spec/DARWIN.md A.2, A.3) ---------------------------
TAP = Gesture("tap", start=(10, 20), end=(10, 20))
SWIPE = Gesture("swipe", start=(1, 2), end=(3, 4))


def test_android_setup_runs_before_the_first_screenshot_and_teardown_after_the_episode():
    dev = StandInDevice([HOME, SHOP])
    env = AndroidEnv(AndroidConfig(settle_s=0, blank_wait_s=0), judge=ScreenJudge(), horizon=3,
                     device=dev, sleep=lambda s: None, setup=[{"tap": [10, 20]}],
                     teardown=[{"swipe": [1, 2, 3, 4]}])
    _, info = env.reset(task="Go to shop.com")
    assert info["setup"] == "done" and dev.gestures == [Gesture("key", keycode=3), TAP]
    assert dev.shots == 1
    *_, term, _, info = env.step(format_action(Action.tap(x=0.5, y=0.5)))
    assert term and info["teardown"] == "done" and dev.gestures[-1] == SWIPE
    assert len(dev.gestures) == 4  # Home, setup tap, the agent's tap, teardown swipe


def test_android_hard_reset_every_k_episodes_and_after_a_failed_setup():
    dev = StandInDevice([HOME])
    env = AndroidEnv(AndroidConfig(settle_s=0), horizon=3, device=dev, sleep=lambda s: None,
                     hard_reset_every=2, hard_reset=[{"swipe": [1, 2, 3, 4]}])
    kinds = []
    for _ in range(5):
        _, info = env.reset(task="t")
        kinds.append(info["reset"])
    assert kinds == ["hard", "home", "hard", "home", "hard"]
    assert dev.gestures.count(SWIPE) == 3
    with pytest.raises(ValueError, match="hard_reset_every needs"):
        AndroidEnv(AndroidConfig(), hard_reset_every=2)
    calls = []
    env = AndroidEnv(AndroidConfig(settle_s=0), device=StandInDevice([HOME], fail_after=1),
                     sleep=lambda s: None, hard_reset_every=10,
                     hard_reset=lambda: calls.append("snapshot"), setup=[{"tap": [1, 1]}])
    env.reset(task="t")
    env.device = StandInDevice([HOME])
    env.reset(task="t")
    assert calls == ["snapshot"]  # episode 2 of 10: Home
    env.device.perform = lambda g: (_ for _ in ()).throw(DeviceUnavailable("no touch"))
    with pytest.raises(PhaseFailed, match=r"setup phase failed: command 0 \(tap \[1, 1\]\)"):
        env.reset(task="t")
    env.device = StandInDevice([HOME])
    _, info = env.reset(task="t")
    assert info["reset"] == "hard" and calls == ["snapshot"] * 2


def test_an_android_setup_that_fails_is_an_infrastructure_truncation_in_a_fleet():
    def make(slot):
        dev = StandInDevice([HOME])
        dev.perform = lambda g: (_ for _ in ()).throw(DeviceUnavailable("screen locked"))
        return AndroidEnv(AndroidConfig(settle_s=0), judge=ScreenJudge(), device=dev,
                          sleep=lambda s: None, setup=[{"tap": [1, 1]}], reset=lambda: None)

    with SyncFleet(make, 1) as fleet:
        eps = fleet.collect(ScriptedBatchAgent(lambda s: None), ["Go to shop.com"],
                            ScreenTable(), id_prefix="a")
    t = eps[0].trajectory
    assert t.ending is Ending.INFRA and not t.steps and not t.is_usable
    assert "setup phase failed" in t.truncation_reason and "screen locked" in t.truncation_reason


# -- the emulator manager, on a stand-in SDK --------------------------------------------------
def _fake_sdk(tmp_path: Path) -> tuple[Path, Path, Path]:
    log = tmp_path / "calls.log"
    sdk = tmp_path / "sdk"
    (sdk / "emulator").mkdir(parents=True)
    (sdk / "platform-tools").mkdir()
    head = (f"#!{sys.executable}\nimport sys, time\n"
            f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n")
    emu = sdk / "emulator" / "emulator"
    emu.write_text(head + "time.sleep(600)\n")
    adb = sdk / "platform-tools" / "adb"
    adb.write_text(head + "print('1' if 'sys.boot_completed' in sys.argv else '')\n")
    appium = tmp_path / "appium"
    appium.write_text(head + "import http.server\n"
                      "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
                      "http.server.HTTPServer(('127.0.0.1', port), "
                      "http.server.SimpleHTTPRequestHandler).serve_forever()\n")
    for f in (emu, adb, appium):
        f.chmod(0o755)
    return sdk, appium, log


def test_missing_sdk_tools_fail_early_with_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.delenv("ANDROID_SDK_ROOT", raising=False)
    monkeypatch.delenv("ANDROID_HOME", raising=False)
    with pytest.raises(SdkToolMissing, match="ANDROID_SDK_ROOT"):
        EmulatorManager(EmulatorConfig(avd="x", appium=[sys.executable]))
    with pytest.raises(SdkToolMissing, match=r"emulator at .*adb at .*Appium"):
        EmulatorManager(EmulatorConfig(avd="x", sdk_root=str(tmp_path),
                                       appium=["no-such-appium-here"]))


@pytest.mark.slow
def test_emulator_manager_clones_resets_and_stops_only_its_own(tmp_path):
    sdk, appium, log = _fake_sdk(tmp_path)
    cfg = EmulatorConfig(avd="pixel", n=2, sdk_root=str(sdk), appium=[str(appium)],
                         appium_base_port=free_port(), hard_reset_every=3, boot_timeout_s=30)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with EmulatorManager(cfg) as m:
            assert [m.serial(i) for i in range(2)] == ["emulator-5554", "emulator-5556"]
            assert m.android_config(1).udid == "emulator-5556"
            pids = m.pids()
            assert len(set(pids)) == 4 and bystander.pid not in pids
            assert [m.reset(0) for _ in range(3)] == ["snapshot", "snapshot", "hard"]
            m.home(1)
        calls = log.read_text().splitlines()
        assert sum("-avd pixel -port 5554 -read-only" in c for c in calls) == 2  # + hard reset
        assert any("-port 5556" in c and "-snapshot digirl" in c for c in calls)
        assert any(c.endswith("-no-snapshot-load") for c in calls)
        assert calls.count("-s emulator-5554 emu avd snapshot load digirl") == 2
        assert "-s emulator-5556 shell input keyevent 3" in calls
        for pid in pids:  # all of ours are gone ...
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        assert bystander.poll() is None  # ... and nothing else was touched
    finally:
        bystander.kill()
        bystander.wait()


# The emulator binary is a launcher: it starts qemu and may die before it. The stand-in spawns
# a grandchild (``sleep``, ignoring SIGTERM with -stubborn), writes its pid to -pidfile, then
# sleeps, or exits once the -crash file appears (leaving the grandchild behind).
EMULATOR_TREE = """
import os, subprocess, sys, time
args = sys.argv[1:]
cmd = "trap '' TERM; exec sleep 600" if "-stubborn" in args else "exec sleep 600"
child = subprocess.Popen(["sh", "-c", cmd])
pidfile = args[args.index("-pidfile") + 1]
with open(pidfile + ".tmp", "w") as f:
    f.write(str(child.pid))
os.replace(pidfile + ".tmp", pidfile)
if "-crash" in args:
    flag = args[args.index("-crash") + 1]
    while not os.path.exists(flag):
        time.sleep(0.05)
    sys.exit(3)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead and waiting for its new parent, does not)."""
    if Path("/proc").is_dir():
        try:
            return (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0] \
                != "Z"
        except FileNotFoundError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_for(cond, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["plain", "stubborn", "crashed"])
@pytest.mark.slow
def test_stopping_an_emulator_ends_the_process_group_it_started(tmp_path, mode):
    sdk, appium, _ = _fake_sdk(tmp_path)
    (sdk / "emulator" / "emulator").write_text(f"#!{sys.executable}\n{EMULATOR_TREE}")
    pidfile, crash = tmp_path / "grandchild.pid", tmp_path / "crash-now"
    extra = {"plain": [], "stubborn": ["-stubborn"], "crashed": ["-crash", str(crash)]}[mode]
    cfg = EmulatorConfig(avd="pixel", sdk_root=str(sdk), appium=[str(appium)],
                         appium_base_port=free_port(), boot_timeout_s=30, stop_timeout_s=1.0,
                         emulator_args=["-pidfile", str(pidfile), *extra])
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a group not ours
    m = EmulatorManager(cfg)
    try:
        m.start()  # the manager's own code path: Popen in a new session, group recorded
        _wait_for(pidfile.exists, "the grandchild")
        grandchild = int(pidfile.read_text())
        leader = m.emulators[0]
        assert m.groups[leader.pid] == leader.pid == os.getpgid(grandchild) != os.getpgid(0)
        if mode == "crashed":
            crash.touch()
            _wait_for(lambda: os.waitid(os.P_PID, leader.pid,
                                        os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None,
                      "the launcher to exit")
            assert _alive(grandchild)  # the launcher is gone, its qemu is not
    finally:
        t0 = time.monotonic()
        m.stop()
        took = time.monotonic() - t0
    try:
        _wait_for(lambda: not _alive(grandchild), "the grandchild to die", timeout_s=5.0)
        assert not m.groups and not m.emulators and not m.servers
        assert leader.returncode is not None  # reaped, last
        if mode == "stubborn":  # SIGTERM ignored: SIGKILL after stop_timeout_s
            assert took >= 1.0
        assert bystander.poll() is None  # another group is never touched
    finally:
        bystander.kill()
        bystander.wait()


# -- a real Appium server with the fake driver ----------------------------------------------
NODE = ROOT / ".ci" / "node"
APPIUM = NODE / "node_modules" / ".bin" / "appium"


@pytest.fixture(scope="module")
def appium_server():
    if shutil.which("node") is None or not APPIUM.exists():
        missing(f"node or {APPIUM} is missing (bash .ci/install_appium.sh installs Appium and "
                "its fake driver)")
    optional_import("appium")
    port = free_port()
    env = {**os.environ, "APPIUM_HOME": str(NODE / "appium-home")}
    argv = [str(APPIUM), "--address", "127.0.0.1", "--port", str(port), "--log-level", "error"]

    class Server:
        url = f"http://127.0.0.1:{port}"
        proc = None

        def start(self):
            self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1):
                        return
                except OSError:
                    time.sleep(0.3)
            raise RuntimeError("the Appium server did not start")

        def stop(self):
            if self.proc is not None and self.proc.poll() is None:
                self.proc.terminate()
                self.proc.wait(timeout=20)

    server = Server()
    server.start()
    yield server
    server.stop()


def _fake_app(tmp_path: Path) -> str:
    app = tmp_path / "app.xml"
    app.write_text('<app width="1080" height="2280"><MockListView>'
                   '<MockInputField id="search" /></MockListView></app>')
    return str(app)


def _config(server, tmp_path, **kw) -> AndroidConfig:
    caps = {"platformName": "Fake", "appium:automationName": "Fake",
            "appium:deviceName": "Fake", "appium:app": _fake_app(tmp_path)}
    return AndroidConfig(server_url=server.url, capabilities=caps, call_timeout_s=20,
                         retry_wait_s=1.0, **kw)


@pytest.mark.android
@pytest.mark.slow
def test_appium_session_screenshot_window_size_tap_swipe(appium_server, tmp_path):
    dev = AppiumDevice(_config(appium_server, tmp_path))
    try:
        img = dev.screenshot()
        assert isinstance(img, Image.Image) and img.width > 0
        assert dev.window_size() == (1080, 2280)
        dev.perform(to_gesture(Action.tap(x=0.25, y=0.5), 1080, 2280))
        dev.perform(to_gesture(Action.swipe(x0=0.5, y0=0.8, x1=0.5, y1=0.2), 1080, 2280))
        log = dev.driver.get_log("actions")
        moves = [[a for a in seq[0]["actions"] if a["type"] == "pointerMove"] for seq in log]
        assert (moves[0][0]["x"], moves[0][0]["y"]) == (270, 1140)
        assert [(m["x"], m["y"]) for m in moves[1]] == [(540, 1824), (540, 456)]
    finally:
        dev.quit()


@pytest.mark.android
@pytest.mark.slow
def test_appium_reconnects_after_the_server_restarts(appium_server, tmp_path):
    dev = AppiumDevice(_config(appium_server, tmp_path, connect_retries=3))
    try:
        dev.screenshot()
        appium_server.stop()
        appium_server.start()
        assert dev.screenshot().width > 0  # the old session is gone: a new one
        assert dev.reconnects >= 1
        appium_server.stop()
        with pytest.raises(DeviceUnavailable, match="unavailable after 3 reconnects"):
            dev.screenshot()
    finally:
        appium_server.start()
        dev.quit()


@pytest.mark.android
@pytest.mark.slow
def test_android_env_on_the_fake_driver(appium_server, tmp_path):
    """A reset (a snapshot-style callable: the fake driver has no Home key) and a tap step
    judged on the screenshot, through the real server."""
    cfg = _config(appium_server, tmp_path, settle_s=0, connect_retries=0)
    env = AndroidEnv(cfg, judge=ScreenJudge(), horizon=2, reset=lambda: None)
    try:
        obs, _ = env.reset(task="Open the app")
        obs, r, term, trunc, info = env.step(format_action(Action.tap(x=0.5, y=0.5)))
        assert info["verdict"] is Verdict.FAILURE and not (term or trunc)
        assert env.device.driver.get_log("actions")
    finally:
        env.close()


@pytest.mark.android
@pytest.mark.slow
def test_a_page_source_that_is_not_uiautomator2_s_is_a_clear_error_not_a_crash(
        appium_server, tmp_path):
    """The fake driver's page source is its own XML (``<AppiumAUT>``), not UiAutomator2's
    layout: with ``ui_tree`` on, each step says so in ``info["ui_tree_error"]`` and the
    episode goes on, judged."""
    cfg = _config(appium_server, tmp_path, settle_s=0, connect_retries=0, ui_tree=True)
    env = AndroidEnv(cfg, judge=ScreenJudge(), horizon=2, reset=lambda: None)
    try:
        _, info = env.reset(task="Open the app")
        assert info["ui_tree"] is None and "not <hierarchy>" in info["ui_tree_error"]
        *_, trunc, info = env.step(format_action(Action.tap(x=0.5, y=0.5)))
        assert info["verdict"] is Verdict.FAILURE and not trunc
        assert "not <hierarchy>" in info["ui_tree_error"]
    finally:
        env.close()


@pytest.mark.android
@pytest.mark.slow
def test_android_lifecycle_commands_reach_the_fake_driver(appium_server, tmp_path):
    """Setup and teardown commands through the real server: the fake driver's session
    "thing" (``fake: setThing`` / ``fake: getThing``) and its action log show them; a setup
    whose check fails is an infrastructure truncation in a fleet."""
    cfg = _config(appium_server, tmp_path, settle_s=0, connect_retries=0)
    setup = [{"script": "fake: setThing", "args": {"thing": "cart: 1 lamp"}},
             {"script": "fake: getThing", "expect": "cart: 1 lamp"}, {"tap": [100, 200]}]
    teardown = [{"script": "fake: setThing", "args": {"thing": "cart: empty"}},
                {"swipe": [540, 1800, 540, 400]}]
    env = AndroidEnv(cfg, judge=ScreenJudge(), horizon=1, reset=lambda: None, setup=setup,
                     teardown=teardown)
    try:
        env.reset(task="Buy a lamp")
        d = env.device.driver
        assert d.execute_script("fake: getThing") == "cart: 1 lamp"
        taps = [[a for a in seq[0]["actions"] if a["type"] == "pointerMove"]
                for seq in d.get_log("actions")]
        assert (taps[-1][0]["x"], taps[-1][0]["y"]) == (100, 200)
        *_, trunc, info = env.step(format_action(Action.tap(x=0.5, y=0.5)))
        assert trunc and info["truncation"] == "budget" and info["teardown"] == "done"
        assert d.execute_script("fake: getThing") == "cart: empty"
        moves = [[a for a in seq[0]["actions"] if a["type"] == "pointerMove"]
                 for seq in d.get_log("actions")]
        assert [(m["x"], m["y"]) for m in moves[-1]] == [(540, 1800), (540, 400)]
    finally:
        env.close()

    bad = [{"script": "fake: getThing", "expect": "a state the device is not in"}]
    with SyncFleet(lambda slot: AndroidEnv(cfg, reset=lambda: None, setup=bad), 1) as fleet:
        eps = fleet.collect(ScriptedBatchAgent(lambda s: None), ["Buy a lamp"], ScreenTable(),
                            id_prefix="f")
    t = eps[0].trajectory
    assert t.ending is Ending.INFRA and not t.is_usable
    assert "setup phase failed: command 0 (script fake: getThing)" in t.truncation_reason
