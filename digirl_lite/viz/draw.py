"""Draw an action on the screenshot it was taken on (Pillow).

A tap is a dot, a swipe an arrow from touch to lift, and every other action a label (keys,
typed text, stop, invalid) in a band at the bottom of the screen. Pixel positions come from
:func:`digirl_lite.actions.to_gesture`, the same mapping a device uses, so the [y, x] order of
the stored points (``Action.touch_yx``) is read in exactly one place.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from digirl_lite.actions import Action, ActionType, to_gesture

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image, ImageDraw, ImageFont

__all__ = ["ACTION_COLOR", "DEVICE_SIZE", "action_label", "draw_action", "thumbnail"]

DEVICE_SIZE = (1080, 2280)
"""(width, height) of the screen the actions were taken on: the paper's emulators and the
simulator. Tap vs swipe is decided at this size (the 10 px^2 rule of ``to_gesture``), so a
thumbnail shows the gesture the device performed."""

ACTION_COLOR = (230, 0, 122)
"""Magenta: it stands out on the simulator's white, grey and brand-coloured screens."""

_KEY_LABELS = {
    ActionType.PRESS_BACK: "BACK",
    ActionType.PRESS_HOME: "HOME",
    ActionType.PRESS_ENTER: "ENTER",
    ActionType.STATUS_TASK_COMPLETE: "TASK COMPLETE",
    ActionType.TASK_IMPOSSIBLE: "TASK IMPOSSIBLE",
}


def action_label(action: Action, max_chars: int = 40) -> str:
    """A short human label: ``tap x=0.50 y=0.62``, ``swipe up``, ``type "usb-c cable"``,
    ``BACK``, ``invalid: <reason>``. Points are printed as x, y (screen order)."""

    def cut(s: str) -> str:
        return s if len(s) <= max_chars else s[: max_chars - 3] + "..."

    t = action.action_type
    if t is ActionType.DUAL_POINT:
        (ty, tx), (ly, lx) = action.touch_yx, action.lift_yx
        if to_gesture(action, *DEVICE_SIZE).kind == "tap":
            return f"tap x={tx:.2f} y={ty:.2f}"
        dx, dy = lx - tx, ly - ty
        direction = ("right" if dx > 0 else "left") if abs(dx) > abs(dy) else (
            "down" if dy > 0 else "up")
        return f"swipe {direction} ({tx:.2f},{ty:.2f})->({lx:.2f},{ly:.2f})"
    if t is ActionType.TYPE:
        return cut(f'type "{action.typed_text}"')
    if t is ActionType.INVALID:
        return cut(f"invalid: {action.invalid_reason}")
    return _KEY_LABELS[t]


@lru_cache(maxsize=8)
def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def _arrow_head(x0: float, y0: float, x1: float, y1: float, length: float
                ) -> list[tuple[float, float]]:
    """The triangle of an arrow pointing from (x0, y0) to (x1, y1), tip at (x1, y1)."""
    angle = math.atan2(y1 - y0, x1 - x0)
    spread = math.radians(28)
    return [(x1, y1),
            (x1 - length * math.cos(angle - spread), y1 - length * math.sin(angle - spread)),
            (x1 - length * math.cos(angle + spread), y1 - length * math.sin(angle + spread))]


def fit_text(draw: ImageDraw.ImageDraw, text: str, font: Any, max_width: float) -> str:
    """``text``, cut and ended with "..." until it is at most ``max_width`` pixels wide."""
    cut = text
    while draw.textlength(cut, font=font) > max_width and len(cut) > 4:
        cut = cut[:-4] + "..."
    return cut


def thumbnail(image: Image.Image, width: int | None = None) -> Image.Image:
    """An RGB copy of ``image``, resized to ``width`` (aspect kept) when given."""
    from PIL import Image

    im = image.convert("RGB")  # always a copy
    if width is not None and im.width != width:
        im = im.resize((width, max(1, round(im.height * width / im.width))), Image.BILINEAR)
    return im


def draw_action(image: Image.Image, action: Action, *, color: tuple[int, int, int] = ACTION_COLOR,
                width: int | None = None) -> Image.Image:
    """A copy of ``image`` (RGB) with ``action`` drawn on it.

    Args:
        image: the screenshot the action was taken on (any size: points are normalised).
        action: the action; DUAL_POINT points are read through :func:`to_gesture`.
        color: the mark's colour.
        width: resize the copy to this width first (aspect kept), e.g. for thumbnails.

    Returns:
        A new RGB image; ``image`` is not modified.
    """
    from PIL import ImageDraw

    im = thumbnail(image, width)
    w, h = im.size
    d = ImageDraw.Draw(im)
    r = max(3.0, 0.035 * w)  # dot radius: a fingertip on a phone is ~7% of the width
    line = max(2, round(0.012 * w))
    g = to_gesture(action, *DEVICE_SIZE)
    sx, sy = w / DEVICE_SIZE[0], h / DEVICE_SIZE[1]
    if g.kind == "tap":
        x, y = g.start[0] * sx, g.start[1] * sy
        d.ellipse((x - 1.8 * r, y - 1.8 * r, x + 1.8 * r, y + 1.8 * r), outline=color,
                  width=line)
        d.ellipse((x - r, y - r, x + r, y + r), fill=color)
        return im
    if g.kind == "swipe":
        (x0, y0), (x1, y1) = (g.start[0] * sx, g.start[1] * sy), (g.end[0] * sx, g.end[1] * sy)
        d.ellipse((x0 - r, y0 - r, x0 + r, y0 + r), fill=color)
        d.line((x0, y0, x1, y1), fill=color, width=line)
        d.polygon(_arrow_head(x0, y0, x1, y1, 3 * r), fill=color)
        return im
    # keys, typed text, stop, invalid: a label in a band near the bottom of the screen
    text = action_label(action, max_chars=60)
    font = _font(max(8, round(0.05 * w)))
    pad = max(2, round(0.02 * w))
    text = fit_text(d, text, font, w - 4 * pad)
    left, top, right, bottom = d.textbbox((0, 0), text, font=font)
    box_w = right - left + 2 * pad
    box_h = bottom - top + 2 * pad
    y_box = h - box_h - round(0.06 * h)
    x_box = (w - box_w) / 2
    d.rounded_rectangle((x_box, y_box, x_box + box_w, y_box + box_h), radius=pad, fill=color)
    d.text((x_box + pad - left, y_box + pad - top), text, font=font, fill=(255, 255, 255))
    return im
