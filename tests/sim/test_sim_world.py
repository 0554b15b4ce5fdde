"""The simulated phone's world: pure transitions, hit testing, surprises, drift, ground truth,
and the renderer (digirl_lite.envs.sim.world / render)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from digirl_lite.actions import Action, ActionType, Gesture, format_action, parse_action, to_gesture
from digirl_lite.envs.sim.agents import expert_action
from digirl_lite.envs.sim.catalog import APPS, SITES
from digirl_lite.envs.sim.render import Renderer, screen_key
from digirl_lite.envs.sim.tasks import Task, load_tasks, parse_task
from digirl_lite.envs.sim.world import (
    HEIGHT,
    N_RESULTS,
    WIDTH,
    Page,
    PhoneState,
    Surprises,
    find,
    hit_test,
    initial_state,
    is_success,
    layout,
    max_scroll,
    results_for,
    surprises_between,
    transition,
)
from digirl_lite.paths import data_dir

W, H = 1080, 2280
NONE = Surprises.none()
IDENTITY = tuple(range(N_RESULTS))


def only(**probs: float) -> Surprises:
    """Every surprise off except those given."""
    return replace(NONE, **probs)


def act(state: PhoneState, action: Action, rng=None, sur: Surprises = NONE) -> PhoneState:
    return transition(state, to_gesture(action, W, H), rng, sur)


def tap_at(state: PhoneState, x: float, y: float, rng=None, sur: Surprises = NONE):
    return act(state, Action.tap(x=x / W, y=y / H), rng, sur)


def tap(state: PhoneState, element_id: str, rng=None, sur: Surprises = NONE) -> PhoneState:
    el = find(state, element_id)
    assert el is not None, f"{element_id} is not on screen ({state.page})"
    return tap_at(state, *el.center, rng=rng, sur=sur)


def key(state: PhoneState, atype: ActionType, rng=None, sur: Surprises = NONE) -> PhoneState:
    return act(state, Action.key(atype), rng, sur)


def type_(state: PhoneState, text: str, rng=None, sur: Surprises = NONE) -> PhoneState:
    return act(state, Action.type_text(text), rng, sur)


def swipe(state: PhoneState, y0: float, y1: float, x0: float = 0.5, x1: float = 0.5):
    return act(state, Action.swipe(x0=x0, y0=y0, x1=x1, y1=y1))


def chrome() -> PhoneState:
    return tap(initial_state(), "icon:chrome")


def visit(state: PhoneState, address: str, rng=None, sur: Surprises = NONE) -> PhoneState:
    s = tap(state, "address_bar", rng, sur)
    s = type_(s, address, rng, sur)
    return key(s, ActionType.PRESS_ENTER, rng, sur)


def shop_search(state: PhoneState, query: str, rng=None, sur: Surprises = NONE):
    s = tap(state, "search_box", rng, sur)
    s = type_(s, query, rng, sur)
    return key(s, ActionType.PRESS_ENTER, rng, sur)


def results_page(site: str = "costco", query: str = "bose soundsport free",
                 order: tuple[int, ...] = IDENTITY, scroll: int = 0) -> PhoneState:
    return PhoneState(page=Page("chrome", "shop_results", site=site, query=query, order=order,
                                scroll=scroll))


def center_dist(a, b) -> float:
    return math.dist(a.center, b.center)


# ---------------------------------------------------------------------------------------
# Each action kind
# ---------------------------------------------------------------------------------------
def test_initial_state_is_the_launcher():
    s = initial_state()
    assert s.page == Page("launcher", "launcher")
    assert (s.history, s.focus, s.overlay, s.loading) == ((), None, None, False)
    with pytest.raises(ValueError):
        initial_state(0)


@pytest.mark.parametrize("app", ["chrome", "clock", "gmail", "settings"])
def test_tap_app_icon_opens_that_app(app):
    s0 = initial_state()
    s = tap(s0, f"icon:{app}")
    expected = Page("chrome", "google_home") if app == "chrome" else Page(app, "app_home")
    assert s.page == expected
    assert s.history == (s0.page,)
    assert find(s, f"icon:{app}") is None  # the launcher is gone


def test_tap_address_bar_focuses_it():
    s = chrome()
    assert s.focus is None and find(s, "keyboard") is None
    f = tap(s, "address_bar")
    assert f.focus == "address_bar"
    assert f.page == s.page
    assert find(f, "keyboard") is not None


def test_type_goes_to_the_focused_field_only():
    s = chrome()
    # No focus: typing changes nothing, on Google and on the launcher.
    assert type_(s, "hello") == s
    assert type_(initial_state(), "hello") == initial_state()
    f = type_(tap(s, "address_bar"), "hello")
    assert f.typed == "hello" and f.focus == "address_bar"
    assert find(f, "address_bar").label == "hello"
    assert find(f, "search_box").label == "Search"  # the other field did not get it
    g = type_(tap(s, "search_box"), "shoes")
    assert g.focus == "search_box" and g.typed == "shoes"
    assert find(g, "search_box").label == "shoes"
    assert type_(g, " red").typed == "shoes red"


@pytest.mark.parametrize("address", ["costco.com", "www.costco.com", "https://costco.com"])
def test_enter_on_address_bar_opens_the_shop(address):
    s = visit(chrome(), address)
    assert s.page == Page("chrome", "shop_home", site="costco")
    assert s.focus is None and s.typed == ""
    assert find(s, "site_header").label == SITES["costco"].title


def test_enter_on_address_bar_with_other_text_searches_google():
    s = visit(chrome(), "bose headphones")
    assert s.page == Page("chrome", "google_results", query="bose headphones")
    assert find(s, "result:0") is not None


def test_enter_needs_focus_and_text():
    s = chrome()
    assert key(s, ActionType.PRESS_ENTER) == s
    focused = tap(s, "address_bar")
    assert key(focused, ActionType.PRESS_ENTER) == focused  # nothing typed


def test_shop_search_opens_results_for_that_query():
    home = visit(chrome(), "ebay.com")
    s = shop_search(home, "apple airpods")
    assert s.page.kind == "shop_results"
    assert (s.page.site, s.page.query, s.page.order) == ("ebay", "apple airpods", IDENTITY)
    assert s.history[-1] == home.page
    expected = results_for("ebay", "apple airpods")[0][0]
    assert find(s, "result:0").label.split("\n")[0] == expected


@pytest.mark.parametrize("k", [0, 1, 4])
def test_tapping_result_k_opens_the_displayed_kth_entry(k):
    order = (3, 6, 0, 7, 1, 5, 2, 4)
    s = results_page(order=order)
    row_title = find(s, f"result:{k}").label.split("\n")[0]
    p = tap(s, f"result:{k}")
    assert p.page.kind == "shop_product"
    assert (p.page.site, p.page.query, p.page.item) == ("costco", s.page.query, order[k])
    assert find(p, "product_title").label == row_title


def test_swipe_up_scrolls_results_clamped_at_max_scroll():
    s = results_page()
    ms = max_scroll(s)
    assert ms > 0
    row1 = find(s, "result:1")
    up = swipe(s, 0.8, 0.5)  # 684 px up
    assert up.page.scroll == pytest.approx(0.3 * H, abs=1)
    assert 0 < up.page.scroll < ms
    moved = find(up, "result:1")
    assert moved is None or moved.box[1] < row1.box[1]
    assert find(up, "result:0") is None  # scrolled out of view
    further = swipe(up, 0.9, 0.1)
    assert further.page.scroll == ms  # clamped
    assert swipe(further, 0.9, 0.1) == further
    assert find(further, f"result:{N_RESULTS - 1}") is not None
    back = swipe(further, 0.1, 0.9)  # swipe down: back to the top, clamped at 0
    assert back.page.scroll == 0
    assert find(back, "result:0") == find(s, "result:0")


def test_small_swipe_moves_rows_and_keeps_first():
    s = results_page()
    up = swipe(s, 0.6, 0.55)  # 114 px
    assert up.page.scroll == pytest.approx(0.05 * H, abs=1)
    a, b = find(s, "result:2"), find(up, "result:2")
    assert b.box[1] == a.box[1] - up.page.scroll
    assert find(up, "result:0") is not None


def test_sideways_swipe_does_not_scroll():
    s = results_page()
    assert swipe(s, 0.5, 0.52, x0=0.9, x1=0.1) == s


@pytest.mark.parametrize("state_fn", [
    initial_state,
    chrome,
    lambda: visit(chrome(), "costco.com"),
    lambda: tap(initial_state(), "icon:clock"),
])
def test_swipe_on_a_non_scrollable_page_changes_nothing(state_fn):
    s = state_fn()
    assert max_scroll(s) == 0
    assert swipe(s, 0.8, 0.3) == s
    assert swipe(s, 0.3, 0.8) == s


def test_back_closes_focus_then_follows_history():
    home = visit(chrome(), "costco.com")
    focused = type_(tap(home, "search_box"), "tv")
    b1 = key(focused, ActionType.PRESS_BACK)
    assert b1.focus is None and b1.typed == "" and b1.page == home.page
    b2 = key(b1, ActionType.PRESS_BACK)
    assert b2.page == Page("chrome", "google_home")
    b3 = key(b2, ActionType.PRESS_BACK)
    assert b3.page == Page() and b3.history == ()
    assert key(b3, ActionType.PRESS_BACK) == b3  # nothing left to go back to


def test_back_closes_an_overlay_before_leaving_the_page():
    s = replace(chrome(), overlay="popup")
    b = key(s, ActionType.PRESS_BACK)
    assert b.overlay is None and b.page == s.page and b.history == s.history


def test_home_returns_to_launcher_from_anywhere():
    deep = tap(results_page(), "result:0")
    deep = replace(deep, focus="search_box", typed="x", overlay="popup", loading=True, day=3,
                   sites_seen=("costco",))
    for s in (deep, replace(deep, loading=False), replace(deep, overlay="voice"), chrome()):
        h = key(s, ActionType.PRESS_HOME)
        assert h.page == Page()
        assert (h.history, h.focus, h.typed, h.overlay, h.loading) == ((), None, "", None, False)
        assert h.day == s.day
    assert key(initial_state(), ActionType.PRESS_HOME) == initial_state()


@pytest.mark.parametrize("action", [
    Action.key(ActionType.STATUS_TASK_COMPLETE),
    Action.key(ActionType.TASK_IMPOSSIBLE),
    parse_action("Action Decision: garbage"),
    parse_action(""),
])
def test_stop_and_invalid_actions_leave_the_state_unchanged(action):
    states = [initial_state(), chrome(), tap(chrome(), "address_bar"), results_page(scroll=300),
              replace(chrome(), overlay="popup")]
    for s in states:
        assert act(s, action, np.random.default_rng(0), Surprises(1, 1, 1, 1, 1)) == s


# ---------------------------------------------------------------------------------------
# Hit testing, in pixels, [y, x]
# ---------------------------------------------------------------------------------------
def px(x: float, y: float) -> Gesture:
    return Gesture("tap", start=(x, y), end=(x, y))


def test_hit_test_is_exact_to_one_pixel():
    s = initial_state()
    x0, y0, x1, y1 = find(s, "icon:chrome").box
    cx, cy = find(s, "icon:chrome").center
    inside = [(x0 + 1, y0 + 1), (x1 - 1, y1 - 1), (x0 + 1, cy), (cx, y1 - 1)]
    outside = [(x0 - 1, cy), (x1 + 1, cy), (cx, y0 - 1), (cx, y1 + 1)]
    for x, y in inside:
        el = hit_test(s, x, y)
        assert el is not None and el.id == "icon:chrome", (x, y)
        assert transition(s, px(x, y), None, NONE).page == Page("chrome", "google_home")
    for x, y in outside:
        el = hit_test(s, x, y)
        assert el is None or el.id != "icon:chrome", (x, y)
        assert transition(s, px(x, y), None, NONE).page == Page(), (x, y)


def test_hit_test_through_normalized_action_one_pixel():
    s = initial_state()
    x0, y0, _, _ = find(s, "icon:chrome").box
    hit = tap_at(s, x0 + 1, y0 + 1)
    miss = tap_at(s, x0 - 1, y0 + 1)
    assert hit.page.kind == "google_home"
    assert miss == s


def test_points_are_y_then_x():
    s = initial_state()
    cx, cy = find(s, "icon:chrome").center
    nx, ny = round(cx / W, 4), round(cy / H, 4)
    right = format_action(Action.tap(x=nx, y=ny))
    assert f'"[{ny:.4f}, {nx:.4f}]"' in right
    assert act(s, parse_action(right)).page == Page("chrome", "google_home")
    swapped = right.replace(f"[{ny:.4f}, {nx:.4f}]", f"[{nx:.4f}, {ny:.4f}]")
    assert swapped != right
    g = to_gesture(parse_action(swapped), W, H)
    assert math.dist(g.start, (cx, cy)) > 100
    assert act(s, parse_action(swapped)).page == Page()


# ---------------------------------------------------------------------------------------
# Surprises, forced with probability 1
# ---------------------------------------------------------------------------------------
def test_popup_appears_blocks_the_page_and_closes():
    rng, sur = np.random.default_rng(0), only(popup=1.0)
    s0 = initial_state()
    s = tap(s0, "icon:chrome", rng, sur)
    assert s.overlay == "popup" and s.page == Page("chrome", "google_home")
    assert surprises_between(s0, s) == ["popup"]
    assert not s.clean
    # Taps outside and inside the dialog (not on its buttons) are absorbed.
    for eid in ("address_bar", "search_box", "mic", "google_logo"):
        el = find(s, eid)
        assert el is not None
        assert hit_test(s, *el.center).kind == "modal"
        assert tap_at(s, *el.center, rng=rng, sur=sur) == s, eid
    assert type_(s, "abc", rng, sur) == s
    assert key(s, ActionType.PRESS_ENTER, rng, sur) == s
    closed = tap(s, "popup:close", rng, sur)
    assert closed.overlay is None and closed.page == s.page and closed.history == s.history
    assert tap(s, "popup:nothanks", rng, sur).overlay is None
    # After closing, the page works again.
    assert tap(closed, "address_bar", rng, sur).focus == "address_bar"


def test_popup_over_app_and_shop_pages_but_not_the_launcher():
    rng, sur = np.random.default_rng(1), only(popup=1.0)
    app = tap(initial_state(), "icon:clock", rng, sur)
    assert app.overlay == "popup" and find(app, "popup:box").label == "Allow notifications?"
    shop = visit(chrome(), "target.com", rng, sur)
    assert shop.overlay == "popup" and find(shop, "popup:box").label == "Sign up for deals!"
    back_home = key(key(app, ActionType.PRESS_BACK), ActionType.PRESS_BACK, rng, sur)
    assert back_home.page == Page() and back_home.overlay is None


def test_consent_banner_once_per_site_per_episode():
    rng, sur = np.random.default_rng(0), only(consent=1.0)
    g = tap(initial_state(), "icon:chrome", rng, sur)
    assert g.overlay is None  # Google is not a shop site
    c = visit(g, "costco.com", rng, sur)
    assert c.overlay == "consent" and "costco" in c.sites_seen
    assert c.clean  # a banner only covers the bottom
    # The page above the banner still works.
    assert tap(c, "search_box", rng, sur).focus == "search_box"
    accepted = tap(c, "consent:accept", rng, sur)
    assert accepted.overlay is None and accepted.page == c.page
    assert tap(c, "consent:reject", rng, sur).overlay is None
    r = shop_search(accepted, "tv", rng, sur)
    assert r.page.kind == "shop_results" and r.overlay is None  # same site: no banner
    again = visit(tap(key(r, ActionType.PRESS_HOME), "icon:chrome", rng, sur), "costco.com",
                  rng, sur)
    assert again.page.site == "costco" and again.overlay is None  # HOME keeps the episode
    other = visit(accepted, "ebay.com", rng, sur)
    assert other.overlay == "consent"  # a new site
    fresh = visit(tap(initial_state(), "icon:chrome", rng, sur), "costco.com", rng, sur)
    assert fresh.overlay == "consent"  # a new episode


def test_voice_input_on_search_box_and_how_to_leave_it():
    rng, sur = np.random.default_rng(0), only(voice=1.0)
    g = chrome()
    v = tap(g, "search_box", rng, sur)
    assert v.overlay == "voice" and v.focus is None and v.page == g.page
    assert not v.clean
    assert type_(v, "shoes", rng, sur) == v
    assert tap(v, "address_bar", rng, sur) == v  # the voice screen covers the page
    b = key(v, ActionType.PRESS_BACK, rng, sur)
    assert b.overlay is None and b.page == g.page
    c = tap(v, "voice:cancel", rng, sur)
    assert c.overlay is None and c.page == g.page
    shop = visit(g, "walmart.com")
    assert tap(shop, "search_box", rng, sur).overlay == "voice"


def test_reorder_permutes_results_and_first_entry_follows_display():
    task = parse_task('Go to costco.com, search for "bose soundsport free", and select the '
                      'first entry')
    home = visit(chrome(), "costco.com")
    for seed in range(20):
        r = shop_search(home, "bose soundsport free", np.random.default_rng(seed),
                        only(reorder=1.0))
        if r.page.order[0] != 0:
            break
    else:
        pytest.fail("reorder never moved the catalogue's first item in 20 seeds")
    order = r.page.order
    assert sorted(order) == list(IDENTITY) and order != IDENTITY
    assert "reorder" in surprises_between(home, r)
    first = tap(r, "result:0")
    assert first.page.item == order[0]
    assert is_success(first, task)
    catalogue_first = replace(first, page=replace(first.page, item=0))
    assert not is_success(catalogue_first, task)
    # Tapping the row that shows the catalogue's first item is not "the first entry".
    j = order.index(0)
    r2 = replace(r, page=replace(r.page, scroll=0 if j <= 5 else max_scroll(r)))
    other = tap(r2, f"result:{j}")
    assert other.page.item == 0
    assert not is_success(other, task)


def test_a_sponsored_row_is_a_detour_a_success_can_recover_from():
    """Surprises.sponsored (issue 16, item 6): an ad drawn like a result sits where the first
    result was; tapping it opens another product (the task is not done), BACK brings the
    results back without the ad, and then the first entry completes the task. The expert
    never takes the detour; with the probability at 0 nothing changes."""
    task = parse_task('Go to costco.com, search for "bose soundsport free", and select the '
                      'first entry')
    home = visit(chrome(), "costco.com")
    clean = shop_search(home, "bose soundsport free")
    assert clean.page.ad is None
    r = shop_search(home, "bose soundsport free", np.random.default_rng(0), only(sponsored=1.0))
    assert r.page.ad is not None and r.page.ad != r.page.order[0]
    assert "sponsored" in surprises_between(home, r)
    ad = find(r, "ad:sponsored")
    assert ad is not None and "Sponsored" in ad.label
    # where the first result was drawn on a clean page, the ad is now: a copy of clean
    # screens taps it
    assert hit_test(r, *find(clean, "result:0").center).id == "ad:sponsored"
    assert find(r, "result:0").box[1] > ad.box[1]
    assert find(r, "result:0").label == find(clean, "result:0").label
    detour = tap(r, "ad:sponsored", np.random.default_rng(1), only(sponsored=1.0))
    assert detour.page.kind == "shop_product" and detour.page.item == r.page.ad
    assert not is_success(detour, task)
    back = key(detour, ActionType.PRESS_BACK)
    assert back.page.kind == "shop_results" and back.page.ad is None
    assert find(back, "ad:sponsored") is None
    assert is_success(tap(back, "result:0"), task)
    # the expert goes straight to the first entry
    assert is_success(act(r, expert_action(r, task)), task)
    # the screen shows it: rendered, the page with the ad is another screen
    ren = Renderer()
    assert screen_key(r) != screen_key(clean)
    assert np.any(np.asarray(ren.render(r)) != np.asarray(ren.render(clean)))
    assert max_scroll(r) == max_scroll(clean) + 300
    assert Surprises(sponsored=0.4).scaled(0.5).sponsored == pytest.approx(0.2)
    # off by default: the default surprises never draw an ad
    assert Surprises().sponsored == 0.0
    for seed in range(10):
        s = shop_search(home, "bose soundsport free", np.random.default_rng(seed), Surprises())
        assert s.page.ad is None


def test_blank_page_swallows_one_gesture_but_not_home():
    rng, sur = np.random.default_rng(0), only(blank=1.0)
    s0 = initial_state()
    s = tap(s0, "icon:chrome", rng, sur)
    assert s.loading and s.page == Page("chrome", "google_home")
    assert "blank" in surprises_between(s0, s)
    assert [e.id for e in layout(s)] == ["status_bar"]
    bar = find(replace(s, loading=False), "address_bar")
    after = tap_at(s, *bar.center, rng=rng, sur=sur)
    assert after == replace(s, loading=False)  # the tap was lost, the page appeared
    assert type_(s, "x", rng, sur) == replace(s, loading=False)
    h = key(s, ActionType.PRESS_HOME, rng, sur)
    assert h.page == Page() and not h.loading
    assert not tap(s0, "icon:clock", rng, sur).loading  # only Chrome pages load blank


def test_no_rng_means_no_surprise():
    s = tap(initial_state(), "icon:chrome", None, Surprises(1, 1, 1, 1, 1))
    assert s.overlay is None and not s.loading


# ---------------------------------------------------------------------------------------
# Drift
# ---------------------------------------------------------------------------------------
def _drift_targets(day: int) -> dict[str, object]:
    els = {f"launcher/{e.id}": e for e in layout(initial_state(day))
           if e.id.startswith(("icon:", "widget:"))}
    for site in SITES:
        shop = PhoneState(page=Page("chrome", "shop_home", site=site), day=day)
        els[f"{site}/search_box"] = find(shop, "search_box")
        els[f"{site}/site_header"] = find(shop, "site_header")
    return els


def test_drift_moves_or_recolours_something_by_day_7():
    d1, d7 = _drift_targets(1), _drift_targets(7)
    assert d1.keys() == d7.keys()
    changed = [k for k in d1 if center_dist(d1[k], d7[k]) > 20 or d1[k].color != d7[k].color]
    assert changed, "nothing on the launcher or the shops moved or changed colour by day 7"
    assert any(k.startswith("launcher/") or k.endswith("/search_box") for k in changed)


def test_layout_is_deterministic_per_day():
    for day in (1, 7):
        assert layout(initial_state(day)) == layout(initial_state(day))
        shop = PhoneState(page=Page("chrome", "shop_home", site="newegg"), day=day)
        assert layout(shop) == layout(replace(shop))
    assert _drift_targets(1) == _drift_targets(1)
    assert _drift_targets(7) == _drift_targets(7)


def test_every_app_icon_is_on_the_launcher_every_day():
    for day in (1, 7, 14):
        ids = {e.id for e in layout(initial_state(day)) if e.kind == "icon"}
        assert ids == {f"icon:{k}" for k in APPS}


def _test_tasks() -> list[Task]:
    tasks = data_dir() / "tasks"
    return load_tasks(tasks / "webshop_test.txt") + load_tasks(tasks / "general_test.txt")


@pytest.mark.slow
@pytest.mark.parametrize("day", [7, 14])
@pytest.mark.parametrize("surprises", [NONE, Surprises()], ids=["clean", "surprises"])
def test_expert_solves_tasks_after_drift(day, surprises):
    tasks = _test_tasks()
    failed = []
    for i, task in enumerate(tasks):
        rng = np.random.default_rng(i)
        s = initial_state(day)
        for _ in range(60):
            a = expert_action(s, task)
            if a.ends_episode:
                break
            s = act(s, a, rng, surprises)
        if not is_success(s, task):
            failed.append(task.text)
    assert not failed, f"{len(failed)} of {len(tasks)} failed on day {day}: {failed[:3]}"


# ---------------------------------------------------------------------------------------
# Ground truth
# ---------------------------------------------------------------------------------------
L1 = parse_task("Go to costco.com")
L2 = parse_task('Go to costco.com, search for "bose soundsport free"')
L3 = parse_task('Go to costco.com, search for "bose soundsport free", and select the first entry')


def at(page: Page, **kw) -> PhoneState:
    return PhoneState(page=page, **kw)


SHOP_HOME = Page("chrome", "shop_home", site="costco")
RESULTS = Page("chrome", "shop_results", site="costco", query="bose soundsport free",
               order=IDENTITY)


def test_success_level_1_any_page_of_the_site():
    assert is_success(at(SHOP_HOME), L1)
    assert is_success(at(RESULTS), L1)
    assert is_success(at(replace(RESULTS, kind="shop_product", item=3)), L1)
    assert not is_success(at(replace(SHOP_HOME, site="ebay")), L1)
    assert not is_success(at(Page("chrome", "google_results", query="costco.com")), L1)
    assert not is_success(initial_state(), L1)


def test_success_level_2_results_for_the_same_query():
    assert is_success(at(RESULTS), L2)
    assert is_success(at(replace(RESULTS, query='  Bose  SoundSport FREE"? ')), L2)
    assert is_success(at(replace(RESULTS, scroll=500)), L2)
    assert not is_success(at(replace(RESULTS, query="bose soundsport")), L2)
    assert not is_success(at(replace(RESULTS, site="walmart")), L2)
    assert not is_success(at(SHOP_HOME), L2)
    assert not is_success(at(replace(RESULTS, kind="shop_product", item=0)), L2)


def test_success_level_3_product_page_of_displayed_first_entry():
    product = replace(RESULTS, kind="shop_product", item=0)
    assert is_success(at(product), L3)
    assert not is_success(at(replace(product, item=1)), L3)
    assert not is_success(at(RESULTS), L3)
    assert not is_success(at(replace(product, query="bose")), L3)
    assert not is_success(at(replace(product, site="target")), L3)
    shuffled = (5, 0, 1, 2, 3, 4, 6, 7)
    assert is_success(at(replace(product, order=shuffled, item=5)), L3)
    assert not is_success(at(replace(product, order=shuffled, item=0)), L3)
    # a promo tile's product has no results order behind it
    assert not is_success(at(Page("chrome", "shop_product", site="costco", item=0)), L3)


def test_success_search_task():
    t = parse_task("What's the news in India?")
    assert t.kind == "search"
    res = Page("chrome", "google_results", query="What's the news in India")
    assert is_success(at(res), t)
    assert is_success(at(replace(res, query="what's the news in india?")), t)
    assert is_success(at(Page("chrome", "web_result", query=res.query, item=2)), t)
    assert not is_success(at(replace(res, query="What's the news in Italy")), t)
    assert not is_success(at(Page("chrome", "google_home")), t)
    assert not is_success(initial_state(), t)


def test_success_open_app():
    t = parse_task("Open the clock")
    assert is_success(at(Page("clock", "app_home")), t)
    assert not is_success(at(Page("calendar", "app_home")), t)
    assert not is_success(initial_state(), t)
    assert not is_success(at(Page("chrome", "google_home")), t)


@pytest.mark.parametrize("task, state", [
    (L1, at(SHOP_HOME)),
    (L2, at(RESULTS)),
    (L3, at(replace(RESULTS, kind="shop_product", item=0))),
    (parse_task("Open the clock"), at(Page("clock", "app_home"))),
    (parse_task("Search for hotels in Paris"),
     at(Page("chrome", "google_results", query="hotels in Paris"))),
])
def test_nothing_counts_under_popup_voice_or_blank(task, state):
    assert is_success(state, task)
    assert is_success(replace(state, overlay="consent"), task)  # the banner hides little
    for hidden in (replace(state, overlay="popup"), replace(state, overlay="voice"),
                   replace(state, loading=True)):
        assert not is_success(hidden, task)


# ---------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------
BLANK_GUARD_PIXELS = 2_300_000  # spec section 4: more than this many of 2,462,400 near-white
JUDGE_MSE = 0.001 * 255**2  # 65.025


def near_white(img) -> int:
    return int((np.asarray(img) > 240).all(axis=2).sum())


def mse(a, b) -> float:
    return float(((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2).mean())


def test_renderer_draws_full_size_rgb():
    img = Renderer().render(initial_state())
    assert img.size == (WIDTH, HEIGHT) == (1080, 2280)
    assert img.mode == "RGB"
    assert np.asarray(img).std() > 10  # something is drawn


def test_blank_screen_trips_the_blank_guard():
    s = replace(chrome(), loading=True)
    img = Renderer().render(s)
    n = near_white(img)
    assert n > BLANK_GUARD_PIXELS
    assert n / (W * H) > 0.934


@pytest.mark.slow
def test_loaded_pages_do_not_trip_the_blank_guard():
    r = Renderer()
    pages = [Page(), Page("chrome", "google_home"),
             Page("chrome", "google_results", query="foo"),
             Page("chrome", "web_result", query="foo", item=1), SHOP_HOME, RESULTS,
             replace(RESULTS, kind="shop_product", item=0), Page("clock", "app_home")]
    over = [p.kind for p in pages if near_white(r.render(at(p))) > BLANK_GUARD_PIXELS]
    assert not over


@pytest.mark.slow
def test_results_render_at_every_scroll():
    r = Renderer(cache_size=0)
    for page in (Page("chrome", "google_results", query="tv"),
                 replace(RESULTS, query="tv")):
        for focus in (None, "search_box"):
            s = PhoneState(page=page, focus=focus)
            for scroll in range(0, max_scroll(s) + 1, 5):
                img = r.render(replace(s, page=replace(page, scroll=scroll)))
                assert img.size == (W, H)


@pytest.mark.slow
def test_shop_results_render_on_every_drift_day():
    r = Renderer(cache_size=0)
    for day in range(1, 15):
        for site in SITES:
            s = PhoneState(page=replace(RESULTS, site=site), day=day)
            assert r.render(s).size == (W, H)


def test_results_render_at_scroll_zero_on_day_1():
    r = Renderer(cache_size=0)
    for page in (Page("chrome", "google_results", query="tv"), RESULTS):
        for focus in (None, "search_box"):
            img = r.render(PhoneState(page=page, focus=focus))
            assert img.size == (W, H)


def test_popup_changes_the_screen_past_the_judge_threshold():
    r = Renderer()
    for s in (chrome(), visit(chrome(), "costco.com"), tap(initial_state(), "icon:clock")):
        plain = r.render(s)
        pop = r.render(replace(s, overlay="popup"))
        assert mse(plain, pop) > JUDGE_MSE


def test_screen_key_names_what_is_on_screen():
    a = tap(chrome(), "address_bar")
    b = tap(chrome(), "address_bar")
    assert a == b and a is not b
    assert screen_key(a) == screen_key(b)
    typed = type_(a, "c")
    assert screen_key(typed) != screen_key(a)
    assert screen_key(initial_state(1)) == screen_key(initial_state(1))
    r = Renderer(cache_size=0)
    assert mse(r.render(a), r.render(typed)) > 0


def test_render_cache_returns_the_same_image_and_counts():
    r = Renderer()
    s = chrome()
    first = r.render(s)
    assert (r.hits, r.misses) == (0, 1)
    second = r.render(replace(s))
    assert second is first
    assert (r.hits, r.misses) == (1, 1)
    other = r.render(initial_state())
    assert other is not first
    assert (r.hits, r.misses) == (1, 2)


def test_render_cache_evicts_beyond_its_size():
    r = Renderer(cache_size=1)
    s, t = chrome(), initial_state()
    first = r.render(s)
    r.render(t)
    again = r.render(s)
    assert again is not first
    assert (r.hits, r.misses) == (0, 3)
    assert np.array_equal(np.asarray(again), np.asarray(first))
