"""The harness around a frozen agent (issue 30, item 2): skill rules, additive edits, xi's
projection, and who decided every step."""

from __future__ import annotations

import json

import pytest

from digirl_lite.actions import ActionType, parse_action
from digirl_lite.data.records import ScreenTable
from digirl_lite.envs.sim.env import SimEnvFactory, SimPhoneEnv
from digirl_lite.envs.sim.world import Surprises
from digirl_lite.envs.uitree import UINode
from digirl_lite.harness.harness import (
    H0_COMPONENTS,
    Edit,
    EditError,
    Harness,
    HarnessAgent,
    check_components,
    decision_shares,
    repair_action,
)
from digirl_lite.harness.rules import RuleError, StepContext, decide, has_overlay, parse_rules
from digirl_lite.rollout.fleet import SyncFleet

W, H = 1080, 2280
TAP_CHROME = ('Action Decision: "action_type": "DUAL_POINT", "touch_point": "[0.3026, 0.1389]",'
              ' "lift_point": "[0.3026, 0.1389]", "typed_text": ""')


def _nodes(*spec):
    return [UINode(i, c, t, b, clickable=k, focused=f) for i, c, t, b, k, f in spec]


SHOP = _nodes(("status_bar", "android.view.View", "12:30", (0, 0, 1080, 80), False, False),
              ("site_header", "android.view.View", "Best Buy", (0, 240, 1080, 400), False,
               False),
              ("search_box", "android.widget.EditText", "", (40, 430, 870, 550), True, True),
              ("promo:0", "android.widget.ImageView", "Deal 1", (40, 630, 530, 1110), True,
               False))
POPUP = SHOP + _nodes(("popup:box", "android.widget.FrameLayout", "Sign up", (80, 600, 1000,
                                                                             1600), False,
                       False),
                      ("popup:close", "android.widget.ImageButton", "Close", (880, 620, 980,
                                                                              720), True,
                       False))


# ---------------------------------------------------------------------------------------
# rules
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, where", [
    ('{"id": "a", "do": "back"}\n{"id": "b", "when": {"elemnt": {"id": "x"}}, "do": "back"}',
     "line 2: rule 'b': unknown condition 'elemnt'"),
    ('{"id": "a", "do": "fly"}', "line 1: rule 'a': do 'fly'"),
    ('\n\n{"id": "a", "do": "back"', "line 3: not JSON"),
    ('{"id": "a", "do": "back"}\n{"id": "a", "do": "home"}', "line 2: rule id 'a' is already "
                                                             "used on line 1"),
    ('{"id": "a", "when": {"last_action": "twice"}, "do": "back"}', "last_action 'twice'"),
    ('{"id": "a", "when": {"step": [1]}, "do": "back"}', "\"step\" must be"),
    ('{"id": "a", "do": {"tap": {"clickable": true}}}', "tap needs an id or a text"),
    ('{"when": {}, "do": "back"}', "needs an \"id\""),
])
def test_a_rule_that_does_not_parse_names_its_file_and_line(text, where):
    with pytest.raises(RuleError) as e:
        parse_rules(text, source="skills/shop.rules")
    assert "skills/shop.rules" in str(e.value) and where in str(e.value)


def test_rules_act_on_the_tree_in_order():
    rules = parse_rules(
        '# dialogs first\n'
        '{"id": "close", "when": {"overlay": true}, "do": {"tap": {"text": "close"}}}\n'
        '{"id": "type", "when": {"element": {"id": "search_box", "focused": true}, '
        '"absent": {"id": "search_box", "text": "$goal_text"}}, "do": "type_goal_text"}\n'
        '{"id": "enter", "when": {"element": {"id": "search_box", "text": "$goal_text"}}, '
        '"do": "enter"}\n'
        '{"id": "late", "when": {"step": [15, null]}, "do": "home"}\n')
    goal = 'Go to bestbuy.com, search for "usb c hub"'

    def act(nodes, step=0, **kw):
        hit = decide(rules, StepContext(goal, nodes, step, **kw), W, H)
        return (hit[0].id, parse_action(hit[1])) if hit else None

    rid, a = act(POPUP)
    assert rid == "close" and a.action_type is ActionType.DUAL_POINT
    assert a.touch_yx == (round(670 / H, 4), round(930 / W, 4))  # the close button's centre
    assert has_overlay(POPUP) and not has_overlay(SHOP)
    rid, a = act(SHOP)
    assert rid == "type" and a.typed_text == "usb c hub"  # the goal's quoted text
    typed = [n if n.id != "search_box" else UINode(n.id, n.cls, "usb c hub", n.bounds, True,
                                                    True) for n in SHOP]
    assert act(typed)[0] == "enter"
    assert act(SHOP, step=16, fired_here={"type"})[0] == "late"  # acted here: next rule
    assert act(SHOP[:2]) is None  # nothing holds: the agent decides
    # "$goal_text" without a quoted text in the goal matches nothing: the rule cannot act
    assert decide(rules[1:2], StepContext("Go to bestbuy.com", SHOP, 0), W, H) is None


# ---------------------------------------------------------------------------------------
# components and edits
# ---------------------------------------------------------------------------------------
def test_edits_add_behaviour_and_keep_their_provenance():
    h = Harness().extend([Edit("xi", '{"repair": true}', {"proposer": "test"}),
                          Edit("skill", '{"id": "b", "do": "back"}'),
                          Edit("prompt", "Dismiss pop-ups first.")])
    c = h.components
    assert json.loads(c["xi"])["repair"] is True and json.loads(c["xi"])["retry"] is False
    assert c["skills"] == '{"id": "b", "when": {}, "do": "back"}\n'
    assert c["system_prompt"].endswith("Dismiss pop-ups first.")
    assert Harness.from_dict(json.loads(json.dumps(h.as_dict()))).components == c
    assert h.edits[0].provenance == {"proposer": "test"}
    assert Harness().id != h.id and Harness().components == H0_COMPONENTS
    with pytest.raises(EditError, match="may not turn off"):
        h.extend([Edit("xi", '{"repair": false}')])
    with pytest.raises(EditError, match=r"already in the parent"):
        h.extend([Edit("skill", '{"id": "b", "do": "home"}')])
    with pytest.raises(EditError, match=r"edit 4 \(skill\), line 2: rule 'c'"):
        h.extend([Edit("skill", '{"id": "c2", "do": "back"}\n{"id": "c", "do": "jump"}')])
    with pytest.raises(EditError, match="unknown edit kind 'code'"):
        h.extend([Edit("code", "rm -rf /")])
    with pytest.raises(EditError, match="psi.*unknown key"):
        check_components({**H0_COMPONENTS, "psi": '{"windows": 3}'})


def test_repair_rebuilds_what_the_output_holds():
    a = repair_action('Action Decision: "action_type": "DUAL_POINT", "touch_point": '
                      '"[0.5000, 0.2500]", "lift_point": "[0.50')
    assert a.action_type is ActionType.DUAL_POINT and a.touch_yx == a.lift_yx == (0.5, 0.25)
    assert repair_action('"action_type": "TYPE", "typed_text": "hello"').typed_text == "hello"
    assert repair_action('"action_type": "PRESS_BACK", junk').action_type \
        is ActionType.PRESS_BACK
    assert repair_action("the quick brown fox") is None
    assert repair_action('"action_type": "TYPE", "typed_text": ""') is None


# ---------------------------------------------------------------------------------------
# the harness as an agent
# ---------------------------------------------------------------------------------------
class Scripted:
    """A frozen 'agent' for tests: says ``text`` every step; ``retry`` says ``again``."""

    def __init__(self, text: str, again: str | None = None) -> None:
        self.text, self.again = text, again
        self.calls = self.retries = 0

    def propose(self, inputs):
        self.calls += len(inputs)
        self.seen = inputs
        return [self.text] * len(inputs)

    def retry(self, inputs):
        self.retries += len(inputs)
        return [self.again or self.text] * len(inputs)


def _env():
    return SimPhoneEnv("webshop", surprises=Surprises.none(), ui_tree=True)


def test_a_rule_decides_before_the_agent_and_says_so():
    comps = Harness().extend([Edit("skill", '{"id": "chrome", "when": {"element": '
                                            '{"id": "icon:chrome"}}, "do": {"tap": '
                                            '{"id": "icon:chrome"}}}')]).components
    agent = Scripted("garbage")
    h = HarnessAgent(comps, agent)
    env = _env()
    obs, _ = env.reset("Go to ebay.com", seed=0)
    [a] = h.act_batch([0], [obs])
    assert a.decided_by == "rule:chrome" and agent.calls == 0
    obs, *_ = env.step(a)
    assert env.state.page.app == "chrome"
    [b] = h.act_batch([0], [obs])
    assert b.decided_by == "agent" and str(b) == "garbage" and agent.calls == 1
    assert agent.seen[0].tree is not None and "[address_bar]" in agent.seen[0].tree
    assert agent.seen[0].history == (str(a),)
    assert h.decisions == {"rule": 1, "agent": 1}


def test_xi_repairs_retries_and_snaps():
    env = _env()
    obs, _ = env.reset("Go to ebay.com", seed=0)
    # repair: a cut-off tap on Chrome becomes the tap
    h = HarnessAgent({**H0_COMPONENTS, "xi": '{"repair": true}'},
                     Scripted(TAP_CHROME[:-40]))
    [a] = h.act_batch([0], [obs])
    assert a.decided_by == "xi:repair" and parse_action(a).is_valid
    # retry: nothing to repair, one more try under the format
    agent = Scripted("nonsense", again=TAP_CHROME)
    h = HarnessAgent({**H0_COMPONENTS, "xi": '{"repair": true, "retry": true}'}, agent)
    [a] = h.act_batch([0], [obs])
    assert (a.decided_by, str(a), agent.retries) == ("xi:retry", TAP_CHROME, 1)
    # without retry the output goes to the phone as it is (an INVALID no-op step)
    [a] = HarnessAgent(H0_COMPONENTS, Scripted("nonsense")).act_batch([0], [obs])
    assert (a.decided_by, str(a)) == ("agent", "nonsense")
    # snap: a tap just beside the Chrome icon moves onto it
    near = TAP_CHROME.replace("0.1389", "0.2550")  # between Chrome and Settings, nearer Chrome
    h = HarnessAgent({**H0_COMPONENTS, "xi": '{"snap": true, "snap_px": 100}'}, Scripted(near))
    [a] = h.act_batch([0], [obs])
    assert a.decided_by == "xi:snap"
    obs, *_ = env.step(a)
    assert env.state.page.app == "chrome"


def test_who_decided_is_on_every_step_of_a_fleet_s_episodes_and_in_the_store(tmp_path):
    from digirl_lite.data.store import TrajectoryStore

    comps = Harness().extend([Edit("skill", '{"id": "chrome", "when": {"element": '
                                            '{"id": "icon:chrome"}}, "do": {"tap": '
                                            '{"id": "icon:chrome"}}}')]).components
    fleet = SyncFleet(SimEnvFactory(tasks="webshop", ui_tree=True,
                                    surprises=Surprises.none()), 2, backend="local")
    screens = ScreenTable()
    eps = fleet.collect(HarnessAgent(comps, Scripted("PRESS_HOME?")),
                        ["Go to ebay.com", "Go to target.com"], screens, id_prefix="h", seed=0)
    trajs = [e.trajectory for e in eps]
    assert all(t.steps[0].decided_by == "rule:chrome" for t in trajs)
    assert all(s.decided_by == "agent" for t in trajs for s in t.steps[1:])
    shares = decision_shares(trajs)
    n = sum(len(t) for t in trajs)
    assert shares["rule"] == pytest.approx(2 / n) and shares["xi"] == 0.0
    TrajectoryStore.create(tmp_path / "s").append(trajs, screens, offload=False)
    back, _ = TrajectoryStore.open(tmp_path / "s").load(with_images=False)
    assert [s.decided_by for t in back for s in t.steps] == \
        [s.decided_by for t in trajs for s in t.steps]


@pytest.mark.slow
def test_common_random_numbers_a_row_draws_the_same_whatever_its_batch():
    """With row seeds a row's sample does not depend on the other rows (so a harness that
    takes some phones away from the agent leaves the others' draws as they were)."""
    import numpy as np

    from digirl_lite.paths import data_dir
    from digirl_lite.policy.factory import load_policy

    policy = load_policy(data_dir() / "policies" / "sft-webshop")
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((3, policy.img_dim)).astype("float32")
    prompts = ["Previous Actions: Goal: Go to ebay.com</s>"] * 3
    alone = policy.sample(prompts[:1], feats[:1], row_seeds=[11])
    batch = policy.sample(prompts, feats, row_seeds=[11, 12, 13])
    again = policy.sample(prompts[1:], feats[1:], row_seeds=[12, 13])
    def draws(samples):  # the log-probabilities differ in the last bits between batch sizes
        return [(s.text, s.token_ids) for s in samples]

    assert draws(batch[:1]) == draws(alone) and draws(batch[1:]) == draws(again)
    other = [policy.sample(prompts[:1], feats[:1], row_seeds=[s])[0].text for s in range(8)]
    assert len(set(other)) > 1  # the seed is what decides, not a fixed draw
    with pytest.raises(ValueError, match="row seeds"):
        policy.sample(prompts, feats, row_seeds=[1])
