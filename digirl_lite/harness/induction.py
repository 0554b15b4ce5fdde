"""The induction proposer: rules learned from the agent's own episodes (issue 48, item 2).

DarwinX on a CPU, with no language model and nothing a deployed agent lacks: it reads the
evidence of :func:`~digirl_lite.harness.runner.evidence_from` (the UI tree of every step, the
actions, who decided them, the judge's verdicts) and never the phone's internal state or a
scripted expert. Two sources, after two papers:

- **Workflows from successes** (Agent Workflow Memory, Wang et al. 2024, section 2): every
  step of a successful episode (the agent's own passes, ``self`` evidence, and a teacher's
  reference episodes where the loop has one) is abstracted into candidate rules by the
  :data:`TEMPLATES`: what it did on that kind of screen, with the goal's own words replaced
  by ``"$goal_span"`` (:func:`~digirl_lite.harness.rules.goal_span`, the span reader the
  screen teacher and the rules' ``type_goal_span`` use, whatever the quotes) and the
  elements named by what the screen showed (their id or text in the tree).
- **Insights from contrasts** (ExpeL, Zhao et al. 2024, section 4.2): each candidate is
  replayed through the rule engine itself (:func:`~digirl_lite.harness.rules.decide`) on every
  recorded step, passes and failures alike, so that "similar screens" are exactly the
  screens where the rule would act. Where it acts on a pass, it agrees with what the pass
  did or it conflicts; where it acts on a failure and the failure did otherwise, the rule
  would have changed that episode. A candidate's score is the failures it changes times
  its precision on the passes (agreements over agreements and conflicts); one that acts on
  no failure changes nothing and is never proposed. Failure themes alone give insights too
  (a dialog the agent did not close: ``dismiss``; the same action on an unchanged screen:
  ``back``; output that does not parse: ``xi`` repair and retry), scored the same way.

Rules use the generic GUI primitives of :data:`PRIMITIVES` only; no primitive and no
template names an element id, site or app of any phone (``tests/harness/test_induction.py`` reads
them against the simulator's). The ids and texts an induced rule holds are the ones the
agent saw on its screen.

Selected by ``EvolveConfig.proposer = "induction"`` (``--set proposer=induction``).

Measured once (seed 0, the shipped policies, temperature 1; every kept rule applied at once,
no gate): from 24 episodes on 12 evolution tasks, Web Shopping kept 4 rules (type the span
into the shop's search box, dismiss, open that box, unstick) and the 24 first test tasks went
from 16/24 to 24/24, 3 of the 4 rules acting there; General's 3 passes gave no workflow
(dismiss alone, 13/24 either way), with the screen teacher's 10 reference episodes it kept 4
(type the span, dismiss, wait) and went from 13/24 to 22/24. Inside DarwinX the gate judges
each rule alone. The loop's evidence (:func:`~digirl_lite.harness.runner.evidence_from`) holds
one pass of every task the agent solved, beside a failure where it also failed the task, alone
where it always solved it; ``EvolveConfig.evidence`` chooses the kinds the loop hands over.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from digirl_lite.actions import Action, ActionType, parse_action
from digirl_lite.envs.uitree import UINode, parse_tree_text
from digirl_lite.harness.evidence import EVIDENCE_KINDS, Evidence, EvidenceStep
from digirl_lite.harness.proposers import ScriptedProposer
from digirl_lite.harness.rules import (
    GOAL_SPAN,
    Rule,
    RuleError,
    StepContext,
    decide,
    find_node,
    goal_span,
    overlay_part,
    parse_rule,
)

__all__ = ["InductionProposer", "PRIMITIVES", "TEMPLATES", "instantiate", "Episode",
           "episodes_from", "score_rule", "RuleScore"]

PRIMITIVES: dict[str, str] = {
    "tap": "tap an element named on the screen (by the id or text the tree showed)",
    "type_goal_span": "type the span the goal asks to type (rules.goal_span, any quotes)",
    "enter": "submit the focused field",
    "back": "press back",
    "wait": "let the page load (a tap where nothing is)",
    "dismiss": "close the dialog over the screen by its button, else press back",
}
"""The actions an induced rule may take (each is a ``do`` of the rule language)."""

TEMPLATES: dict[str, dict[str, Any]] = {
    # a dialog over the screen: close it by its button
    "dismiss": {"when": {"overlay": True}, "do": "dismiss"},
    # nothing to tap yet: the page is loading
    "wait": {"when": {"absent": {"clickable": True}}, "do": "wait"},
    # the same action twice, the screen unchanged
    "unstick": {"when": {"last_action": "repeated_no_change"}, "do": "back"},
    # the field the passes typed the goal's span into, before it holds the span: open it
    "open-field": {"when": {"element": [{"id": "<field>", "focused": False}, "<anchors>"],
                            "absent": [{"id": "<field>", "text": GOAL_SPAN}, {"focused": True}],
                            "overlay": False},
                   "do": {"tap": {"id": "<field>"}}},
    # that field, focused and not holding the span yet: type it
    "type-span": {"when": {"element": [{"id": "<field>", "focused": True}, "<anchors>"],
                           "absent": {"id": "<field>", "text": GOAL_SPAN}},
                  "do": "type_goal_span"},
    # any focused field not holding the span
    "type-span-any": {"when": {"element": {"focused": True},
                               "absent": {"focused": True, "text": GOAL_SPAN}},
                      "do": "type_goal_span"},
    # the field holds the span: submit it
    "enter-span": {"when": {"element": [{"id": "<field>", "focused": True, "text": GOAL_SPAN},
                                        "<anchors>"]},
                   "do": "enter"},
    # the element a pass tapped, on a page like the one it tapped it on
    "tap-element": {"when": {"element": [{"id": "<node>", "focused": False}, "<anchors>"],
                             "overlay": False},
                    "do": {"tap": {"id": "<node>"}}},
    # the same, for an element the tree gives no id: by its text
    "tap-label": {"when": {"element": [{"text": "<label>", "clickable": True}, "<anchors>"],
                           "overlay": False},
                  "do": {"tap": {"text": "<label>"}}},
    # a pass pressed back on a page like this one
    "back-from": {"when": {"element": ["<anchors>"], "overlay": False}, "do": "back"},
}
"""Rule templates: ``<name>`` placeholders are filled from the screen a step was taken on
(``<anchors>``: that page's informative, non-clickable elements, spliced into the list)."""

_XI = (("xi", json.dumps({"repair": True})), ("xi", json.dumps({"retry": True})))
_PLACEHOLDER = re.compile(r"^<(\w+)>$")
_COMMON = 0.9
"""An id on at least this share of all screens seen says nothing about which page it is."""
MIN_PRECISION = 0.75
"""A candidate that conflicts with the passes more often than this allows is not proposed."""
MIN_GOALS = 2
"""A candidate the passes support must be supported by passes of this many distinct goals: a
workflow is what passes of several tasks share (Agent Workflow Memory induces from several
examples); what one task's pass did on a screen every task sees (the app it opened from the
launcher) is that task's, not a rule. Measured on General (24 episodes of the shipped
policy): the one pass of "open the maps app" gave "tap Maps on the launcher", which would
have changed all 21 failures and took held-out success from 13/24 to 1/24."""
FAILURE_ONLY_PRECISION = 0.5
"""The precision given to an insight that acts on no pass (a failure theme alone): a prior,
below every candidate the passes agree with."""


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(s).lower()).strip("-")[:32] or "x"


def instantiate(template: str, **bindings: Any) -> dict[str, Any]:
    """The rule object of ``template`` (:data:`TEMPLATES`) with its placeholders filled;
    ``anchors`` (a list of element specs) is spliced where ``"<anchors>"`` stands, and
    nothing where it is empty. The rule id names the template and a short hash of the rest.

    Raises:
        RuleError: the template is not known, a placeholder has no binding, or the rule
            does not parse.
    """
    if template not in TEMPLATES:
        raise RuleError(f"induction: unknown template {template!r}; known: "
                        f"{sorted(TEMPLATES)}")

    def fill(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: fill(v) for k, v in x.items()}
        if isinstance(x, list):
            out: list[Any] = []
            for v in x:
                if v == "<anchors>":
                    out += list(bindings.get("anchors") or [])
                else:
                    out.append(fill(v))
            return out
        m = _PLACEHOLDER.match(x) if isinstance(x, str) else None
        if m:
            if m.group(1) not in bindings:
                raise RuleError(f"induction: template {template!r} needs <{m.group(1)}>")
            return bindings[m.group(1)]
        return x

    t = fill(TEMPLATES[template])
    when = {k: (v[0] if isinstance(v, list) and len(v) == 1 else v)
            for k, v in t["when"].items() if v != []}
    key = json.dumps([when, t["do"]], sort_keys=True)
    main = bindings.get("field") or bindings.get("node") or bindings.get("label") or ""
    rid = "ind-" + template + (f"-{_slug(main)}" if main else "") + "-" + \
        hashlib.sha1(key.encode()).hexdigest()[:6]
    obj = {"id": rid, "when": when, "do": t["do"]}
    parse_rule(obj, "induction")  # every candidate is a rule of the language
    return obj


# ---------------------------------------------------------------------------------------
# episodes as the proposer reads them
# ---------------------------------------------------------------------------------------
def _nodes(tree: str) -> list[UINode]:
    """The tree text's nodes; a node text of several lines (a result row's title and price)
    is read as one line (:func:`~digirl_lite.envs.uitree.parse_tree_text` reads one line
    per node)."""
    lines: list[str] = []
    for line in (tree or "").splitlines():
        if lines and not line.startswith("[") and not line.startswith("... "):
            lines[-1] += " " + line
        else:
            lines.append(line)
    return parse_tree_text("\n".join(lines))


@dataclass
class Episode:
    """One recorded episode: its goal, whether it succeeded, where it came from (an
    evidence kind), and per step the screen's nodes, the action and the node tapped."""

    goal: str
    success: bool
    origin: str
    steps: list[EvidenceStep]
    nodes: list[list[UINode]] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.nodes = [_nodes(s.tree) for s in self.steps]
        self.actions = [parse_action(s.action) for s in self.steps]

    def context(self, i: int) -> StepContext:
        """What a rule saw at step ``i`` (the last-action flags read from the steps
        before it)."""
        prev = self.steps[i - 1] if i >= 1 else None
        prev2 = self.steps[i - 2] if i >= 2 else None
        return StepContext(
            goal=self.goal, nodes=self.nodes[i], step=self.steps[i].step,
            last_unparseable=prev is not None and not prev.valid,
            last_no_change=prev is not None and not prev.screen_changed,
            last_repeated_no_change=(prev is not None and prev2 is not None
                                     and not prev.screen_changed
                                     and not prev2.screen_changed
                                     and prev.action == prev2.action))


def episodes_from(evidence: Sequence[Evidence], kinds: Sequence[str] = EVIDENCE_KINDS
                  ) -> list[Episode]:
    """The distinct episodes in ``evidence`` of ``kinds``: passes (``self`` evidence's steps,
    a teacher's reference) and failures (``failure`` evidence, the contrasts). An episode
    met twice (a failure that is also a contrast) is read once."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    out: list[Episode] = []

    def add(goal: str, steps: Sequence[EvidenceStep], success: bool, origin: str) -> None:
        key = (goal, tuple(s.action + "\x00" + s.tree for s in steps))
        if steps and key not in seen:
            seen.add(key)
            out.append(Episode(goal, success, origin, list(steps)))

    for ev in evidence:
        if ev.kind not in kinds:
            continue
        if ev.kind == "failure":
            add(ev.task, ev.steps, False, "failure")
        elif ev.kind in ("self", "teacher"):
            add(ev.task, ev.steps, True, ev.kind)
            add(ev.task, ev.contrast, False, "failure")
    return out


# ---------------------------------------------------------------------------------------
# candidates (Agent Workflow Memory) and their scores (ExpeL's contrasts)
# ---------------------------------------------------------------------------------------
def _common_ids(episodes: Sequence[Episode]) -> set[str]:
    screens = [n for e in episodes for n in e.nodes if n]
    counts: dict[str, int] = {}
    for nodes in screens:
        for i in {n.id for n in nodes if n.id}:
            counts[i] = counts.get(i, 0) + 1
    return {i for i, c in counts.items() if screens and c >= _COMMON * len(screens)}


def _anchors(nodes: Sequence[UINode], common: set[str], limit: int = 2
             ) -> list[dict[str, Any]]:
    """Which page a screen is: its non-clickable elements with an id, outside any dialog,
    less the ones on nearly every screen."""
    container, _ = overlay_part(nodes)
    cut = list(nodes).index(container) if container is not None else len(nodes)
    return [{"id": n.id} for n in list(nodes)[:cut]
            if n.id and not n.clickable and n.id not in common][:limit]


def _tapped(ep: Episode, i: int) -> UINode | None:
    el = ep.steps[i].element
    if not el:
        return None
    return next((n for n in ep.nodes[i] if n.id == el.get("id")), None)


def _types_span_into(ep: Episode, i: int, field_id: str, within: int = 3) -> bool:
    """Whether the pass typed the goal's span into the field ``field_id`` within
    ``within`` steps after step ``i``."""
    span = goal_span(ep.goal)
    for j in range(i + 1, min(i + 1 + within, len(ep.steps))):
        a = ep.actions[j]
        if a.action_type is ActionType.TYPE:
            focused = next((n for n in ep.nodes[j] if n.focused), None)
            return bool(span) and focused is not None and focused.id == field_id \
                and a.typed_text.strip().lower() == span.lower()
    return False


def _from_pass(ep: Episode, i: int, common: set[str]) -> list[dict[str, Any]]:
    """The candidate rules one step of a pass supports."""
    nodes, a = ep.nodes[i], ep.actions[i]
    step = ep.steps[i]
    if not nodes or not a.is_valid or step.decided_by != "agent":
        return []  # a rule's or xi's step: the harness already holds it
    t = a.action_type
    out: list[dict[str, Any]] = []
    container, _ = overlay_part(nodes)
    if container is not None:
        if t is ActionType.PRESS_BACK or (t is ActionType.DUAL_POINT and step.element
                                          and step.screen_changed):
            out.append(instantiate("dismiss"))
        return out
    if not any(n.clickable for n in nodes):
        return [instantiate("wait")]
    span = goal_span(ep.goal)
    focused = next((n for n in nodes if n.focused), None)
    anchors = _anchors(nodes, common)
    if t is ActionType.TYPE and focused is not None and span \
            and a.typed_text.strip().lower() == span.lower():
        if focused.id:
            out.append(instantiate("type-span", field=focused.id, anchors=anchors))
        out.append(instantiate("type-span-any"))
    elif t is ActionType.PRESS_ENTER and focused is not None and focused.id and span \
            and span.lower() in focused.text.lower():
        out.append(instantiate("enter-span", field=focused.id, anchors=anchors))
    elif t is ActionType.DUAL_POINT:
        n = _tapped(ep, i)
        if n is None or not n.clickable or n.focused:
            return out
        if n.id and _types_span_into(ep, i, n.id):
            out.append(instantiate("open-field", field=n.id, anchors=anchors))
        if n.id:
            out.append(instantiate("tap-element", node=n.id, anchors=anchors))
        elif n.text:
            out.append(instantiate("tap-label", label=n.text.splitlines()[0],
                                   anchors=anchors))
    elif t is ActionType.PRESS_BACK and anchors:
        out.append(instantiate("back-from", anchors=anchors))
    return out


def _from_failure(ep: Episode) -> list[dict[str, Any]]:
    """Insights a failure gives alone: a dialog it met, the same action on an unchanged
    screen."""
    out: list[dict[str, Any]] = []
    if any(overlay_part(n)[0] is not None for n in ep.nodes):
        out.append(instantiate("dismiss"))
    if any(ep.context(i).last_repeated_no_change for i in range(len(ep.steps))):
        out.append(instantiate("unstick"))
    return out


def _effect(rule: Rule, ctx: StepContext, text: str) -> tuple[str, Any]:
    """What a rule's action does on a screen: ``("tap", node id)``, ``("type", text)``,
    ``("key", action type)`` or ``("dismiss", None)``."""
    if rule.do == "dismiss":
        return ("dismiss", None)
    if rule.do == "wait":
        return ("wait", None)
    if isinstance(rule.do, dict):
        n = find_node(ctx.nodes, rule.do["tap"], ctx.goal)
        return ("tap", n.id if n is not None else None)
    a = parse_action(text)
    if a.action_type is ActionType.TYPE:
        return ("type", a.typed_text.strip().lower())
    return ("key", a.action_type)


def _agrees(effect: tuple[str, Any], ep: Episode, i: int) -> bool:
    """Whether step ``i`` of ``ep`` did what a rule with ``effect`` would do there."""
    a, step = ep.actions[i], ep.steps[i]
    kind, what = effect
    if kind == "dismiss":  # any way out of the dialog
        over = overlay_part(ep.nodes[i])[1]
        return a.action_type is ActionType.PRESS_BACK or (
            a.action_type is ActionType.DUAL_POINT and step.element is not None
            and any(n.id == step.element.get("id") for n in over))
    if kind == "wait":
        return a.action_type is ActionType.DUAL_POINT
    if kind == "tap":
        return a.action_type is ActionType.DUAL_POINT and step.element is not None \
            and step.element.get("id") == what
    if kind == "type":
        return a.action_type is ActionType.TYPE and a.typed_text.strip().lower() == what
    return a.action_type is what


@dataclass(frozen=True)
class RuleScore:
    """A candidate replayed on the recorded episodes: passes where it acts and agrees
    throughout (``agree``; ``goals``: their distinct goals), passes where it acts otherwise
    once at least (``conflict``), failures where it acts otherwise (``changes``), and the
    resulting score."""

    agree: int
    conflict: int
    changes: int
    goals: int = 0

    @property
    def precision(self) -> float:
        n = self.agree + self.conflict
        return self.agree / n if n else FAILURE_ONLY_PRECISION

    @property
    def score(self) -> float:
        return self.changes * self.precision


def score_rule(rule: Rule, episodes: Sequence[Episode], width: int = 1080,
               height: int = 2280) -> RuleScore:
    """``rule`` replayed alone through :func:`~digirl_lite.harness.rules.decide` on every
    step of ``episodes`` (the ExpeL contrast). A pass's step that left the screen as it was
    (a tap on nothing) is not one the pass needed: a rule acting there does not conflict."""
    agree = conflict = changes = 0
    goals: set[str] = set()
    for ep in episodes:
        acted = differed = False
        for i in range(len(ep.steps)):
            if not ep.nodes[i]:
                continue
            ctx = ep.context(i)
            hit = decide([rule], ctx, width, height)
            if hit is None or hit[1] is None:
                continue
            if ep.success and not ep.steps[i].screen_changed:
                continue  # a step of a pass that did nothing: nothing to conflict with
            acted = True
            if not _agrees(_effect(rule, ctx, hit[1]), ep, i):
                differed = True
                break
        if not acted:
            continue
        if ep.success:
            agree += not differed
            conflict += differed
            if not differed:
                goals.add(ep.goal)
        else:
            changes += differed
    return RuleScore(agree, conflict, changes, len(goals))


class InductionProposer(ScriptedProposer):
    """Edits induced from the agent's own episodes (see the module docstring); the same
    ``propose`` as :class:`~digirl_lite.harness.proposers.ScriptedProposer` (an edit judged
    once, or held by the parent, is not proposed again), on its own candidates.

    Args:
        max_edits: edits per child.
        kinds: the evidence kinds read (``("failure",)`` for failure-derived evidence only;
            ``("failure", "self")`` adds the agent's own passes; the default adds a
            teacher's).
        min_precision: the least precision on the passes a candidate needs.
        min_goals: the least number of distinct goals among the passes it agrees with
            (a candidate no pass meets, a failure theme's insight, needs none).
    """

    name = "induction"

    def __init__(self, max_edits: int = 1, kinds: Sequence[str] = EVIDENCE_KINDS,
                 min_precision: float = MIN_PRECISION, min_goals: int = MIN_GOALS) -> None:
        super().__init__(max_edits)
        bad = [k for k in kinds if k not in EVIDENCE_KINDS]
        if bad or not kinds:
            raise ValueError(f"kinds {list(kinds)!r}: each must be one of {EVIDENCE_KINDS}")
        if not 0 <= min_precision <= 1:
            raise ValueError(f"min_precision must be in [0, 1], got {min_precision}")
        if min_goals < 1:
            raise ValueError(f"min_goals must be at least 1, got {min_goals}")
        self.kinds, self.min_precision, self.min_goals = tuple(kinds), min_precision, min_goals
        self.last_scores: dict[str, RuleScore] = {}
        """The candidates of the last call, by rule id, with their scores (for reports)."""

    def candidates(self, evidence: Sequence[Evidence]) -> OrderedDict[tuple[str, str], dict]:
        """Every edit the episodes support, best first: ``(kind, content) -> {"support":
        score, "evidence": kinds}``."""
        episodes = episodes_from(evidence, self.kinds)
        common = _common_ids(episodes)
        origins: dict[str, tuple[dict[str, Any], set[str]]] = {}
        for ep in episodes:
            found = ([r for i in range(len(ep.steps)) for r in _from_pass(ep, i, common)]
                     if ep.success else _from_failure(ep))
            for obj in found:
                origins.setdefault(obj["id"], (obj, set()))[1].add(ep.origin)
        ranked: list[tuple[tuple[float, int, str], str, str, set[str]]] = []
        self.last_scores = {}
        for rid, (obj, kinds) in origins.items():
            s = score_rule(parse_rule(obj, "induction"), episodes)
            self.last_scores[rid] = s
            if s.changes == 0 or (s.agree + s.conflict > 0 and (
                    s.precision < self.min_precision - 1e-9 or s.goals < self.min_goals)):
                continue  # changes nothing, conflicts with the passes, or one task's own
            ranked.append(((-s.score, -s.agree, rid), "skill", json.dumps(obj), kinds))
        themes = [ep for ep in episodes if not ep.success
                  and any(not s.valid for s in ep.steps)]
        for kind, content in _XI if themes else ():
            ranked.append(((-float(len(themes)) * FAILURE_ONLY_PRECISION, 0, content), kind,
                           content, {"failure"}))
        out: OrderedDict[tuple[str, str], dict] = OrderedDict()
        for key, kind, content, kinds in sorted(ranked):
            out[(kind, content)] = {"support": round(-key[0], 3), "evidence": set(kinds)}
        return out
