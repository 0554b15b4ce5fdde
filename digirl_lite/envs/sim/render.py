"""Drawing the simulated phone's screens (Pillow), with a cache keyed by what is on screen.

A screen is a pure function of its layout, so :func:`screen_key` (a hash of the elements)
names it, and :class:`Renderer` draws each distinct screen once per cache lifetime.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from functools import lru_cache

from PIL import Image, ImageDraw, ImageFont

from digirl_lite.envs.sim.world import HEIGHT, STATUS_H, WIDTH, Element, PhoneState, layout

__all__ = ["Renderer", "screen_key", "blank_screen"]


@lru_cache(maxsize=16)
def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def screen_key(state: PhoneState) -> str:
    """A content name for the screen of ``state`` (equal keys draw identical pixels)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(("v1", [(e.id, e.box, e.kind, e.label, e.color, e.text_color)
                          for e in layout(state)])).encode())
    return h.hexdigest()


@lru_cache(maxsize=2)
def blank_screen(width: int = WIDTH, height: int = HEIGHT) -> Image.Image:
    """A page that has not loaded: white under a dark status bar (> 93.4% near-white)."""
    im = Image.new("RGB", (width, height), (255, 255, 255))
    ImageDraw.Draw(im).rectangle((0, 0, width, STATUS_H * height // HEIGHT), fill=(32, 33, 36))
    return im


def _draw(d: ImageDraw.ImageDraw, el: Element) -> None:
    x0, y0, x1, y1 = el.box
    k = el.kind
    if k in ("bar", "card", "title", "sheet", "voice"):
        d.rectangle(el.box, fill=el.color)
        if el.label:
            size = 56 if k == "voice" else 44
            cy = (y0 + y1) // 2 if k in ("bar", "voice") else y0 + 60
            d.text((x0 + 40 if k != "voice" else WIDTH // 2, cy), el.label, font=_font(size),
                   fill=el.text_color, anchor="lm" if k != "voice" else "mm")
        if k == "voice":
            d.ellipse((WIDTH // 2 - 120, 1300, WIDTH // 2 + 120, 1540), fill=(66, 133, 244))
    elif k == "field":
        d.rounded_rectangle(el.box, radius=(y1 - y0) // 2, fill=el.color, outline=(218, 220, 224),
                            width=4)
        d.text((x0 + 50, (y0 + y1) // 2), el.label, font=_font(40), fill=el.text_color,
               anchor="lm")
    elif k == "mic":
        cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
        d.rounded_rectangle((cx - 18, cy - 36, cx + 18, cy + 12), radius=18, fill=(66, 133, 244))
        d.rectangle((cx - 4, cy + 12, cx + 4, cy + 34), fill=(66, 133, 244))
    elif k == "icon":
        cx = (x0 + x1) // 2
        d.ellipse((cx - 80, y0 + 10, cx + 80, y0 + 170), fill=el.color)
        d.text((cx, y0 + 90), el.label[:1], font=_font(72), fill=(255, 255, 255), anchor="mm")
        d.text((cx, y0 + 215), el.label, font=_font(34), fill=(32, 33, 36), anchor="mm")
    elif k == "big_text":
        d.text(((x0 + x1) // 2, (y0 + y1) // 2), el.label, font=_font(150), fill=el.color,
               anchor="mm")
    elif k == "logo":
        d.text(((x0 + x1) // 2, (y0 + y1) // 2), el.label, font=_font(140), fill=el.text_color,
               anchor="mm")
    elif k == "row":
        d.rectangle(el.box, fill=el.color)
        title, _, sub = el.label.partition("\n")
        # A row cut by the top of the list or the keyboard shows only what fits.
        if y1 - y0 > 40:
            d.rectangle((x0 + 20, y0 + 20, x0 + 220, min(y1 - 20, y0 + 220)),
                        fill=(220, 223, 228))
        if y1 - y0 > 90:
            d.text((x0 + 250, y0 + 60), title[:34], font=_font(42), fill=el.text_color,
                   anchor="lm")
        if y1 - y0 > 170:
            d.text((x0 + 250, y0 + 140), sub, font=_font(38), fill=(60, 64, 67), anchor="lm")
    elif k in ("tile", "image"):
        d.rounded_rectangle(el.box, radius=24, fill=el.color)
        if el.label:
            d.text(((x0 + x1) // 2, (y0 + y1) // 2), el.label, font=_font(48),
                   fill=(32, 33, 36), anchor="mm")
    elif k == "button":
        d.rounded_rectangle(el.box, radius=(y1 - y0) // 2, fill=el.color)
        d.text(((x0 + x1) // 2, (y0 + y1) // 2), el.label, font=_font(44), fill=el.text_color,
               anchor="mm")
    elif k == "keyboard":
        d.rectangle(el.box, fill=el.color)
        for r in range(4):
            for c in range(10):
                kx, ky = 12 + c * 106, y0 + 40 + r * 190
                d.rounded_rectangle((kx, ky, kx + 94, ky + 160), radius=14, fill=(255, 255, 255))
    elif k == "modal":
        d.rounded_rectangle(el.box, radius=30, fill=el.color, outline=(60, 64, 67), width=4)
        d.text(((x0 + x1) // 2, y0 + 260), el.label, font=_font(56), fill=el.text_color,
               anchor="mm")
    elif k == "close":
        d.ellipse(el.box, fill=el.color)
        d.text(((x0 + x1) // 2, (y0 + y1) // 2), el.label, font=_font(56), fill=el.text_color,
               anchor="mm")
    else:  # pragma: no cover - every kind above is drawn
        d.rectangle(el.box, outline=(0, 0, 0))


class Renderer:
    """Draws states at ``width`` x ``height`` and keeps the last ``cache_size`` screens.

    Returned images are shared with the cache: treat them as read-only (copy to draw on).
    """

    def __init__(self, width: int = WIDTH, height: int = HEIGHT, cache_size: int = 8) -> None:
        self.width, self.height = width, height
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Image.Image] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def render(self, state: PhoneState, key: str | None = None) -> Image.Image:
        key = key or screen_key(state)
        img = self._cache.get(key)
        if img is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            return img
        self.misses += 1
        if state.loading:
            img = blank_screen(self.width, self.height)
        else:
            img = Image.new("RGB", (WIDTH, HEIGHT), (255, 255, 255))
            d = ImageDraw.Draw(img)
            modal = state.overlay in ("popup",)
            for el in layout(state):
                if modal and el.kind == "modal":
                    # dim what is under the dialog
                    shade = Image.new("RGB", img.size, (0, 0, 0))
                    img = Image.blend(img, shade, 0.45)
                    d = ImageDraw.Draw(img)
                _draw(d, el)
            if (self.width, self.height) != (WIDTH, HEIGHT):
                img = img.resize((self.width, self.height), Image.BILINEAR)
        if self.cache_size > 0:
            self._cache[key] = img
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return img
