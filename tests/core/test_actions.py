"""The AutoUI action string, gestures and malformed input (spec/DIGIRL.md section 2)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from digirl_lite.actions import (
    Action,
    ActionParseError,
    ActionType,
    format_action,
    parse_action,
    to_gesture,
)

W, H = 1080, 2280

SPEC_TAP = (
    'Action Decision: "action_type": "DUAL_POINT", "touch_point": "[0.6200, 0.5000]", '
    '"lift_point": "[0.6200, 0.5000]", "typed_text": ""'
)


def test_spec_tap_decodes_y_then_x():
    a = parse_action(SPEC_TAP)
    assert a.action_type is ActionType.DUAL_POINT
    assert a.touch_yx == (0.62, 0.5)
    g = to_gesture(a, W, H)
    assert g.kind == "tap"
    assert g.start == pytest.approx((540.0, 1413.6))
    assert g.start == g.end
    # The classic bug (reading [y, x] as (x, y)) would land 302.7 px away.
    assert math.dist(g.start, (669.6, 1140.0)) == pytest.approx(302.7, abs=0.05)


def test_text_before_marker_is_ignored():
    a = parse_action("I see a search box. Let me tap it. " + SPEC_TAP)
    assert a == parse_action(SPEC_TAP)
    # the last marker wins
    b = parse_action('Action Decision: junk ' + SPEC_TAP)
    assert b == parse_action(SPEC_TAP)


def test_spec_swipe():
    a = Action.swipe(x0=0.5, y0=0.8, x1=0.5, y1=0.3)
    text = format_action(a)
    assert '"touch_point": "[0.8000, 0.5000]"' in text
    assert '"lift_point": "[0.3000, 0.5000]"' in text
    g = to_gesture(parse_action(text), W, H)
    assert g.kind == "swipe"
    assert g.start == pytest.approx((540.0, 1824.0))
    assert g.end == pytest.approx((540.0, 684.0))
    d2 = (g.end[0] - g.start[0]) ** 2 + (g.end[1] - g.start[1]) ** 2
    assert d2 == pytest.approx(1_299_600)


@pytest.mark.parametrize("drift_px, kind", [(0, "tap"), (3, "tap"), (4, "swipe")])
@pytest.mark.parametrize("axis", ["x", "y"])
def test_drift_threshold(drift_px, kind, axis):
    """3 px drift is still a tap (9 < 10 px^2), 4 px is a swipe (16 >= 10)."""
    x0, y0 = 540.0, 1413.6
    x1 = x0 + (drift_px if axis == "x" else 0)
    y1 = y0 + (drift_px if axis == "y" else 0)
    a = Action.swipe(x0=x0 / W, y0=y0 / H, x1=x1 / W, y1=y1 / H)
    assert to_gesture(a, W, H).kind == kind
    # also through the 4-decimal string the policy writes
    assert to_gesture(parse_action(format_action(a)), W, H).kind == kind


def test_keys_back_type_stop():
    home = to_gesture(Action.key("PRESS_HOME"), W, H)
    enter = to_gesture(Action.key(ActionType.PRESS_ENTER), W, H)
    back = to_gesture(Action.key(ActionType.PRESS_BACK), W, H)
    assert (home.kind, home.keycode) == ("key", 3)
    assert (enter.kind, enter.keycode) == ("key", 66)
    assert back.kind == "back" and back.keycode is None
    t = to_gesture(Action.type_text("bose soundsport free"), W, H)
    assert (t.kind, t.text) == ("type", "bose soundsport free")
    for stop in (ActionType.STATUS_TASK_COMPLETE, ActionType.TASK_IMPOSSIBLE):
        g = to_gesture(Action.key(stop), W, H)
        assert (g.kind, g.text) == ("stop", stop.value)
        assert Action.key(stop).ends_episode


def test_non_point_actions_are_written_with_minus_one():
    text = format_action(Action.key(ActionType.PRESS_HOME))
    assert text == (
        'Action Decision: "action_type": "PRESS_HOME", "touch_point": "[-1.0, -1.0]", '
        '"lift_point": "[-1.0, -1.0]", "typed_text": ""'
    )


def test_type_round_trip_keeps_quotes_commas_and_unicode():
    for s in ['bose "soundsport" free', "a, b, c", "café 東京", "  spaced  ", "x\ny"]:
        a = Action.type_text(s)
        assert parse_action(format_action(a)) == a


def test_typed_text_containing_the_marker_round_trips():
    a = Action.type_text('Action Decision: "action_type": "PRESS_HOME"')
    assert parse_action(format_action(a)) == a


def test_trailing_eos_is_tolerated():
    assert parse_action(SPEC_TAP + "</s>") == parse_action(SPEC_TAP)


def test_action_validates_itself():
    with pytest.raises(ActionParseError, match="outside"):
        Action.tap(x=1.2, y=0.5)
    with pytest.raises(ActionParseError, match="finite"):
        Action.tap(x=float("nan"), y=0.5)
    with pytest.raises(ActionParseError, match="non-empty"):
        Action.type_text("")
    with pytest.raises(ActionParseError, match="unknown action type"):
        Action("SCROLL")
    with pytest.raises(ActionParseError):
        format_action(Action.invalid("bad"))


@pytest.mark.parametrize(
    "text, reason",
    [
        ('Action Decision: "action_type": "DUAL_POINT", "touch_point": "[0.62', "in order"),
        ('Action Decision: "type": "DUAL_POINT", "touch": "[0.5, 0.5]"', "in order"),
        (SPEC_TAP.replace("0.6200, 0.5000]\", \"lift", "nan, 0.5000]\", \"lift"), "finite"),
        (SPEC_TAP.replace("[0.6200, 0.5000]", "[1.6200, 0.5000]"), "outside"),
        (SPEC_TAP.replace("DUAL_POINT", "SCROLL"), "unknown action type"),
        (SPEC_TAP.replace("DUAL_POINT", "INVALID"), "unknown action type"),
        (SPEC_TAP.replace("[0.6200, 0.5000]", "[0.62]", 1), "[y, x]"),
        (SPEC_TAP.replace("0.6200", "zero point six", 1), "non-number"),
        ("行动决定：点击搜索框", "marker"),
        ('Action Decision: "action_type": "TYPE", "touch_point": "[-1.0, -1.0]", '
         '"lift_point": "[-1.0, -1.0]", "typed_text": ""', "non-empty"),
        ("", "marker"),
        ("x" * 10_000, "marker"),
    ],
)
def test_malformed_text_becomes_invalid_with_reason(text, reason):
    a = parse_action(text)
    assert not a.is_valid
    assert a.action_type is ActionType.INVALID
    assert reason in a.invalid_reason
    assert len(a.raw) <= 2100  # 10 kB of junk is not kept whole
    g = to_gesture(a, W, H)
    assert g.kind == "invalid" and g.text == a.invalid_reason
    with pytest.raises(ActionParseError):
        parse_action(text, strict=True)


def test_non_string_input_is_invalid_not_an_exception():
    for bad in (None, 42, b"bytes", ["list"]):
        a = parse_action(bad)  # type: ignore[arg-type]
        assert not a.is_valid and "string" in a.invalid_reason


# ---------------------------------------------------------------------------------------
# Property tests
# ---------------------------------------------------------------------------------------
coord = st.floats(min_value=0.0, max_value=1.0, allow_nan=False).map(lambda v: round(v, 4))


@st.composite
def actions(draw):
    kind = draw(st.sampled_from([t for t in ActionType if t is not ActionType.INVALID]))
    if kind is ActionType.DUAL_POINT:
        return Action(kind, (draw(coord), draw(coord)), (draw(coord), draw(coord)))
    if kind is ActionType.TYPE:
        return Action.type_text(draw(st.text(min_size=1, max_size=40)))
    return Action(kind)


@pytest.mark.slow
@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(actions())
def test_format_parse_round_trip(a):
    text = format_action(a)
    b = parse_action(text, strict=True)
    assert b == a
    assert format_action(b) == text


def _fragments():
    pieces = [
        "Action Decision: ", '"action_type": ', '"DUAL_POINT"', '"TYPE"', '"PRESS_HOME"',
        ', "touch_point": ', '"[0.5000, 0.5000]"', '"[nan, inf]"', '"[-1.0, -1.0]"',
        ', "lift_point": ', ', "typed_text": ', '"hello"', '"', "[", "]", ",", "</s>",
        "1e309", "-0.0", "0.9999", "1.0001", "\x00", "\n", "é", "東京",
    ]
    return st.lists(st.one_of(st.sampled_from(pieces), st.text(max_size=8)), max_size=24).map(
        "".join
    )


@pytest.mark.slow
@settings(max_examples=3000, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=300), _fragments()))
def test_fuzz_parse_never_raises(text):
    a = parse_action(text)
    assert isinstance(a, Action)
    g = to_gesture(a, W, H)
    if a.is_valid:
        # whatever parsed is a real action: it formats and parses back to itself
        assert parse_action(format_action(a)) == parse_action(format_action(a), strict=True)
        if a.action_type is ActionType.DUAL_POINT:
            for v in (*a.touch_yx, *a.lift_yx):
                assert 0.0 <= v <= 1.0
            assert 0.0 <= g.start[0] <= W and 0.0 <= g.start[1] <= H
    else:
        assert g.kind == "invalid" and a.invalid_reason


@settings(max_examples=500)
@given(coord, coord, coord, coord)
@pytest.mark.slow
def test_gesture_kind_matches_squared_distance(ty, tx, ly, lx):
    a = Action(ActionType.DUAL_POINT, (ty, tx), (ly, lx))
    g = to_gesture(a, W, H)
    d2 = ((lx - tx) * W) ** 2 + ((ly - ty) * H) ** 2
    assert g.kind == ("tap" if d2 < 10 else "swipe")
    assert g.start == pytest.approx((tx * W, ty * H))
