"""The phone's UI tree (issue 30, item 1): the simulator's elements as an accessibility tree,
in process and over the wire as UiAutomator2's page source, read back by the one parser a
real device's source goes through; what it says about clickability is what a tap does."""

from __future__ import annotations

import dataclasses

import pytest

from digirl_lite.actions import Gesture
from digirl_lite.envs.sim import SimPhoneEnv, Surprises
from digirl_lite.envs.sim.world import (
    Page,
    PhoneState,
    hit_test,
    initial_state,
    layout,
    transition,
    ui_nodes,
)
from digirl_lite.envs.uitree import UINode, UITreeError, parse_source, to_source, tree_text

# a real UiAutomator2 page source (abridged from a Pixel emulator's Chrome), nested three
# deep, ids with their package, a content-desc for an icon without text
REAL_SOURCE = """<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>
<hierarchy index="0" class="hierarchy" rotation="0" width="1080" height="2400">
  <node index="0" text="" resource-id="" class="android.widget.FrameLayout"
        package="com.android.chrome" clickable="false" focused="false"
        bounds="[0,0][1080,2400]">
    <node index="0" text="" resource-id="com.android.chrome:id/toolbar"
          class="android.view.ViewGroup" clickable="false" focused="false"
          bounds="[0,128][1080,275]">
      <node index="0" text="Search or type web address"
            resource-id="com.android.chrome:id/url_bar" class="android.widget.EditText"
            clickable="true" focused="true" bounds="[189,149][797,254]" />
      <node index="1" text="" content-desc="More options"
            resource-id="com.android.chrome:id/menu_button"
            class="android.widget.ImageButton" clickable="true" focused="false"
            bounds="[944,128][1080,275]" />
    </node>
    <node index="1" text="no bounds here" class="android.view.View" />
  </node>
</hierarchy>"""


def test_a_real_device_s_page_source_is_read_into_nodes():
    nodes = parse_source(REAL_SOURCE)
    assert [n.id for n in nodes] == ["", "com.android.chrome:id/toolbar",
                                     "com.android.chrome:id/url_bar",
                                     "com.android.chrome:id/menu_button"]
    url = nodes[2]
    assert url.cls == "android.widget.EditText" and url.text == "Search or type web address"
    assert url.bounds == (189, 149, 797, 254) and url.clickable and url.focused
    assert nodes[3].text == "More options"  # content-desc when there is no text
    assert not nodes[1].clickable and nodes[3].center == (1012.0, 201.5)


@pytest.mark.parametrize("bad, why", [("", "empty"), ("<hierarchy><node", "not XML"),
                                      ("<html><body/></html>", "not <hierarchy>")])
def test_a_page_source_that_is_not_a_layout_is_a_clear_error(bad, why):
    with pytest.raises(UITreeError, match=why):
        parse_source(bad)


def _states():
    """Screens with every kind of element: launcher (drifted too), Google, a shop's results
    (scrolled), a product page, each overlay, a focused field."""
    base = initial_state()
    shop = Page("chrome", "shop_results", site="ebay", query="lamp", order=(2, 0, 1, 3, 4),
                scroll=150)
    return [base, initial_state(day=40), PhoneState(page=Page("chrome", "google_home")),
            PhoneState(page=shop), PhoneState(page=Page("chrome", "shop_product",
                                                        site="ebay", item=1)),
            PhoneState(page=shop, overlay="popup"), PhoneState(page=shop, overlay="consent"),
            PhoneState(page=Page("chrome", "google_home"), overlay="voice"),
            PhoneState(page=Page("chrome", "google_home"), focus="search_box",
                       typed="lamp")]


def test_the_simulator_s_tree_round_trips_through_the_page_source():
    for state in _states():
        nodes = ui_nodes(state)
        assert [n.id for n in nodes] == [e.id for e in layout(state)]
        back = parse_source(to_source(nodes, 1080, 2280))
        assert back[0].cls == "android.widget.FrameLayout"  # the screen's container
        assert back[1:] == nodes


def test_clickable_is_what_a_tap_does():
    """Tapping the centre of a node the tree calls clickable changes the phone (its page,
    overlay or focus); tapping one it does not call clickable changes nothing (a focused
    field loses its focus, as a tap anywhere does). Overlays are the topmost nodes: their
    buttons are clickable, the dimmed page under a pop-up is not reachable."""
    none = Surprises.none()
    seen = {True: 0, False: 0}
    for state in _states():
        for node in ui_nodes(state):
            x, y = node.center
            after = transition(state, Gesture("tap", (x, y), (x, y)), None, none)
            changed = (after.page, after.overlay) != (state.page, state.overlay) or (
                after.focus not in (None, state.focus))
            top = hit_test(state, x, y)
            if top is None or top.id != node.id:
                continue  # another node is on top there (a child, a modal's backdrop)
            if node.clickable and node.id != state.focus:
                assert changed, (state.page.kind, state.overlay, node.id)
            elif not node.clickable:
                assert not changed, (state.page.kind, state.overlay, node.id)
            seen[node.clickable] += 1
    assert seen[True] >= 15 and seen[False] >= 15


def test_overlays_focus_and_drift_are_in_the_tree():
    popup = ui_nodes(_states()[5])
    assert [n.id for n in popup[-3:]] == ["popup:box", "popup:close", "popup:nothanks"]
    focused = [n for n in ui_nodes(_states()[-1]) if n.focused]
    assert [n.id for n in focused] == ["search_box"] and "lamp" in focused[0].text
    day1 = {n.id: n.bounds for n in ui_nodes(initial_state())}
    day40 = {n.id: n.bounds for n in ui_nodes(initial_state(day=40))}
    assert set(day1) == set(day40) and day1 != day40  # the icons moved


def test_the_simulated_phone_puts_its_tree_in_info_when_asked():
    env = SimPhoneEnv("webshop", surprises=Surprises.none(), ui_tree=True)
    obs, info = env.reset("Go to ebay.com", seed=0)
    assert [n.id for n in info["ui_tree"]] == [e.id for e in layout(env.state)]
    chrome = next(n for n in info["ui_tree"] if n.id == "icon:chrome")
    x, y = chrome.center
    text = ('Action Plan: [DUAL_POINT]\nAction Decision: "action_type": "DUAL_POINT", '
            f'"touch_point": "[{y / 2280:.4f}, {x / 1080:.4f}]", '
            f'"lift_point": "[{y / 2280:.4f}, {x / 1080:.4f}]", "typed_text": ""')
    assert obs.ui_tree == tuple(info["ui_tree"])  # what an agent reads (issue 30, item 2)
    obs, _, _, _, info = env.step(text)
    assert env.state.page.app == "chrome"
    assert any(n.id == "address_bar" and n.clickable for n in info["ui_tree"])
    assert obs.ui_tree == tuple(info["ui_tree"])
    off_obs, off_info = SimPhoneEnv("webshop").reset(seed=0)
    assert "ui_tree" not in off_info and off_obs.ui_tree is None  # opt-in
    assert "[address_bar] EditText" in tree_text(info["ui_tree"])


def test_tree_text_lists_what_an_agent_can_use():
    nodes = [UINode("a", "android.widget.Button", "Buy", (0, 0, 10, 10), clickable=True),
             UINode("b", "android.view.View", "", (0, 0, 5, 5)),
             UINode("c", "android.widget.TextView", "Price", (1, 2, 3, 4), focused=True)]
    assert tree_text(nodes).splitlines() == ['[a] Button "Buy" (0,0,10,10) clickable',
                                             '[c] TextView "Price" (1,2,3,4) focused']
    many = [dataclasses.replace(nodes[0], id=str(i)) for i in range(5)]
    assert tree_text(many, max_nodes=2).splitlines()[-1] == "... 3 more"


def test_a_served_phone_s_page_source_is_the_in_process_tree():
    """Over the wire (``GET /session/{id}/source``, read by ``AndroidEnv`` with ``ui_tree``
    on, through the same parser as a real device's) the tree is the in-process phone's, at
    the reset and after a step."""
    from digirl_lite.envs.android import AndroidConfig, AndroidEnv
    from digirl_lite.envs.sim.serve import SimPhoneServer

    twin = SimPhoneEnv("webshop", surprises=Surprises.none(), ui_tree=True)
    with SimPhoneServer(surprises=Surprises.none()) as server:
        env = AndroidEnv(AndroidConfig(server_url=server.url, settle_s=0.0, ui_tree=True),
                         reset="task")
        try:
            obs, info = env.reset("Go to ebay.com", seed=0)
            _, want = twin.reset("Go to ebay.com", seed=0)
            assert info["ui_tree"][1:] == want["ui_tree"] and "ui_tree_error" not in info
            assert obs.ui_tree == tuple(info["ui_tree"])  # the agent reads the same tree
            x, y = next(n for n in info["ui_tree"] if n.id == "icon:chrome").center
            text = ('Action Plan: [DUAL_POINT]\\nAction Decision: "action_type": '
                    f'"DUAL_POINT", "touch_point": "[{y / 2280:.4f}, {x / 1080:.4f}]", '
                    f'"lift_point": "[{y / 2280:.4f}, {x / 1080:.4f}]", "typed_text": ""')
            obs, *_, info = env.step(text)
            *_, want = twin.step(text)
            assert info["ui_tree"][1:] == want["ui_tree"]
            assert obs.ui_tree[1:] == tuple(want["ui_tree"])
            assert any(n.id == "address_bar" for n in info["ui_tree"])
        finally:
            env.close()


def test_tree_text_reads_back_into_nodes():
    from digirl_lite.envs.uitree import parse_tree_text

    env = SimPhoneEnv("webshop", surprises=Surprises.none(), ui_tree=True)
    _, info = env.reset("Go to ebay.com", seed=0)
    shown = [n for n in info["ui_tree"] if n.clickable or n.text]
    back = parse_tree_text(tree_text(info["ui_tree"]) + "\nnot a node line")
    assert [(n.id, n.text, n.bounds, n.clickable, n.focused) for n in back] == \
        [(n.id, n.text, n.bounds, n.clickable, n.focused) for n in shown]
    assert [n.cls for n in back] == [n.cls.rsplit(".", 1)[-1] for n in shown]
