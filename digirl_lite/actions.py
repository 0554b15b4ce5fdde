"""The action space and the AutoUI action string (spec/DIGIRL.md section 2).

A policy writes one string per step, for example::

    Action Decision: "action_type": "DUAL_POINT", "touch_point": "[0.6200, 0.5000]",
    "lift_point": "[0.6200, 0.5000]", "typed_text": ""

(on one line). Everything before the marker ``Action Decision: `` is ignored. Points are
normalised to [0, 1], written with four decimals and in **[y, x]** order: reading them as
(x, y) is the classic bug that lands a tap 302.7 px away on a 1080 x 2280 screen.

Malformed output (what a sampled policy writes early in training) never raises here:
:func:`parse_action` returns an *invalid* :class:`Action` that carries the raw text and the
reason it was rejected, and :func:`to_gesture` maps it to a ``"invalid"`` gesture.

What an environment does with an invalid action (the project's decision, issue 2):
    It is a **no-op that costs one step of the budget**. The screen does not change, the step
    is recorded with its reason (``Action.invalid_reason``), the reward is 0 and the episode
    goes on until the step budget H runs out. The released DigiRL code maps some parse
    failures to an idle action and others (a string it cannot even split) to
    TASK_IMPOSSIBLE, which ends the episode; we treat every malformed string alike, as idle,
    so that one stray token does not end an attempt and every failure of that kind is
    visible in the data under one name. The step then earns a low step advantage (Eq. 4.3:
    the screen did not change, so the critic's TD term is about zero) and is filtered out of
    the actor's data, which is what the method wants from a wasted step.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import Enum

__all__ = [
    "ACTION_MARKER",
    "NO_POINT",
    "TAP_MAX_SQUARED_PX",
    "KEYCODE_HOME",
    "KEYCODE_ENTER",
    "ActionType",
    "Action",
    "ActionParseError",
    "Gesture",
    "parse_action",
    "format_action",
    "to_gesture",
]

ACTION_MARKER = "Action Decision: "
"""Everything up to and including the last occurrence of this marker is ignored."""

NO_POINT: tuple[float, float] = (-1.0, -1.0)
"""What non-point actions carry in touch_point / lift_point (written ``"[-1.0, -1.0]"``)."""

TAP_MAX_SQUARED_PX = 10.0
"""Touch and lift closer than this (squared pixel distance, strict) make a tap, else a swipe
(released code, ``autoui_utils``)."""

KEYCODE_HOME = 3
"""Android keycode for HOME."""
KEYCODE_ENTER = 66
"""Android keycode for ENTER."""

MAX_RAW_CHARS = 2048
"""How much of a rejected string an invalid action keeps (the rest is counted, not stored)."""


class ActionType(str, Enum):
    """The seven AutoUI action types, plus INVALID for output that does not parse."""

    DUAL_POINT = "DUAL_POINT"
    TYPE = "TYPE"
    PRESS_BACK = "PRESS_BACK"
    PRESS_HOME = "PRESS_HOME"
    PRESS_ENTER = "PRESS_ENTER"
    STATUS_TASK_COMPLETE = "STATUS_TASK_COMPLETE"
    TASK_IMPOSSIBLE = "TASK_IMPOSSIBLE"
    INVALID = "INVALID"
    """Not part of the AutoUI format: a string that failed to parse (see module docstring)."""


class ActionParseError(ValueError):
    """Raised by ``parse_action(text, strict=True)`` and by ``Action`` validation."""


def _check_point(name: str, point: tuple[float, float]) -> tuple[float, float]:
    if len(point) != 2:
        raise ActionParseError(f"{name} must have 2 coordinates [y, x], got {len(point)}")
    y, x = (float(point[0]), float(point[1]))
    for axis, v in (("y", y), ("x", x)):
        if not math.isfinite(v):
            raise ActionParseError(f"{name} {axis} is not a finite number: {v}")
        if not 0.0 <= v <= 1.0:
            raise ActionParseError(f"{name} {axis}={v} is outside [0, 1]")
    return (y, x)


@dataclass(frozen=True)
class Action:
    """One validated action.

    Attributes:
        action_type: one of :class:`ActionType`.
        touch_yx: touch point as **(y, x)**, normalised to [0, 1] (DUAL_POINT only; else
            ``NO_POINT``).
        lift_yx: lift point as **(y, x)** (DUAL_POINT only; else ``NO_POINT``).
        typed_text: the text of a TYPE action ("" otherwise).
        invalid_reason: why the string was rejected (INVALID only).
        raw: the rejected string, cut to ``MAX_RAW_CHARS`` (INVALID only).

    Construction validates: a DUAL_POINT needs both points finite and in [0, 1]; a TYPE
    needs non-empty text. Build taps and swipes with :meth:`tap` / :meth:`swipe`, which take
    ``x`` and ``y`` by name so the [y, x] order cannot be confused.
    """

    action_type: ActionType
    touch_yx: tuple[float, float] = NO_POINT
    lift_yx: tuple[float, float] = NO_POINT
    typed_text: str = ""
    invalid_reason: str | None = None
    raw: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        try:
            atype = ActionType(self.action_type)
        except ValueError:
            raise ActionParseError(f"unknown action type {self.action_type!r}") from None
        object.__setattr__(self, "action_type", atype)
        if atype is ActionType.DUAL_POINT:
            object.__setattr__(self, "touch_yx", _check_point("touch_point", self.touch_yx))
            object.__setattr__(self, "lift_yx", _check_point("lift_point", self.lift_yx))
        else:
            object.__setattr__(self, "touch_yx", NO_POINT)
            object.__setattr__(self, "lift_yx", NO_POINT)
        if atype is ActionType.TYPE:
            if not isinstance(self.typed_text, str) or not self.typed_text:
                raise ActionParseError("TYPE needs a non-empty typed_text")
        elif atype is not ActionType.INVALID:
            object.__setattr__(self, "typed_text", "")
        if atype is ActionType.INVALID:
            if not self.invalid_reason:
                raise ActionParseError("an INVALID action must carry its invalid_reason")
        elif self.invalid_reason is not None:
            raise ActionParseError("only INVALID actions carry an invalid_reason")

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def tap(cls, *, x: float, y: float) -> Action:
        """A tap at normalised (x, y)."""
        return cls(ActionType.DUAL_POINT, (y, x), (y, x))

    @classmethod
    def swipe(cls, *, x0: float, y0: float, x1: float, y1: float) -> Action:
        """A swipe from normalised (x0, y0) to (x1, y1)."""
        return cls(ActionType.DUAL_POINT, (y0, x0), (y1, x1))

    @classmethod
    def type_text(cls, text: str) -> Action:
        return cls(ActionType.TYPE, typed_text=text)

    @classmethod
    def key(cls, action_type: ActionType | str) -> Action:
        """PRESS_BACK / PRESS_HOME / PRESS_ENTER / STATUS_TASK_COMPLETE / TASK_IMPOSSIBLE."""
        return cls(ActionType(action_type))

    @classmethod
    def invalid(cls, reason: str, raw: str | None = None) -> Action:
        if raw is not None and len(raw) > MAX_RAW_CHARS:
            raw = raw[:MAX_RAW_CHARS] + f"...[{len(raw) - MAX_RAW_CHARS} more chars]"
        return cls(ActionType.INVALID, invalid_reason=reason, raw=raw)

    # -- properties ---------------------------------------------------------------------
    @property
    def is_valid(self) -> bool:
        return self.action_type is not ActionType.INVALID

    @property
    def ends_episode(self) -> bool:
        """True for STATUS_TASK_COMPLETE and TASK_IMPOSSIBLE (the agent stops)."""
        return self.action_type in (ActionType.STATUS_TASK_COMPLETE, ActionType.TASK_IMPOSSIBLE)


# --------------------------------------------------------------------------------------
# Parsing and formatting
# --------------------------------------------------------------------------------------
_POINT_RE = re.compile(r"^\s*\[\s*(?P<a>[^,\[\]]*?)\s*,\s*(?P<b>[^,\[\]]*?)\s*\]\s*$")
_FIELDS_RE = re.compile(
    r'^\s*"action_type"\s*:\s*"(?P<type>[^"]*)"\s*,'
    r'\s*"touch_point"\s*:\s*"(?P<touch>[^"]*)"\s*,'
    r'\s*"lift_point"\s*:\s*"(?P<lift>[^"]*)"\s*,'
    r'\s*"typed_text"\s*:\s*"(?P<text>.*)"\s*(?:</s>)?\s*$',
    re.DOTALL,
)


def _parse_point(name: str, s: str) -> tuple[float, float]:
    m = _POINT_RE.match(s)
    if m is None:
        raise ActionParseError(f"{name} is not of the form [y, x]: {s[:40]!r}")
    try:
        y, x = float(m["a"]), float(m["b"])
    except ValueError:
        raise ActionParseError(f"{name} has a non-number coordinate: {s[:40]!r}") from None
    return (y, x)


def _parse_fields(body: str) -> Action:
    m = _FIELDS_RE.match(body)
    if m is None:
        raise ActionParseError(
            'fields are not "action_type", "touch_point", "lift_point", "typed_text" in order'
        )
    name = m["type"].strip()
    try:
        atype = ActionType(name)
    except ValueError:
        atype = None
    if atype is None or atype is ActionType.INVALID:
        raise ActionParseError(f"unknown action type {name[:40]!r}")
    if atype is ActionType.DUAL_POINT:
        touch = _parse_point("touch_point", m["touch"])
        lift = _parse_point("lift_point", m["lift"])
        return Action(atype, touch, lift)
    if atype is ActionType.TYPE:
        return Action(atype, typed_text=m["text"])
    return Action(atype)


def _parse_strict(text: str) -> Action:
    if not isinstance(text, str):
        raise ActionParseError(f"expected a string, got {type(text).__name__}")
    starts = [m.end() for m in re.finditer(re.escape(ACTION_MARKER), text)]
    if not starts:
        if '"action_type"' not in text:
            raise ActionParseError("no 'Action Decision: ' marker and no action fields")
        starts = [0]
    # The last marker normally starts the action; but typed text may itself contain the
    # marker, so fall back to earlier ones and report the last one's error if none parses.
    first_error: ActionParseError | None = None
    for start in reversed(starts):
        try:
            return _parse_fields(text[start:])
        except ActionParseError as e:
            first_error = first_error or e
    assert first_error is not None
    raise first_error


def parse_action(text: str, *, strict: bool = False) -> Action:
    """Parse an AutoUI action string (spec/DIGIRL.md section 2).

    Args:
        text: model output; everything before the last ``"Action Decision: "`` is ignored
            (without the marker, the string must start with the fields). A trailing
            ``</s>`` is tolerated.
        strict: raise :class:`ActionParseError` on malformed text instead of returning an
            invalid action.

    Returns:
        The parsed :class:`Action`; for malformed text (unless ``strict``) an action of type
        ``INVALID`` whose ``invalid_reason`` says what was wrong. Never raises otherwise.
    """
    try:
        return _parse_strict(text)
    except ActionParseError as e:
        if strict:
            raise
        raw = text if isinstance(text, str) else repr(text)
        return Action.invalid(str(e), raw=raw)
    except Exception as e:  # defensive: the environment path must never raise
        if strict:
            raise ActionParseError(f"unexpected parse failure: {e!r}") from e
        return Action.invalid(f"unexpected parse failure: {e!r}", raw=repr(text)[:MAX_RAW_CHARS])


def _fmt_point(p: tuple[float, float]) -> str:
    if p == NO_POINT:
        return "[-1.0, -1.0]"
    return f"[{p[0]:.4f}, {p[1]:.4f}]"


def format_action(action: Action) -> str:
    """Write ``action`` in the exact AutoUI format (4 decimals, [y, x], marker first).

    ``parse_action(format_action(a)) == a`` whenever a's coordinates have at most four
    decimals; otherwise the coordinates come back rounded to four decimals.

    Raises:
        ActionParseError: for an INVALID action, which has no AutoUI form.
    """
    if not action.is_valid:
        raise ActionParseError(
            f"an INVALID action has no AutoUI string (reason: {action.invalid_reason})"
        )
    return (
        f'{ACTION_MARKER}"action_type": "{action.action_type.value}", '
        f'"touch_point": "{_fmt_point(action.touch_yx)}", '
        f'"lift_point": "{_fmt_point(action.lift_yx)}", '
        f'"typed_text": "{action.typed_text}"'
    )


# --------------------------------------------------------------------------------------
# Gestures
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Gesture:
    """What a device does for an action, in pixels.

    Attributes:
        kind: ``"tap"``, ``"swipe"``, ``"key"``, ``"back"``, ``"type"``, ``"stop"`` or
            ``"invalid"``.
        start, end: ``(x, y)`` pixels, unrounded (tap: both the touch point).
        keycode: Android keycode for ``"key"``.
        text: the text for ``"type"``; the action type name for ``"stop"``; the reason for
            ``"invalid"``.
    """

    kind: str
    start: tuple[float, float] | None = None
    end: tuple[float, float] | None = None
    keycode: int | None = None
    text: str | None = None


def to_gesture(action: Action, width: int, height: int) -> Gesture:
    """Turn an action into pixels on a ``width`` x ``height`` screen.

    x = point_x * width, y = point_y * height, unrounded; touch and lift with squared
    distance < 10 px^2 make a tap at the touch point, else a swipe (released code).
    HOME and ENTER are keycodes 3 and 66; BACK is the driver's back().
    """
    if width <= 0 or height <= 0:
        raise ValueError(f"screen size must be positive, got {width} x {height}")
    t = action.action_type
    if t is ActionType.DUAL_POINT:
        (ty, tx), (ly, lx) = action.touch_yx, action.lift_yx
        start = (tx * width, ty * height)
        end = (lx * width, ly * height)
        d2 = (end[0] - start[0]) ** 2 + (end[1] - start[1]) ** 2
        if d2 < TAP_MAX_SQUARED_PX:
            return Gesture("tap", start=start, end=start)
        return Gesture("swipe", start=start, end=end)
    if t is ActionType.TYPE:
        return Gesture("type", text=action.typed_text)
    if t is ActionType.PRESS_HOME:
        return Gesture("key", keycode=KEYCODE_HOME)
    if t is ActionType.PRESS_ENTER:
        return Gesture("key", keycode=KEYCODE_ENTER)
    if t is ActionType.PRESS_BACK:
        return Gesture("back")
    if t in (ActionType.STATUS_TASK_COMPLETE, ActionType.TASK_IMPOSSIBLE):
        return Gesture("stop", text=t.value)
    return Gesture("invalid", text=action.invalid_reason)
