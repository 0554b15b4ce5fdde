"""One simulated phone behind the protocol: its session, its crash state, its routes and the
commands they run, on a :class:`~digirl_lite.envs.sim.env.SimPhoneEnv`
(:mod:`digirl_lite.envs.sim.serve` has the protocol's whole story)."""

from __future__ import annotations

import base64
import dataclasses
import io
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from PIL import Image

from digirl_lite.actions import Gesture
from digirl_lite.envs.sim.env import SimPhoneEnv
from digirl_lite.envs.sim.serve.wire import (
    ELEMENT_KEY,
    INFO,
    IS_SUCCESS,
    PRESS_KEY,
    SET_TASK,
    W3CError,
    _key_gesture,
    pointer_gestures,
)
from digirl_lite.envs.sim.tasks import parse_task
from digirl_lite.envs.sim.world import (
    HEIGHT,
    WIDTH,
    initial_state,
    is_success,
    reached_first_milestone,
    ui_nodes,
)

__all__ = ["encode_png", "CRASH_DOWN_S", "PNG_COMPRESS_LEVEL", "NO_FOCUS"]

CRASH_DOWN_S = 10.0
"""How long a crashed phone answers nothing but errors: longer than the client's default
reconnects (2 x 2 s), so a crash is an infrastructure truncation, as in process."""
PNG_COMPRESS_LEVEL = 1
"""zlib level of the screenshots. On 1080 x 2280 screens (2 busy cores) level 1 encodes in
~60 ms and decodes in ~40 ms, Pillow's default 6 in ~90 and ~54 ms, at 80 vs 48 kB: on the
loopback the bytes are nearly free, the milliseconds are not. Encodings are cached per
screen, so a screen seen again costs none."""
NO_FOCUS = "screen"
"""The active element's id when no field has focus."""


def encode_png(img: Image.Image) -> str:
    """``img`` as a base64 PNG (what a WebDriver screenshot returns)."""
    buf = io.BytesIO()
    img.save(buf, "PNG", compress_level=PNG_COMPRESS_LEVEL)
    return base64.b64encode(buf.getvalue()).decode("ascii")


_SID = r"/session/(?P<sid>[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (method, re.compile(path), name) for method, path, name in [
        ("GET", r"/status", "status"),
        ("POST", r"/session", "new_session"),
        ("DELETE", _SID, "delete_session"),
        ("GET", _SID + r"/screenshot", "screenshot"),
        ("GET", _SID + r"/source", "source"),
        ("GET", _SID + r"/window/rect", "window_rect"),
        ("GET", _SID + r"/window/[^/]+/size", "window_size"),
        ("POST", _SID + r"/actions", "perform_actions"),
        ("DELETE", _SID + r"/actions", "release_actions"),
        ("POST", _SID + r"/appium/device/press_keycode", "press_keycode"),
        ("POST", _SID + r"/back", "back"),
        ("GET", _SID + r"/element/active", "active_element"),
        ("POST", _SID + r"/element/(?P<eid>[^/]+)/value", "send_keys"),
        ("POST", _SID + r"/execute/sync", "execute"),
        ("GET", r"/digirl/state", "watch"),
        ("GET", r"/digirl/state/screenshot", "watch_screenshot"),
    ]
]


class _Phone:
    """One simulated phone behind the protocol: its session, its crash state, the commands.

    Every command runs under one lock: a phone does one thing at a time.
    """

    def __init__(self, env: SimPhoneEnv, world: str, seed: int | None, crash_down_s: float,
                 screen_cache: int) -> None:
        self.env, self.world, self.seed = env, world, seed
        self.crash_down_s = crash_down_s
        self.env.state = initial_state(env.day)  # on the launcher, no task until setTask
        self.lock = threading.Lock()
        self.session: str | None = None
        self.down_until = 0.0
        self._elements: set[str] = set()
        self._screens: OrderedDict[str, str] = OrderedDict()  # screen id -> base64 PNG
        self._screen_cache = screen_cache
        self._shown_loading = False  # the last screenshot showed a page still loading
        self._last_png: str | None = None  # the last screenshot sent since the task was set
        self._screenshots = 0  # screenshots sent since the task was set
        self._reached = False  # the task's first milestone reached since it was set
        self._scripts: dict[str, Callable[[dict], Any]] = {
            SET_TASK: self._set_task, IS_SUCCESS: self._is_success, INFO: self._info,
            PRESS_KEY: lambda args: self._do(_key_gesture(args)),
        }

    def handle(self, method: str, path: str, body: dict) -> Any:
        """The ``value`` of the answer to one request, or a :class:`W3CError`."""
        with self.lock:
            left = self.down_until - time.monotonic()
            if left > 0:
                raise W3CError("unknown error", f"simulated device crash: the phone is down "
                                                f"for another {left:.1f} s")
            known_path = False
            for m, pattern, name in _ROUTES:
                match = pattern.fullmatch(path)
                if match is None:
                    continue
                known_path = True
                if m != method:
                    continue
                args = match.groupdict()
                sid = args.pop("sid", None)
                if sid is not None and sid != self.session:
                    raise W3CError("invalid session id", f"no session {sid!r} on this phone "
                                                         f"(it ended, or the phone restarted)")
                return getattr(self, name)(body, **args)
            if known_path:
                raise W3CError("unknown method", f"{method} {path} is not a command here")
            raise W3CError("unknown command", f"{method} {path} is not a command of the "
                                              f"simulated phone")

    def _do(self, gesture: Gesture) -> None:
        self._shown_loading = False
        if self.env.apply_gesture(gesture) is None:
            self.down_until = time.monotonic() + self.crash_down_s
            self.session = None
            self.env.state = initial_state(self.env.day)  # it comes back on the launcher
            raise W3CError("unknown error", f"simulated device crash: the phone stopped "
                                            f"answering for {self.crash_down_s:g} s")
        if self.env.task is not None and not self._reached:
            self._reached = reached_first_milestone(self.env.state, self.env.task)

    # -- session -------------------------------------------------------------------------
    def status(self, body: dict) -> dict:
        return {"ready": True, "message": "digirl-sim-phone ready"}

    def new_session(self, body: dict) -> dict:
        caps = body.get("capabilities") or {}
        first = (caps.get("firstMatch") or [{}])[0]
        asked = {**(caps.get("alwaysMatch") or {}), **first}
        platform = str(asked.get("platformName", "Android"))
        if platform.lower() != "android":
            raise W3CError("session not created", f"this is an Android phone, not {platform!r}")
        self.session = uuid.uuid4().hex  # replaces any other (Appium's --session-override)
        return {"sessionId": self.session,
                "capabilities": {**asked, "platformName": "Android",
                                 "appium:deviceName": "digirl-sim-phone",
                                 "appium:deviceScreenSize": f"{WIDTH}x{HEIGHT}"}}

    def delete_session(self, body: dict) -> None:
        self.session = None

    # -- screen --------------------------------------------------------------------------
    def screenshot(self, body: dict) -> str:
        state = self.env.state
        if state is not None and state.loading and self._shown_loading:
            # the client waited and looked again (AndroidEnv's blank-screen guard): the
            # page has loaded by now, as a real one would
            self.env.state = dataclasses.replace(state, loading=False)
        self._shown_loading = bool(self.env.state is not None and self.env.state.loading)
        img, screen_id = self.env.capture()
        png = self._screens.get(screen_id)
        if png is None:
            png = self._screens[screen_id] = encode_png(img)
            while len(self._screens) > self._screen_cache:
                self._screens.popitem(last=False)
        else:
            self._screens.move_to_end(screen_id)
        self._last_png = png
        self._screenshots += 1
        return png

    def source(self, body: dict) -> str:
        """The screen's UI tree in UiAutomator2's XML layout (bounds in the gesture space,
        as a device's are in its screen's pixels)."""
        from digirl_lite.envs.uitree import to_source

        return to_source(ui_nodes(self.env.state), WIDTH, HEIGHT)

    def window_rect(self, body: dict) -> dict:
        # the gesture space: the world's pixels, whatever size screenshots are drawn at
        return {"x": 0, "y": 0, "width": WIDTH, "height": HEIGHT}

    def window_size(self, body: dict) -> dict:
        return {"width": WIDTH, "height": HEIGHT}

    # -- input ---------------------------------------------------------------------------
    def perform_actions(self, body: dict) -> None:
        for gesture in pointer_gestures(body.get("actions")):
            self._do(gesture)

    def release_actions(self, body: dict) -> None:
        """Nothing stays pressed between calls (see :func:`pointer_gestures`)."""

    def press_keycode(self, body: dict) -> None:
        self._do(_key_gesture(body))

    def back(self, body: dict) -> None:
        self._do(Gesture("back"))

    def active_element(self, body: dict) -> dict:
        element = self.env.state.focus or NO_FOCUS
        self._elements.add(element)
        return {ELEMENT_KEY: element}

    def send_keys(self, body: dict, eid: str) -> None:
        if eid not in self._elements:
            raise W3CError("no such element", f"no element {eid!r} (ask for element/active)")
        text = body.get("text")
        if not isinstance(text, str):  # W3C sends only "text"; older clients only "value"
            text = "".join(body.get("value") or [])
        self._do(Gesture("type", text=text))

    # -- scripts -------------------------------------------------------------------------
    def execute(self, body: dict) -> Any:
        script, args = body.get("script"), body.get("args") or [{}]
        if not isinstance(args, list) or not isinstance(args[0], dict):
            raise W3CError("invalid argument", "args must be a list holding one JSON object")
        run = self._scripts.get(script)
        if run is None:
            raise W3CError("unsupported operation", f"script {script!r}: the simulated phone "
                                                    f"runs only {sorted(self._scripts)}")
        return run(args[0])

    def _set_task(self, args: dict) -> dict:
        text, seed = args.get("task"), args.get("seed")
        if text is not None and not isinstance(text, str):
            raise W3CError("invalid argument", f"task must be a string or null, got {text!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                                 or seed < 0):
            raise W3CError("invalid argument", f"seed must be a non-negative integer or null, "
                                               f"got {seed!r}")
        try:
            task = self.env.load_task(None if text is None else parse_task(text), seed)
        except ValueError as e:  # UnsupportedTaskError says what is not simulated
            raise W3CError("invalid argument", f"task {text!r}: {e}") from e
        if seed is not None:
            self.seed = seed
        self._last_png, self._screenshots = None, 0
        self._reached = reached_first_milestone(self.env.state, task)
        return {"horizon": self.env.horizon, "task": task.text}

    def _is_success(self, args: dict) -> dict:
        if self.env.task is None:
            raise W3CError("invalid argument", f"no task set: call {SET_TASK!r} first")
        return {"success": bool(is_success(self.env.state, self.env.task)),
                "reached_first_milestone": self._reached}

    # -- watching (no session: an observer never takes the client's) -----------------------
    def watch(self, body: dict) -> dict:
        """What an observer may read without a session and without changing anything: the
        task, whether it is done now, the drift day and seed, whether a client holds a
        session, and how many screenshots were sent since the task was set."""
        task = self.env.task
        return {"world": self.world, "day": self.env.day, "seed": self.seed,
                "task": task.text if task else None,
                "success": bool(is_success(self.env.state, task)) if task else None,
                "session": self.session is not None, "screenshots": self._screenshots}

    def watch_screenshot(self, body: dict) -> str | None:
        """The last screenshot sent to the client since the task was set (base64 PNG), or
        null; nothing is captured (a capture draws from the phone's random stream)."""
        return self._last_png

    def _info(self, args: dict) -> dict:
        task = self.env.task
        return {"world": self.world, "day": self.env.day, "seed": self.seed,
                "task": task.text if task else None}
