"""The simulated phone's screen: what is on it where, for a :class:`PhoneState`.

:func:`layout` lists every :class:`Element` drawn, bottom to top (the status bar, the page,
the keyboard, an overlay in the dialog design of the state's layout); :func:`hit_test` finds
what a tap lands on; :func:`ui_nodes` is the same screen as a UI tree; :func:`describe` says
it in words. Coordinates are pixels on a 1080 x 2280 screen.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from digirl_lite.envs.sim.catalog import APPS, SITES, site_from_domain
from digirl_lite.envs.sim.drift import _tint, drift_offset, launcher_order, results_for
from digirl_lite.envs.sim.state import Page, PhoneState
from digirl_lite.envs.sim.tasks import N_RESULTS

__all__ = ["WIDTH", "HEIGHT", "STATUS_H", "CONTENT_TOP", "KEYBOARD_TOP", "RESULT_H",
           "SCROLLABLE", "Element", "max_scroll", "layout", "hit_test", "is_tappable",
           "ui_nodes", "find", "describe"]

WIDTH, HEIGHT = 1080, 2280
STATUS_H = 80
CONTENT_TOP = 240  # below Chrome's address bar
KEYBOARD_TOP = 1480
RESULT_H = 300
SCROLLABLE = ("google_results", "shop_results")


@dataclass(frozen=True)
class Element:
    """A box on screen. ``box`` = (x0, y0, x1, y1) pixels; ``kind`` decides how it is drawn."""

    id: str
    box: tuple[int, int, int, int]
    kind: str
    label: str = ""
    color: tuple[int, int, int] = (255, 255, 255)
    text_color: tuple[int, int, int] = (32, 33, 36)

    @property
    def center(self) -> tuple[float, float]:
        x0, y0, x1, y1 = self.box
        return ((x0 + x1) / 2.0, (y0 + y1) / 2.0)

    def contains(self, x: float, y: float) -> bool:
        x0, y0, x1, y1 = self.box
        return x0 <= x < x1 and y0 <= y < y1


def _status_bar() -> list[Element]:
    return [Element("status_bar", (0, 0, WIDTH, STATUS_H), "bar", "12:30", (32, 33, 36),
                    (255, 255, 255))]


def _chrome_bar(state: PhoneState) -> list[Element]:
    p = state.page
    if state.focus == "address_bar":
        text = state.typed or "Search or type web address"
    elif p.site:
        text = SITES[p.site].domain
    elif p.kind == "google_results":
        text = f"google.com/search?q={p.query}"
    elif p.kind == "web_result":
        text = f"www.answers.example/{p.item}"
    else:
        text = "google.com"
    return [
        Element("chrome_toolbar", (0, STATUS_H, WIDTH, CONTENT_TOP), "bar", "",
                (241, 243, 244)),
        Element("address_bar", (30, 105, 1050, 215), "field", text, (255, 255, 255)),
    ]


def _list_items(state: PhoneState, top: int, titles: list[tuple[str, str]], prefix: str,
                color: tuple[int, int, int]) -> list[Element]:
    """Scrollable result rows below ``top``; rows scrolled out of view are not on screen."""
    out = []
    bottom = KEYBOARD_TOP if state.focus else HEIGHT
    for slot, (title, sub) in enumerate(titles):
        y0 = top + slot * RESULT_H - state.page.scroll
        y1 = y0 + RESULT_H - 20
        if y1 <= top or y0 >= bottom:
            continue
        box = (40, max(y0, top), 1040, min(y1, bottom))
        out.append(Element(f"{prefix}:{slot}", box, "row", f"{title}\n{sub}", (248, 249, 250),
                           color))
    return out


def max_scroll(state: PhoneState) -> int:
    if state.page.kind not in SCROLLABLE:
        return 0
    rows = N_RESULTS + (state.page.ad is not None)
    return max(0, rows * RESULT_H + 700 - HEIGHT)


def _page_elements(state: PhoneState) -> list[Element]:
    p = state.page
    d = state.day
    if p.kind == "launcher":
        els = [Element("clock_widget", (0, 220, WIDTH, 480), "big_text", "12:30",
                       (0, 0, 0), (255, 255, 255))]
        off = drift_offset(d, "launcher")
        for i, key in enumerate(launcher_order(d)):
            r, c = divmod(i, 4)
            x0, y0 = 20 + c * 260, 560 + off + r * 300
            app = APPS[key]
            els.append(Element(f"icon:{key}", (x0 + 20, y0, x0 + 240, y0 + 260), "icon",
                               app.label, _tint(app.color, d, key)))
        wy = 1960 - drift_offset(d, "search_widget") * 2
        els.append(Element("widget:search", (60, wy, 880, wy + 130), "field", "Search",
                           (255, 255, 255)))
        els.append(Element("widget:mic", (880, wy, 1020, wy + 130), "mic", "", (255, 255, 255)))
        return els
    if p.app != "chrome":
        app = APPS[p.app]
        return [
            Element("app_bar", (0, STATUS_H, WIDTH, 300), "bar", app.label,
                    _tint(app.color, d, p.app), (255, 255, 255)),
            Element("app_body", (60, 360, 1020, 1200), "card", f"Welcome to {app.label}",
                    (245, 245, 245)),
        ]
    els = _chrome_bar(state)
    if p.kind == "google_home":
        off = drift_offset(d, "google")
        els += [
            Element("google_logo", (240, 520 + off, 840, 700 + off), "logo", "Google",
                    (255, 255, 255), _tint((66, 133, 244), d, "google")),
            Element("search_box", (80, 800 + off, 870, 930 + off), "field",
                    state.typed if state.focus == "search_box" else "Search",
                    (255, 255, 255)),
            Element("mic", (870, 800 + off, 1000, 930 + off), "mic", "", (255, 255, 255)),
            # the news feed under the search box (keeps a loaded page from reading as blank)
            Element("feed", (40, 1080 + off, 1040, 2240), "card", "Top stories",
                    (232, 234, 237)),
        ]
        return els
    if p.kind == "google_results":
        els += [
            Element("search_box", (40, 260, 870, 380), "field",
                    state.typed if state.focus == "search_box" else (p.query or ""),
                    (255, 255, 255)),
            Element("mic", (870, 260, 1040, 380), "mic", "", (255, 255, 255)),
        ]
        rows = _google_rows(p.query or "")
        return els + _list_items(state, 420, rows, "result", (26, 13, 171))
    if p.kind == "web_result":
        title = _google_rows(p.query or "")[p.item or 0][0]
        return els + [
            Element("article_title", (40, 280, 1040, 420), "title", title, (255, 255, 255)),
            Element("article_body", (40, 440, 1040, 2240), "card",
                    f"Everything about {p.query}.", (232, 234, 237)),
        ]
    site = SITES[p.site or "costco"]
    color = _tint(site.color, d, site.key)
    off = drift_offset(d, site.key)
    els += [Element("site_header", (0, CONTENT_TOP, WIDTH, 400), "bar", site.title, color,
                    (255, 255, 255))]
    if p.kind == "shop_product":
        title, price = _product(p)
        return els + [
            Element("product_image", (140, 440, 940, 1140), "image", "", _tint(
                (200, 200, 210), d, title)),
            Element("product_title", (40, 1170, 1040, 1330), "title", title, (255, 255, 255)),
            Element("product_price", (40, 1340, 600, 1440), "title", price, (255, 255, 255),
                    (177, 39, 4)),
            Element("add_to_cart", (40, 1500, 1040, 1640), "button", "Add to cart", color,
                    (255, 255, 255)),
        ]
    sy = 430 + off
    els += [
        Element("search_box", (40, sy, 870, sy + 120), "field",
                state.typed if state.focus == "search_box"
                else (p.query if p.kind == "shop_results" else f"Search {site.title}"),
                (255, 255, 255)),
        Element("mic", (870, sy, 1040, sy + 120), "mic", "", (255, 255, 255)),
    ]
    if p.kind == "shop_home":
        for k in range(4):
            r, c = divmod(k, 2)
            x0, y0 = 40 + c * 510, sy + 200 + r * 520
            els.append(Element(f"promo:{k}", (x0, y0, x0 + 490, y0 + 480), "tile",
                               f"Deal {k + 1}", _tint((255, 244, 229), d, f"{site.key}{k}")))
        return els
    # shop_results
    catalogue = results_for(p.site, p.query or "")
    rows = [catalogue[i] for i in p.order]
    if p.ad is None:
        return els + _list_items(state, sy + 160, rows, "result", color)
    title, price = catalogue[p.ad]
    items = _list_items(state, sy + 160, [(title, f"Sponsored  {price}")] + rows, "row", color)
    for el in items:  # slot 0 is the ad, slot k + 1 the k-th result
        slot = int(el.id.split(":", 1)[1])
        els.append(replace(el, id="ad:sponsored" if slot == 0 else f"result:{slot - 1}"))
    return els


def _google_rows(query: str) -> list[tuple[str, str]]:
    site = site_from_domain(query)
    rows = []
    if site:
        rows.append((f"{SITES[site].title} - Official Site", SITES[site].domain))
    for i in range(N_RESULTS - len(rows)):
        rows.append((f"{query} - result {i + 1}", f"www.answers.example/{i}"))
    return rows


def _product(p: Page) -> tuple[str, str]:
    if p.query is None:  # a promo tile's deal
        return (f"Deal of the day #{(p.item or 0) + 1}", "$19.99")
    return results_for(p.site, p.query)[p.item or 0]


def _overlay_elements(state: PhoneState) -> list[Element]:
    if state.layout == "current":
        return _current_overlay_elements(state)
    if state.overlay == "popup":
        p = state.page
        title = ("Sign up for deals!" if p.site else
                 "Before you continue" if p.app == "chrome" else "Allow notifications?")
        return [
            Element("popup:box", (90, 700, 990, 1500), "modal", title, (255, 255, 255)),
            Element("popup:close", (860, 720, 970, 830), "close", "X", (230, 230, 230)),
            Element("popup:nothanks", (190, 1300, 890, 1430), "button", "No thanks",
                    (60, 64, 67), (255, 255, 255)),
        ]
    if state.overlay == "consent":
        return [
            Element("consent:box", (0, 1800, WIDTH, HEIGHT), "sheet", "We use cookies",
                    (250, 250, 250)),
            Element("consent:accept", (60, 2060, 520, 2190), "button", "Accept all",
                    (26, 115, 232), (255, 255, 255)),
            Element("consent:reject", (560, 2060, 1020, 2190), "button", "Reject all",
                    (230, 230, 230)),
        ]
    if state.overlay == "voice":
        return [
            Element("voice:box", (0, STATUS_H, WIDTH, HEIGHT), "voice", "Listening...",
                    (32, 33, 36), (255, 255, 255)),
            Element("voice:cancel", (30, 110, 170, 250), "close", "X", (60, 64, 67),
                    (255, 255, 255)),
        ]
    return []


def _current_overlay_elements(state: PhoneState) -> list[Element]:
    """The dialogs of the "current" layout (:data:`LAYOUTS`): the same ids and labels as the
    older one's, elsewhere on the screen."""
    if state.overlay == "popup":
        p = state.page
        title = ("Sign up for deals!" if p.site else
                 "Before you continue" if p.app == "chrome" else "Allow notifications?")
        return [
            Element("popup:box", (90, 1000, 990, 1800), "modal", title, (255, 255, 255)),
            Element("popup:close", (110, 1020, 220, 1130), "close", "X", (230, 230, 230)),
            Element("popup:nothanks", (190, 1620, 890, 1750), "button", "No thanks",
                    (60, 64, 67), (255, 255, 255)),
        ]
    if state.overlay == "consent":
        return [
            Element("consent:box", (0, CONTENT_TOP, WIDTH, 700), "sheet", "We use cookies",
                    (250, 250, 250)),
            Element("consent:accept", (560, 560, 1020, 680), "button", "Accept all",
                    (26, 115, 232), (255, 255, 255)),
            Element("consent:reject", (60, 560, 520, 680), "button", "Reject all",
                    (230, 230, 230)),
        ]
    if state.overlay == "voice":
        return [
            Element("voice:box", (0, STATUS_H, WIDTH, HEIGHT), "voice", "Listening...",
                    (32, 33, 36), (255, 255, 255)),
            Element("voice:cancel", (390, 1980, 690, 2160), "close", "Cancel", (60, 64, 67),
                    (255, 255, 255)),
        ]
    return []


def layout(state: PhoneState) -> list[Element]:
    """Every element on screen, bottom to top (the last drawn is the first hit)."""
    if state.loading:
        return _status_bar()
    els = _status_bar() + _page_elements(state)
    if state.focus:
        els.append(Element("keyboard", (0, KEYBOARD_TOP, WIDTH, HEIGHT), "keyboard", "",
                           (232, 234, 237)))
    return els + _overlay_elements(state)


def hit_test(state: PhoneState, x: float, y: float) -> Element | None:
    """The topmost element under (x, y). A modal (pop-up, voice input) absorbs every tap."""
    els = layout(state)
    modal = state.overlay in ("popup", "voice")
    for el in reversed(els):
        if el.contains(x, y):
            return el
        if modal and el.kind in ("modal", "voice"):
            return el  # taps outside the dialog land on its dimmed backdrop
    return None


_TAPPABLE = ("popup:close", "popup:nothanks", "consent:accept", "consent:reject",
             "voice:cancel", "widget:search", "widget:mic", "mic", "address_bar", "search_box",
             "ad:sponsored")
_TAPPABLE_PREFIXES = ("icon:", "result:", "promo:")
_ANDROID_CLASS = {
    "field": "android.widget.EditText", "button": "android.widget.Button",
    "close": "android.widget.ImageButton", "mic": "android.widget.ImageButton",
    "icon": "android.widget.TextView", "tile": "android.widget.ImageView",
    "logo": "android.widget.ImageView", "image": "android.widget.ImageView",
    "title": "android.widget.TextView", "big_text": "android.widget.TextView",
    "row": "android.view.ViewGroup", "card": "android.view.ViewGroup",
    "bar": "android.view.View", "keyboard": "android.inputmethodservice.KeyboardView",
    "modal": "android.widget.FrameLayout", "sheet": "android.widget.FrameLayout",
    "voice": "android.widget.FrameLayout",
}


def is_tappable(el: Element) -> bool:
    """Does a tap on ``el`` do something (what :func:`.transitions._tap` acts on)?"""
    return el.id in _TAPPABLE or el.id.startswith(_TAPPABLE_PREFIXES)


def ui_nodes(state: PhoneState) -> list:
    """The screen as a UI tree (:class:`~digirl_lite.envs.uitree.UINode`, bottom to top as
    drawn): every element's id, Android class, text, bounds, whether a tap acts on it and
    whether it has the focus; overlays and the drift day's layout included."""
    from digirl_lite.envs.uitree import UINode

    return [UINode(id=el.id, cls=_ANDROID_CLASS.get(el.kind, "android.view.View"),
                   text=el.label, bounds=tuple(int(v) for v in el.box),
                   clickable=is_tappable(el), focused=el.id == state.focus)
            for el in layout(state)]


def find(state: PhoneState, element_id: str) -> Element | None:
    for el in layout(state):
        if el.id == element_id:
            return el
    return None


def describe(state: PhoneState) -> str:
    """What the screen shows, in words (for few-shot answers and logs)."""
    if state.loading:
        return "a blank white page that has not loaded yet"
    p = state.page
    if p.kind == "launcher":
        what = "the phone's home screen with app icons"
    elif p.kind == "app_home":
        what = f"the {APPS[p.app].label} app"
    elif p.kind == "google_home":
        what = "the Google search page in Chrome"
    elif p.kind == "google_results":
        what = f"Google search results for '{p.query}'"
    elif p.kind == "web_result":
        what = f"a web page opened from the Google results for '{p.query}'"
    else:
        site = SITES[p.site].domain
        if p.kind == "shop_home":
            what = f"the {site} home page"
        elif p.kind == "shop_results":
            what = f"{site} search results for '{p.query}'"
        else:
            what = f"a product page on {site} ('{_product(p)[0]}')"
    if p.ad is not None:
        what += " under a sponsored row"
    if state.overlay == "popup":
        what += ", covered by a pop-up dialog"
    elif state.overlay == "voice":
        what = "the voice-input screen ('Listening...') over " + what
    elif state.overlay == "consent":
        what += ", with a cookie banner at the bottom"
    if state.focus:
        what += f", the keyboard open to type into the {state.focus.replace('_', ' ')}"
    return what
