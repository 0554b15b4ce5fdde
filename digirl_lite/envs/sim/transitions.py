"""How a gesture changes the simulated phone: :func:`transition`, a pure function of the
state, the gesture and (for surprises) a seeded generator.

A page load draws its surprises (:class:`~digirl_lite.envs.sim.state.Surprises`): a results
list in another order, a sponsored row, a cookie banner, a pop-up, a blank page. For logs,
:func:`surprises_between` names the surprises one transition brought and
:func:`recoveries_between` the ways back from them it took.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from digirl_lite.actions import KEYCODE_ENTER, KEYCODE_HOME, Gesture
from digirl_lite.envs.sim.catalog import site_from_domain
from digirl_lite.envs.sim.screen import hit_test, max_scroll
from digirl_lite.envs.sim.state import Page, PhoneState, Surprises, minimal_reset
from digirl_lite.envs.sim.tasks import N_RESULTS

__all__ = ["transition", "surprises_between", "RECOVERIES", "recoveries_between"]


def _goto(state: PhoneState, page: Page, rng: np.random.Generator | None,
          sur: Surprises) -> PhoneState:
    """Navigate: push the current page, draw the surprises of a page load."""
    def draw(p: float) -> bool:
        return rng is not None and p > 0 and rng.random() < p

    if page.kind == "shop_results" and draw(sur.reorder):
        page = replace(page, order=tuple(int(i) for i in rng.permutation(N_RESULTS)))
    if page.kind == "shop_results" and draw(sur.sponsored):  # any entry but the first shown
        page = replace(page, ad=int(page.order[1 + int(rng.integers(0, N_RESULTS - 1))]))
    overlay = None
    seen = state.sites_seen
    if page.site and page.site not in seen:
        seen = seen + (page.site,)
        if draw(sur.consent):
            overlay = "consent"
    if page.kind != "launcher" and overlay is None and draw(sur.popup):
        overlay = "popup"
    loading = page.app == "chrome" and draw(sur.blank)
    return replace(state, page=page, history=state.history + (state.page,), focus=None,
                   typed="", overlay=overlay, loading=loading, sites_seen=seen)


def _focus(state: PhoneState, field_id: str, rng, sur: Surprises) -> PhoneState:
    if rng is not None and sur.voice > 0 and rng.random() < sur.voice:
        return replace(state, overlay="voice", focus=None)
    return replace(state, focus=field_id, typed="")


def _submit(state: PhoneState, rng, sur: Surprises) -> PhoneState:
    text = state.typed.strip()
    p = state.page
    if not text:
        return state
    if state.focus == "address_bar":
        site = site_from_domain(text)
        if site:
            return _goto(state, Page("chrome", "shop_home", site=site), rng, sur)
        return _goto(state, Page("chrome", "google_results", query=text), rng, sur)
    if state.focus == "search_box":
        if p.site:
            order = tuple(range(N_RESULTS))
            return _goto(state, Page("chrome", "shop_results", site=p.site, query=text,
                                     order=order), rng, sur)
        return _goto(state, Page("chrome", "google_results", query=text), rng, sur)
    return state


def _tap(state: PhoneState, x: float, y: float, rng, sur: Surprises) -> PhoneState:
    el = hit_test(state, x, y)
    if el is None:
        return replace(state, focus=None) if state.focus else state
    eid = el.id
    p = state.page
    if eid in ("popup:close", "popup:nothanks", "consent:accept", "consent:reject",
               "voice:cancel"):
        return replace(state, overlay=None)
    if el.kind in ("modal", "voice", "keyboard", "sheet"):
        return state
    if eid.startswith("icon:"):
        key = eid.split(":", 1)[1]
        page = Page("chrome", "google_home") if key == "chrome" else Page(key, "app_home")
        return _goto(state, page, rng, sur)
    if eid == "widget:search":
        s = _goto(state, Page("chrome", "google_home"), rng, sur)
        return s if (s.overlay or s.loading) else _focus(s, "search_box", rng, sur)
    if eid in ("widget:mic", "mic"):
        return replace(state, overlay="voice", focus=None)
    if eid == "address_bar":
        return replace(state, focus="address_bar", typed="")
    if eid == "search_box":
        return _focus(state, "search_box", rng, sur)
    if eid.startswith("result:"):
        slot = int(eid.split(":", 1)[1])
        if p.kind == "shop_results":
            return _goto(state, Page("chrome", "shop_product", site=p.site, query=p.query,
                                     item=p.order[slot], order=p.order), rng, sur)
        site = site_from_domain(p.query or "")
        if site and slot == 0:
            return _goto(state, Page("chrome", "shop_home", site=site), rng, sur)
        return _goto(state, Page("chrome", "web_result", query=p.query, item=slot), rng, sur)
    if eid == "ad:sponsored":  # the results come back without the ad
        here = replace(state, page=replace(p, ad=None))
        return _goto(here, Page("chrome", "shop_product", site=p.site, query=p.query,
                                item=p.ad, order=p.order), rng, sur)
    if eid.startswith("promo:"):
        k = int(eid.split(":", 1)[1])
        return _goto(state, Page("chrome", "shop_product", site=p.site, item=k), rng, sur)
    return replace(state, focus=None) if state.focus else state


def _back(state: PhoneState) -> PhoneState:
    if state.overlay in ("voice", "popup"):
        return replace(state, overlay=None)
    if state.focus:
        return replace(state, focus=None, typed="")
    if state.history:
        return replace(state, page=state.history[-1], history=state.history[:-1],
                       overlay=None, loading=False)
    return state


def transition(
    state: PhoneState, gesture: Gesture, rng: np.random.Generator | None = None,
    surprises: Surprises | None = None,
) -> PhoneState:
    """The state after ``gesture``. ``rng=None`` (or ``Surprises.none()``) means no surprise.

    A page that is still loading (blank) swallows every gesture but HOME; the page then
    appears. Invalid actions and stop actions change nothing.
    """
    sur = surprises or Surprises()
    if gesture.kind == "key" and gesture.keycode == KEYCODE_HOME:
        return minimal_reset(state)
    if state.loading:
        return replace(state, loading=False)
    if gesture.kind == "tap":
        return _tap(state, gesture.start[0], gesture.start[1], rng, sur)
    if gesture.kind == "swipe":
        (x0, y0), (x1, y1) = gesture.start, gesture.end
        if abs(y1 - y0) < abs(x1 - x0) or state.overlay in ("popup", "voice"):
            return state
        ms = max_scroll(state)
        if ms == 0:
            return state
        scroll = int(min(max(state.page.scroll + (y0 - y1), 0), ms))
        return replace(state, page=replace(state.page, scroll=scroll))
    if gesture.kind == "type":
        if state.focus is None or state.overlay in ("popup", "voice"):
            return state
        return replace(state, typed=state.typed + (gesture.text or ""))
    if gesture.kind == "key" and gesture.keycode == KEYCODE_ENTER:
        if state.focus is None or state.overlay in ("popup", "voice"):
            return state
        return _submit(state, rng, sur)
    if gesture.kind == "back":
        return _back(state)
    return state  # "stop" and "invalid": the screen does not change


def surprises_between(before: PhoneState, after: PhoneState) -> list[str]:
    """The surprises that appeared in one transition (for logs and failure analysis)."""
    out = []
    if after.overlay and after.overlay != before.overlay:
        out.append(after.overlay)
    if after.loading and not before.loading:
        out.append("blank")
    p = after.page
    if (p.kind == "shop_results" and p != before.page and p.order
            and p.order != tuple(range(len(p.order)))):
        out.append("reorder")
    if p.ad is not None and p != before.page:
        out.append("sponsored")
    return out


RECOVERIES = ("popup", "voice", "consent", "back")
"""What :func:`recoveries_between` names: a pop-up closed, voice input left, a cookie banner
answered, a BACK that left a page (a wrong product, an ad's page, a wrong site)."""


def recoveries_between(before: PhoneState, after: PhoneState, gesture: Gesture) -> list[str]:
    """The ways back from a surprise or a mistake that one transition took (issue 47's
    mechanism: the share of successful episodes holding one is the curve that shows online
    practice learning them). Ground truth, for logs and reports; no agent reads it."""
    out = []
    if before.overlay and after.overlay is None and not before.loading:
        out.append(before.overlay)
    elif (gesture.kind == "back" and before.overlay is None and not before.focus
          and after.page != before.page):
        out.append("back")
    return out
