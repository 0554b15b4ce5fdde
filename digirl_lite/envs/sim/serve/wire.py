"""The W3C WebDriver wire as the simulated phone speaks it: the error objects, the W3C pointer
actions as taps and swipes, the keycodes, and the names of the vendor scripts
(:mod:`digirl_lite.envs.sim.serve` has the protocol's whole story)."""

from __future__ import annotations

import math
from typing import Any

from digirl_lite.actions import TAP_MAX_SQUARED_PX, Gesture

__all__ = ["W3CError", "w3c_error", "pointer_gestures", "SET_TASK", "IS_SUCCESS", "INFO",
           "PRESS_KEY", "KEYCODE_BACK", "ELEMENT_KEY"]

SET_TASK = "digirl: setTask"
IS_SUCCESS = "digirl: isSuccess"
INFO = "digirl: info"
PRESS_KEY = "mobile: pressKey"
"""What ``driver.press_keycode`` sends in appium-python-client 6 (an execute script)."""
KEYCODE_BACK = 4
ELEMENT_KEY = "element-6066-11e4-a52e-4f735466cecf"
"""The W3C web element identifier."""

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


def _key_gesture(args: dict) -> Gesture:
    code = args.get("keycode")
    if isinstance(code, bool) or not isinstance(code, int):
        raise W3CError("invalid argument", f"keycode must be an integer, got {code!r}")
    return Gesture("back") if code == KEYCODE_BACK else Gesture("key", keycode=code)
