"""The scripted proposer: evidence turned into harness edits mechanically (issue 30, item 3).

It runs the whole DarwinX loop on a CPU without a language model; the gate, not this
proposer, is what decides (and what the tests hold to account). Each call proposes the one
candidate edit with the most supporting evidence that was not judged before (the memory
K_g's ``worked`` and ``regressed``) and that the parent does not hold:

- failure evidence, theme ``unparseable``: ``xi`` repair, then ``xi`` retry;
- failure evidence, theme ``stuck`` (the same action twice, the screen unchanged): a rule
  pressing back on ``repeated_no_change``;
- failure evidence, theme ``overlay``: a rule tapping the dialog's dismiss element (a
  clickable node drawn over the screen whose text reads like close / accept / no thanks),
  else pressing back while the dialog is there;
- teacher evidence (the reference trajectory of a task the agent never solved) and self
  evidence (the agent's own pass on a task it also failed): one rule per step of the
  reference, written from the screen it was taken on: ``when`` = the element acted on
  (unfocused, for a tap) and the screen's anchors (its non-clickable, non-dialog element
  ids: which page it is), ``do`` = that step's action (a tap on the element, back, enter
  with the goal's text in the focused field, typing the goal's quoted text into the
  focused field, waiting on a screen with nothing to tap). Steps a rule cannot express
  (typing anything but the goal's quoted text) are left to the agent.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from digirl_lite.actions import ActionType, parse_action
from digirl_lite.envs.uitree import UINode, parse_tree_text
from digirl_lite.harness.evidence import Evidence, EvidenceStep, Memory, ProposalError
from digirl_lite.harness.harness import Edit, check_components
from digirl_lite.harness.rules import dismiss_button, overlay_part, quoted_text

__all__ = ["ScriptedProposer", "dismiss_button"]


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")[:40] or "x"


def _anchors(nodes: list[UINode]) -> list[dict[str, Any]]:
    """The screen's non-clickable, non-dialog element ids (which page it is)."""
    container, _ = overlay_part(nodes)
    cut = nodes.index(container) if container is not None else len(nodes)
    return [{"id": n.id} for n in nodes[:cut]
            if n.id and not n.clickable and n.id != "status_bar"][:3]


def _rule(rid: str, when: dict[str, Any], do: Any) -> str:
    return json.dumps({"id": rid, "when": when, "do": do})


def _rule_from_step(step: EvidenceStep, goal: str, origin: str) -> str | None:
    """The rule that repeats a reference step on screens like the one it was taken on."""
    nodes = parse_tree_text(step.tree)
    if not nodes:
        return None
    action = parse_action(step.action)
    if not action.is_valid:
        return None
    anchors = _anchors(nodes)
    container, _ = overlay_part(nodes)
    focused = next((n for n in nodes if n.focused), None)
    t = action.action_type
    if t is ActionType.DUAL_POINT and step.element:
        el = step.element
        if not el.get("clickable"):
            if any(n.clickable for n in nodes):
                return None
            return _rule(f"{origin}-wait", {"absent": {"clickable": True}},
                         {"tap": {"id": el["id"]}}) if el.get("id") else None
        spec = {"id": el["id"], "focused": False}
        when: dict[str, Any] = {"element": [spec] + anchors}
        return _rule(f"{origin}-tap-{_slug(el['id'])}", when, {"tap": {"id": el["id"]}})
    if t is ActionType.PRESS_BACK:
        if container is not None:
            return _rule(f"{origin}-back-{_slug(container.id)}",
                         {"element": {"id": container.id}}, "back")
        return None
    q = quoted_text(goal)
    if t is ActionType.TYPE and focused is not None and q and \
            action.typed_text.strip().lower() == q.lower():
        return _rule(f"{origin}-type-{_slug(focused.id)}",
                     {"element": [{"id": focused.id, "focused": True}] + anchors,
                      "absent": {"id": focused.id, "text": "$goal_text"}}, "type_goal_text")
    if t is ActionType.PRESS_ENTER and focused is not None and q and \
            q.lower() in focused.text.lower():
        return _rule(f"{origin}-enter-{_slug(focused.id)}",
                     {"element": [{"id": focused.id, "focused": True,
                                   "text": "$goal_text"}] + anchors}, "enter")
    return None


def _overlay_rule(step: EvidenceStep) -> str | None:
    container, n = dismiss_button(parse_tree_text(step.tree))
    if container is None:
        return None
    if n is not None:
        return _rule(f"dismiss-{_slug(n.id)}", {"element": {"id": n.id}},
                     {"tap": {"id": n.id}})
    return _rule(f"dismiss-{_slug(container.id)}-back", {"element": {"id": container.id}},
                 "back")


def _first_divergence(good: Sequence[EvidenceStep], bad: Sequence[EvidenceStep]) -> int:
    for i, (a, b) in enumerate(zip(good, bad)):
        if a.action != b.action:
            return i
    return min(len(good), len(bad))


class ScriptedProposer:
    """Mechanical edits from evidence (see the module docstring). ``max_edits``: edits
    per child (1: one rule or switch at a time, so the gate judges each alone)."""

    name = "scripted"

    def __init__(self, max_edits: int = 1) -> None:
        if max_edits < 1:
            raise ValueError("max_edits must be at least 1")
        self.max_edits = max_edits

    def candidates(self, evidence: Sequence[Evidence]) -> OrderedDict[tuple[str, str], dict]:
        """Every edit the evidence supports: ``(kind, content) -> {"support", "evidence"}``,
        in order of first appearance."""
        out: OrderedDict[tuple[str, str], dict] = OrderedDict()

        def add(kind: str, content: str | None, ev: Evidence) -> None:
            if content is None:
                return
            rec = out.setdefault((kind, content), {"support": 0, "evidence": set()})
            rec["support"] += 1
            rec["evidence"].add(ev.kind)

        for ev in evidence:
            if ev.kind == "failure":
                if ev.theme == "unparseable":
                    add("xi", json.dumps({"repair": True}), ev)
                    add("xi", json.dumps({"retry": True}), ev)
                elif ev.theme == "stuck":
                    add("skill", _rule("unstick-back",
                                       {"last_action": "repeated_no_change"}, "back"), ev)
                elif ev.theme == "overlay" and 0 <= ev.at < len(ev.steps):
                    add("skill", _overlay_rule(ev.steps[ev.at]), ev)
            elif ev.kind == "teacher":
                for s in ev.steps:
                    add("skill", _rule_from_step(s, ev.task, "teach"), ev)
            elif ev.kind == "self" and ev.contrast:
                i = _first_divergence(ev.steps, ev.contrast)
                if i < len(ev.steps):
                    add("skill", _rule_from_step(ev.steps[i], ev.task, "self"), ev)
        return out

    def propose(self, components: dict[str, str], evidence: Sequence[Evidence],
                memory: Memory) -> list[Edit]:
        _, xi, rules = check_components(components, "parent")
        have_ids = {r.id for r in rules}
        tried = memory.tried()
        for content in tried:  # a rule judged once is not proposed again, whatever its when
            for line in content.splitlines():
                try:
                    have_ids.add(json.loads(line)["id"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    pass
        ranked = sorted(self.candidates(evidence).items(),
                        key=lambda kv: -kv[1]["support"])  # stable: first seen first
        edits: list[Edit] = []
        for (kind, content), rec in ranked:
            if content in tried:
                continue
            if kind == "xi" and all(xi.get(k) for k in json.loads(content)):
                continue  # the parent has it on
            if kind == "skill" and json.loads(content)["id"] in have_ids:
                continue
            edits.append(Edit(kind, content, {"proposer": self.name,
                                              "evidence": sorted(rec["evidence"]),
                                              "support": rec["support"]}))
            if kind == "skill":
                have_ids.add(json.loads(content)["id"])
            if len(edits) >= self.max_edits:
                break
        if not edits:
            raise ProposalError("no untried edit: the evidence supports only edits already "
                                "judged or held by the parent")
        return edits
