"""The simulated phone as a device: one phone served over the W3C WebDriver / Appium protocol.

Why: the Android environment's own code (``AppiumDevice`` / ``AndroidEnv`` through
appium-python-client: HTTP, sessions, PNG screenshots, reconnects, fault handling) can then
be run, tested and timed without an emulator, and a seeded served phone shows the same
screens as the in-process :class:`~digirl_lite.envs.sim.env.SimPhoneEnv`::

    python -m digirl_lite.envs.sim.serve --port 0 --world webshop --seed 0
    # prints one line: digirl-sim-phone listening on http://127.0.0.1:PORT

    AndroidConfig(server_url=url, capabilities={"platformName": "Android",
                                                "appium:automationName": "UiAutomator2"})

The phone is a ``SimPhoneEnv`` whose state, surprises, faults and renderer the requests
drive through :meth:`SimPhoneEnv.apply_gesture` and :meth:`SimPhoneEnv.capture`, the same
methods its ``step`` uses; so the random draws come in ``step``'s order (crash, surprises,
latency per gesture; one blank-capture draw per screenshot, retried by the client as
``SimPhoneEnv`` retries in process) and the same seed and gestures give the same pixels.

Served (the calls of :func:`digirl_lite.envs.android.device.perform` and ``AppiumDevice`` as
appium-python-client 6 and Selenium 4 send them): ``GET /status``; ``POST /session``,
``DELETE /session/{id}``; ``GET .../screenshot`` (base64 PNG); ``GET .../source`` (the UI
tree, UiAutomator2's XML layout); ``GET .../window/rect`` and
the JSONWP ``GET .../window/{handle}/size``; ``POST .../actions`` (W3C pointer actions: a
down and up closer than ``TAP_MAX_SQUARED_PX`` is a tap, else a swipe from the down point to
the up point), ``DELETE .../actions``; the ``mobile: pressKey`` script that the client's
``press_keycode`` sends, and older clients' ``POST .../appium/device/press_keycode`` (3
HOME, 66 ENTER, 4 BACK); ``POST .../back``; ``GET .../element/active`` and
``POST .../element/{id}/value`` (typing).
Anything else is a W3C ``unknown command`` (404).

Vendor extension, through ``driver.execute_script(NAME, {...})`` (a real device has no such
thing; the environment's own judge and task set-up use it):

* ``"digirl: setTask"`` ``{"task": str | null, "seed": int | null}`` -> ``{"horizon": int,
  "task": str}``: reseed (when ``seed`` is given), set the task (null: drawn from the
  ``world``'s list, as ``SimPhoneEnv.reset(None, seed)``) and put the phone on the
  launcher of its day. An instruction the simulator does not model: ``invalid argument``.
* ``"digirl: isSuccess"`` ``{}`` -> ``{"success": bool, "reached_first_milestone": bool}``
  (``world.is_success`` on the current state; whether any state since the task was set
  reached its first milestone, ``world.reached_first_milestone``, which the evaluation's
  failure kinds read; ``invalid argument`` before any task was set).
* ``"digirl: info"`` ``{}`` -> ``{"world": str, "day": int, "seed": int | null,
  "task": str | null}``; ``seed`` is the one the generator was last seeded with.

For observers (a judge server that reads the ground truth, a dashboard), two session-less
reads that change nothing and never take the client's session:
``GET /digirl/state`` -> ``info``'s fields and ``"success"`` (null before any task),
``"session"`` (a client holds one) and ``"screenshots"`` (sent since the task was set);
``GET /digirl/state/screenshot`` -> the last screenshot sent since the task was set (base64
PNG), or null.

Where the served phone differs from the in-process one, or from a real device:

* Gestures arrive in integer pixels (``perform`` rounds); a tap lands within half a pixel
  of its in-process point, so only taps that close to an element's edge, swipes whose
  length rounds differently (the scroll moves one pixel more or less) and touch-lift pairs
  whose squared distance rounds across ``TAP_MAX_SQUARED_PX`` can differ.
* The ``blank`` surprise (a page that shows white while it loads) is near-white, so the
  client's blank-screen guard (``AndroidEnv``, spec section 4) waits and looks again; a
  second screenshot with no gesture in between shows the page loaded, as a real page would
  be by then. In process the agent sees the white page and its next action is swallowed
  while the page loads; over the wire that step is not lost.
* A crash takes the phone down for ``crash_down_s``: every request, new sessions
  included, answers HTTP 500 ``unknown error`` ("simulated device crash: ..."); it comes
  back on the launcher. ``SimPhoneEnv`` just ends the episode.
* A new session replaces the current one (Appium's ``--session-override``), so a client
  that lost its session (a crash, a killed client) can always reconnect.
* The active element is the focused field, or the screen itself when nothing has focus
  (Selenium: "the element with focus, or BODY"); typing into the screen changes nothing,
  as in process, instead of a ``no such element`` that the client would count as a lost
  device.

Every error is a W3C error object, ``{"value": {"error", "message", "stacktrace": ""}}``
with its HTTP status, and nothing else (issue 32): a bug in the phone answers 500 ``unknown
error`` naming the exception's type, its traceback goes to the server's log (the
``digirl_lite.envs.sim.serve`` logger; stderr by default), never to the client. A request
body over ``max_body_bytes`` (:data:`MAX_BODY_BYTES`) is refused with 413 before a byte of
it is read, and a ``Content-Length`` that is not one non-negative number (or a chunked body)
with 400; both close that connection (its unread body would be taken for the next request)
and the phone goes on serving.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import io
import json
import logging
import math
import os
import re
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from PIL import Image

from digirl_lite.actions import TAP_MAX_SQUARED_PX, Gesture
from digirl_lite.envs.sim.env import Faults, SimPhoneEnv
from digirl_lite.envs.sim.tasks import parse_task
from digirl_lite.envs.sim.world import (
    HEIGHT,
    WIDTH,
    Surprises,
    initial_state,
    is_success,
    reached_first_milestone,
    ui_nodes,
)

__all__ = ["SimPhoneServer", "PhoneProcess", "spawn_phones", "W3CError", "w3c_error",
           "SET_TASK", "IS_SUCCESS", "INFO", "URL_LINE", "MAX_BODY_BYTES", "encode_png",
           "pointer_gestures", "main"]

SET_TASK = "digirl: setTask"
IS_SUCCESS = "digirl: isSuccess"
INFO = "digirl: info"
PRESS_KEY = "mobile: pressKey"
"""What ``driver.press_keycode`` sends in appium-python-client 6 (an execute script)."""
URL_LINE = "digirl-sim-phone listening on "
"""The start of the one line the server prints; the URL follows."""
CRASH_DOWN_S = 10.0
"""How long a crashed phone answers nothing but errors: longer than the client's default
reconnects (2 x 2 s), so a crash is an infrastructure truncation, as in process."""
PNG_COMPRESS_LEVEL = 1
"""zlib level of the screenshots. On 1080 x 2280 screens (2 busy cores) level 1 encodes in
~60 ms and decodes in ~40 ms, Pillow's default 6 in ~90 and ~54 ms, at 80 vs 48 kB: on the
loopback the bytes are nearly free, the milliseconds are not. Encodings are cached per
screen, so a screen seen again costs none."""
KEYCODE_BACK = 4
ELEMENT_KEY = "element-6066-11e4-a52e-4f735466cecf"
"""The W3C web element identifier."""
NO_FOCUS = "screen"
"""The active element's id when no field has focus."""
MAX_BODY_BYTES = 1 << 20
"""The largest request body the phone reads (1 MiB): the largest a client sends, a typed
text or a W3C action chain, is a few kB; a larger ``Content-Length`` is refused (413)
before the body is read, so a client cannot make the phone hold gigabytes."""

log = logging.getLogger("digirl_lite.envs.sim.serve")

_HTTP_STATUS = {"invalid argument": 400, "no such element": 404, "invalid session id": 404,
                "unknown command": 404, "unknown method": 405, "session not created": 500,
                "unknown error": 500, "unsupported operation": 500}
"""The HTTP status of each W3C error code used here (WebDriver, "Handling errors")."""


class W3CError(Exception):
    """A W3C WebDriver error: ``error`` is the code (``"invalid argument"``, ...);
    ``status`` the HTTP status when it is not the code's own (413 for a body too large)."""

    def __init__(self, error: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{error}: {message}")
        self.error, self.message, self._status = error, message, status

    @property
    def status(self) -> int:
        return self._status or _HTTP_STATUS[self.error]


def w3c_error(error: str, message: str) -> dict[str, Any]:
    """The body of a W3C error answer; the stack trace is always empty (it stays in the
    server's log)."""
    return {"value": {"error": error, "message": message, "stacktrace": ""}}


def encode_png(img: Image.Image) -> str:
    """``img`` as a base64 PNG (what a WebDriver screenshot returns)."""
    buf = io.BytesIO()
    img.save(buf, "PNG", compress_level=PNG_COMPRESS_LEVEL)
    return base64.b64encode(buf.getvalue()).decode("ascii")


# -- W3C pointer actions -----------------------------------------------------------------------
def _coordinate(action: dict, axis: str) -> float:
    v = action.get(axis, 0)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise W3CError("invalid argument", f"pointerMove {axis} must be a number, got {v!r}")
    return float(v)


def _touch(down: tuple[float, float], up: tuple[float, float]) -> Gesture:
    """``to_gesture``'s rule on the points the client sent: tap or swipe."""
    d2 = (up[0] - down[0]) ** 2 + (up[1] - down[1]) ** 2
    if d2 < TAP_MAX_SQUARED_PX:
        return Gesture("tap", start=down, end=down)
    return Gesture("swipe", start=down, end=up)


def _finger(steps: list) -> list[Gesture]:
    """The gestures of one pointer's action list: each down ... up is one."""
    x = y = 0.0
    down: tuple[float, float] | None = None
    out = []
    for a in steps:
        kind = a.get("type") if isinstance(a, dict) else None
        if kind == "pointerMove":
            origin = a.get("origin", "viewport")
            dx, dy = _coordinate(a, "x"), _coordinate(a, "y")
            if origin == "viewport":
                x, y = dx, dy
            elif origin == "pointer":
                x, y = x + dx, y + dy
            else:
                raise W3CError("unsupported operation", "pointerMove relative to an element: "
                                                        "the simulated phone has no elements")
        elif kind == "pointerDown":
            down = (x, y)
        elif kind == "pointerUp":
            if down is not None:
                out.append(_touch(down, (x, y)))
            down = None
        elif kind == "pointerCancel":
            down = None
        elif kind != "pause":
            raise W3CError("invalid argument", f"unknown pointer action {kind!r}")
    if down is not None:  # never lifted in this call: lifted where it is (as a release)
        out.append(_touch(down, (x, y)))
    return out


def pointer_gestures(sources: Any) -> list[Gesture]:
    """The taps and swipes of a W3C ``actions`` list, in order (one finger).

    Pauses and durations are not waited out; input sources other than a pointer may only
    pause (Selenium adds an idle keyboard to keep ticks aligned).

    Raises:
        W3CError: malformed actions, or what a one-finger touch screen cannot do.
    """
    if not isinstance(sources, list):
        raise W3CError("invalid argument", "'actions' must be a list of input sources")
    gestures: list[Gesture] = []
    fingers = 0
    for src in sources:
        if not isinstance(src, dict) or not isinstance(src.get("actions"), list):
            raise W3CError("invalid argument", "an input source needs an 'actions' list")
        if src.get("type") != "pointer":
            if any(not isinstance(a, dict) or a.get("type") != "pause" for a in src["actions"]):
                raise W3CError("unsupported operation",
                               f"{src.get('type')!r} input: the simulated phone takes touches, "
                               "keycodes and typing into the focused field")
            continue
        found = _finger(src["actions"])
        fingers += bool(found)
        gestures += found
    if fingers > 1:
        raise W3CError("unsupported operation", "multi-touch: the simulated phone has one finger")
    return gestures


# -- the phone behind the protocol -------------------------------------------------------------
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


def _key_gesture(args: dict) -> Gesture:
    code = args.get("keycode")
    if isinstance(code, bool) or not isinstance(code, int):
        raise W3CError("invalid argument", f"keycode must be an integer, got {code!r}")
    return Gesture("back") if code == KEYCODE_BACK else Gesture("key", keycode=code)


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


# -- HTTP ------------------------------------------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client pools its connections
    disable_nagle_algorithm = True  # no 40 ms delayed-ACK stall between header and body
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        super().finish()

    def do_GET(self) -> None:  # noqa: N802 - the names http.server dispatches to
        self._answer("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._answer("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._answer("DELETE")

    def _answer(self, method: str) -> None:
        try:
            body = self._body()
            path = urlsplit(self.path).path.rstrip("/") or "/"
            status, payload = 200, {"value": self.server.phone.handle(method, path, body)}
        except W3CError as e:
            status, payload = e.status, w3c_error(e.error, e.message)
        except Exception as e:  # a bug must reach the client as a W3C error, not a hang
            # the traceback to the phone's log only: it is no business of the client's
            log.exception("simulated phone: %s %s failed", method, self.path)
            status, payload = 500, w3c_error("unknown error", f"the simulated phone failed "
                                             f"({type(e).__name__}); its log has the details")
        self._send(status, payload)

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache")
        if self.close_connection:  # a body left unread: the next bytes are not a request
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, headers too long, a method
        with no ``do_`` handler) as W3C errors too, not its HTML page."""
        error = ("unknown method" if code == 501 else "invalid argument" if code < 500
                 else "unknown error")
        self.close_connection = True
        self._send(code, w3c_error(error, message or explain or self.responses.get(
            code, ("error",))[0]))

    def _content_length(self) -> int:
        """The body's length in bytes, checked before any of it is read: refused (the
        connection closed) when it is not one non-negative number, the body is chunked, or
        it is over the server's ``max_body_bytes``."""
        values = [v.strip() for v in self.headers.get_all("Content-Length") or []]
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            self.close_connection = True
            raise W3CError("invalid argument", "chunked request bodies are not supported: "
                                               "send a Content-Length")
        if not values:
            return 0
        if len(set(values)) > 1 or not re.fullmatch(r"[0-9]{1,19}", values[0]):
            self.close_connection = True
            shown = ", ".join(repr(v[:40]) for v in values)
            raise W3CError("invalid argument", f"Content-Length must be one non-negative "
                                               f"integer, got {shown}")
        n, limit = int(values[0]), self.server.max_body_bytes
        if n > limit:
            self.close_connection = True
            raise W3CError("invalid argument", f"request body of {n} bytes refused: the "
                                               f"limit is {limit} bytes", status=413)
        return n

    def _body(self) -> dict:
        raw = self.rfile.read(self._content_length())
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise W3CError("invalid argument", f"the request body is not JSON: {e}") from e
        if not isinstance(body, dict):
            raise W3CError("invalid argument", "the request body must be a JSON object")
        return body

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a fleet's phones answer thousands of requests a minute."""


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # close() ends the kept-alive connections itself

    def __init__(self, address: tuple[str, int], phone: _Phone,
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.phone = phone
        self.max_body_bytes = max_body_bytes
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer (killed, timed out) is not news."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class SimPhoneServer:
    """One simulated phone on ``http://host:port`` (in this process).

    Args:
        port: TCP port (0: a free one; see :attr:`url`).
        host: address to bind (loopback by default: the protocol has no authentication).
        world: ``SimPhoneEnv``'s task list (``"webshop"``, ``"general"``, their ``_test``
            lists or a task file): where ``setTask`` without a task draws from.
        seed: seeds the phone's generator (surprises, faults) until ``setTask`` reseeds it.
        day: drift day (1 = the layout demonstrations were recorded on).
        surprises, faults: :class:`Surprises` / :class:`Faults` or dicts of their fields.
        crash_down_s: how long a crashed phone answers only errors.
        width, height: screenshot size (the gesture space stays 1080 x 2280).
        screen_cache: screens kept drawn and encoded (as ``SimPhoneEnv``'s render cache).
        max_body_bytes: the largest request body read; a larger one is refused (413)
            unread.
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", world: str = "webshop",
                 seed: int | None = 0, day: int = 1,
                 surprises: Surprises | dict | None = None, faults: Faults | dict | None = None,
                 crash_down_s: float = CRASH_DOWN_S, width: int = WIDTH, height: int = HEIGHT,
                 screen_cache: int = 8, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        if crash_down_s < 0:
            raise ValueError(f"crash_down_s must be non-negative, got {crash_down_s}")
        if max_body_bytes < 0:
            raise ValueError(f"max_body_bytes must be non-negative, got {max_body_bytes}")
        env = SimPhoneEnv(world, day=day, surprises=surprises, faults=faults, seed=seed,
                          width=width, height=height, render_cache=screen_cache)
        phone = _Phone(env, world, seed, crash_down_s, screen_cache)
        self._httpd = _HTTPServer((host, port), phone, max_body_bytes)
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        """Answer requests in this thread until :meth:`close` (from another thread)."""
        self._httpd.serve_forever(poll_interval=0.05)

    def start(self) -> SimPhoneServer:
        """Serve in a daemon thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.serve_forever, daemon=True,
                                            name=f"digirl-sim-phone {self.url}")
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and drop every open connection (clients see a lost device)."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
        with self._httpd.connections_lock:
            for conn in list(self._httpd.connections):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:  # already closed by the client
                    pass
        self._httpd.server_close()

    def __enter__(self) -> SimPhoneServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- phones in their own processes -----------------------------------------------------------
class PhoneProcess:
    """A served phone in a child process (see :func:`spawn_phones`). ``kill()`` and
    ``close()`` end this process only."""

    def __init__(self, proc: subprocess.Popen, url: str, stderr: Any) -> None:
        self.proc, self.url, self._stderr = proc, url, stderr

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_text(self) -> str:
        """What the phone wrote to stderr so far (tracebacks, argument errors)."""
        if self._stderr.closed:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL: the device is lost, mid-request or not."""
        if self.alive():
            self.proc.kill()
        self._reap()

    def close(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``."""
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._reap()

    def _reap(self) -> None:
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> PhoneProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _cli_value(value: Any) -> str:
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    return json.dumps(value) if isinstance(value, dict) else str(value)


def _read_urls(procs: list[subprocess.Popen], deadline: float) -> list[str | None]:
    """The URL each process printed (None: it exited first), read until ``deadline``."""
    sel = selectors.DefaultSelector()
    bufs: dict[int, bytes] = {}
    urls: list[str | None] = [None] * len(procs)
    for i, p in enumerate(procs):
        sel.register(p.stdout, selectors.EVENT_READ, i)
        bufs[i] = b""
    try:
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
                i = key.data
                chunk = os.read(key.fd, 4096)
                bufs[i] += chunk
                if b"\n" in bufs[i] or not chunk:
                    sel.unregister(key.fileobj)
                    line = bufs[i].split(b"\n", 1)[0].decode(errors="replace")
                    if line.startswith(URL_LINE):
                        urls[i] = line[len(URL_LINE):].strip()
    finally:
        sel.close()
    return urls


def spawn_phones(n: int, world: str = "webshop", seed: int = 0, *, timeout_s: float = 60.0,
                 ports: Sequence[int] | None = None, **kw: Any) -> list[PhoneProcess]:
    """Start ``n`` served phones, each in its own process on a free port.

    Phone ``i`` is seeded ``seed + i`` (as ``SimEnvFactory`` seeds slots). The processes
    start together and each announces its URL on stdout.

    Args:
        n: how many phones.
        world, seed: as :class:`SimPhoneServer`.
        timeout_s: how long to wait for all of them to listen.
        ports: phone ``i`` listens on ``ports[i]`` (e.g. a phone restarted where a lost one
            was, issue 29); None: each on a free port.
        **kw: more :class:`SimPhoneServer` options (``day``, ``surprises``, ``faults``,
            ``crash_down_s``, ``width``, ``height``, ``host``, ``screen_cache``,
            ``max_body_bytes``).

    Returns:
        One :class:`PhoneProcess` per phone; close them (they are not ended for you).

    Raises:
        RuntimeError: a phone exited or did not listen within ``timeout_s`` (its stderr is
            in the message); the phones already started are closed first.
    """
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    if ports is not None and len(ports) != n:
        raise ValueError(f"ports must name {n} ports, got {len(ports)}")
    root = str(Path(__file__).resolve().parents[3])  # the child imports this checkout
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    extra = [a for k, v in kw.items() for a in (f"--{k.replace('_', '-')}", _cli_value(v))]
    procs, errs = [], []
    for i in range(n):
        port = str(ports[i]) if ports is not None else "0"
        argv = [sys.executable, "-m", "digirl_lite.envs.sim.serve", "--port", port,
                "--world", world, "--seed", str(seed + i), *extra]
        errs.append(tempfile.TemporaryFile())
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errs[-1], env=env))
    urls = _read_urls(procs, time.monotonic() + timeout_s)
    phones = [PhoneProcess(p, u or "", e) for p, u, e in zip(procs, urls, errs)]
    bad = [i for i, u in enumerate(urls) if u is None]
    if bad:
        i = bad[0]
        try:  # its stdout closed (it is exiting) or the deadline passed
            why = f"exited with code {procs[i].wait(timeout=2.0)}"
        except subprocess.TimeoutExpired:
            why = f"did not listen within {timeout_s:g} s"
        detail = phones[i].stderr_text().strip()[-2000:]
        for phone in phones:
            phone.close()
        raise RuntimeError(f"{len(bad)} of {n} simulated phones failed to start; phone {i} "
                           f"{why}:\n{detail or '(nothing on stderr)'}")
    return phones


# -- command line ----------------------------------------------------------------------------
def _json_arg(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object of field values")
    return value


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m digirl_lite.envs.sim.serve",
                                 description="Serve one simulated phone over the "
                                             "WebDriver / Appium protocol.")
    ap.add_argument("--port", type=int, default=4723, help="0: a free port (default: "
                    "Appium's 4723, where AndroidConfig looks by default)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--world", default="webshop",
                    help="task list setTask draws from: webshop, general, *_test, a file")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--day", type=int, default=1, help="drift day")
    ap.add_argument("--surprises", type=_json_arg, help='e.g. {"popup": 0.5, "blank": 0}')
    ap.add_argument("--faults", type=_json_arg, help='e.g. {"crash": 0.01}')
    ap.add_argument("--crash-down-s", type=float, default=CRASH_DOWN_S)
    ap.add_argument("--width", type=int, default=WIDTH, help="screenshot width")
    ap.add_argument("--height", type=int, default=HEIGHT, help="screenshot height")
    ap.add_argument("--screen-cache", type=int, default=8)
    ap.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES,
                    help="largest request body read; a larger one is refused (413)")
    a = ap.parse_args(argv)
    server = SimPhoneServer(port=a.port, host=a.host, world=a.world, seed=a.seed, day=a.day,
                            surprises=a.surprises, faults=a.faults, crash_down_s=a.crash_down_s,
                            width=a.width, height=a.height, screen_cache=a.screen_cache,
                            max_body_bytes=a.max_body_bytes)
    print(f"{URL_LINE}{server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


if __name__ == "__main__":
    main()
