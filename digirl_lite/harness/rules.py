"""Skills: rules in a small declarative JSON language that act before the agent (issue 30).

A skill is one JSON object per line (blank lines and lines starting with ``#`` are skipped),
so an error names its line::

    {"id": "ok", "when": {"element": {"id": "consent:accept"}}, "do": "enter"}
    {"id": "unstick", "when": {"last_action": "repeated_no_change"}, "do": "back"}

``when`` holds conditions that must all be true (an empty ``when`` is always true):

- ``element``: ``{"id": ..., "text": ..., "clickable": bool, "focused": bool}`` a node of
  the UI tree matches (``id`` exact, or a shell pattern with ``*``; ``text`` a
  case-insensitive substring, ``"$goal_text"`` standing for the goal's double-quoted text,
  ``"$goal_span"`` for the span the goal asks to type, :func:`goal_span`, whatever its
  quotes), or a list of such objects, each matched by some node;
- ``absent``: the same form (or a list), no node matches (any of them);
- ``text``: some node's text contains this (case-insensitive);
- ``overlay``: true / false: a dialog is over the screen (a node whose class is a dialog or
  frame container, other than the full-screen root, drawn over clickable content:
  :func:`has_overlay`);
- ``last_action``: ``"unparseable"`` (the previous output did not parse),
  ``"no_change"`` (the screen did not change after the previous action) or
  ``"repeated_no_change"`` (the same action twice in a row, the screen unchanged);
- ``step``: an int (that step index) or ``[min, max]`` (inclusive; either may be null);
- ``goal``: a case-insensitive substring of the task instruction (a demanding user's
  addition to the issue's list: a rule for "select the first entry" tasks only).

``do`` is one of ``"back"``, ``"home"``, ``"enter"``, ``"type_goal_text"`` (type the goal's
double-quoted text), ``"type_goal_span"`` (type the span the goal asks to type,
:func:`goal_span`: any quotes, or none), ``"dismiss"`` (tap the button of the dialog over
the screen that reads like close / no thanks / cancel / accept, :func:`dismiss_button`, else
BACK; no dialog: the rule cannot act), ``"wait"`` (a tap on the screen's top edge, where
nothing is: the page goes on loading), ``"agent"`` (hand over: the rule only marks the
step), or ``{"tap": {"id": ...}}`` / ``{"tap": {"text": ...}}`` (the first matching node,
clickable ones first; none matching hands the step to the agent). A rule that cannot act
(nothing to type, no dialog, no node to tap) leaves the step to the next rule.

A rule that acted and left the screen unchanged does not act again on that screen (the agent
decides instead): a rule cannot trap an episode in a loop.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from digirl_lite.actions import Action, ActionType, format_action

__all__ = ["Rule", "RuleError", "StepContext", "parse_rules", "parse_rule", "rules_text",
           "has_overlay", "overlay_part", "dismiss_button", "quoted_text", "goal_span",
           "find_node", "decide", "tap_action", "LAST_ACTIONS", "DOS", "GOAL_TEXT", "GOAL_SPAN"]

LAST_ACTIONS = ("unparseable", "no_change", "repeated_no_change")
DOS = ("back", "home", "enter", "type_goal_text", "type_goal_span", "dismiss", "wait",
       "agent")
CONDITIONS = ("element", "absent", "text", "overlay", "last_action", "step", "goal")
_MATCH_KEYS = ("id", "text", "clickable", "focused")
GOAL_TEXT = "$goal_text"
GOAL_SPAN = "$goal_span"
_OVERLAY_CLASSES = ("FrameLayout", "Dialog", "PopupWindow", "AlertDialog")
_DISMISS = re.compile(r"\b(close|accept|no thanks|not now|dismiss|ok|got it|skip|cancel|x)\b",
                      re.IGNORECASE)
_QUOTED = re.compile(r"[\"“]([^\"”]+)[\"”]")
# A quote of any kind that opens at a word start and closes at a word end, so an apostrophe
# ("What's", "Denny's") never opens one.
_ANY_QUOTED = re.compile(r"(?:^|(?<=[\s,:;(]))([\"“”'‘’])(?=\S)(.+?)(?<=\S)[\"“”'‘’]"
                         r"(?=$|[\s,.;:!?)])")
_ASKING = re.compile(r"(?:^|[,;:]\s*|\b(?:and|then|please|you)\s+)(?:search\s+for|search|"
                     r"look\s*up|look\s+for|google|find(?:\s+me)?|shop\s+for|show\s+me|check|"
                     r"tell\s+me|get\s+me(?!\s+to\b)|"
                     r"i\s+need|i\s+want|i(?:'|’|\s+a)m\s+looking\s+for)\s+(?P<rest>.+)$",
                     re.I | re.S)
_SPAN_TAIL = re.compile(r"\s*(?:[,;]\s*|\s(?:and|then)\s+|\s(?:on|at|from|in|over\s+at)\s+"
                        r"[a-z0-9-]+\.[a-z]{2,}\b).*$", re.I | re.S)
_QUESTION = re.compile(r"^(?:what|what's|whats|where|when|who|which|why|how|is|are|can|could|"
                       r"do|does|will|should)\b|\?\s*$", re.I)
_ARTICLE = re.compile(r"^(?:a|an|the|some)\s+", re.I)


class RuleError(ValueError):
    """A rule that does not parse; the message names where (file or proposal) and line."""


@dataclass(frozen=True)
class Rule:
    """One parsed rule; ``source`` says where it came from (for reports and errors)."""

    id: str
    when: dict[str, Any]
    do: Any
    source: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "when": self.when, "do": self.do}

    def line(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=False)


@dataclass
class StepContext:
    """What a rule can look at: the goal, the tree, the step index and the last actions."""

    goal: str
    nodes: Sequence[Any]
    step: int
    last_unparseable: bool = False
    last_no_change: bool = False
    last_repeated_no_change: bool = False
    fired_here: set[str] = field(default_factory=set)
    """Rules that acted on this very screen already (they do not act again on it)."""


def _where(source: str, line: int | None) -> str:
    return f"{source or 'rules'}" + (f", line {line}" if line is not None else "")


def _check_match(spec: Any, where: str, key: str) -> dict[str, Any]:
    if not isinstance(spec, dict) or not spec:
        raise RuleError(f"{where}: {key!r} must be an object with some of {_MATCH_KEYS}")
    bad = [k for k in spec if k not in _MATCH_KEYS]
    if bad:
        raise RuleError(f"{where}: {key!r} has unknown key(s) {bad}; use {_MATCH_KEYS}")
    for k in ("id", "text"):
        if k in spec and (not isinstance(spec[k], str) or not spec[k]):
            raise RuleError(f"{where}: {key}.{k} must be a non-empty string")
    for k in ("clickable", "focused"):
        if k in spec and not isinstance(spec[k], bool):
            raise RuleError(f"{where}: {key}.{k} must be true or false")
    return dict(spec)


def parse_rule(obj: Any, source: str = "", line: int | None = None) -> Rule:
    """One rule from its JSON object.

    Raises:
        RuleError: what is wrong, with ``source`` and ``line``.
    """
    where = _where(source, line)
    if not isinstance(obj, dict):
        raise RuleError(f"{where}: a rule is a JSON object, got {type(obj).__name__}")
    unknown = [k for k in obj if k not in ("id", "when", "do")]
    if unknown:
        raise RuleError(f"{where}: unknown key(s) {unknown}; a rule has id, when, do")
    rid = obj.get("id")
    if not isinstance(rid, str) or not rid.strip():
        raise RuleError(f"{where}: a rule needs an \"id\" (a non-empty string)")
    when = obj.get("when", {})
    if not isinstance(when, dict):
        raise RuleError(f"{where}: rule {rid!r}: \"when\" must be an object")
    for k, v in when.items():
        if k not in CONDITIONS:
            raise RuleError(f"{where}: rule {rid!r}: unknown condition {k!r}; use {CONDITIONS}")
        if k in ("element", "absent"):
            for spec in (v if isinstance(v, list) and v else [v]):
                _check_match(spec, f"{where}: rule {rid!r}", k)
        elif k in ("text", "goal") and (not isinstance(v, str) or not v):
            raise RuleError(f"{where}: rule {rid!r}: {k!r} must be a non-empty string")
        elif k == "overlay" and not isinstance(v, bool):
            raise RuleError(f"{where}: rule {rid!r}: \"overlay\" must be true or false")
        elif k == "last_action" and v not in LAST_ACTIONS:
            raise RuleError(f"{where}: rule {rid!r}: last_action {v!r} is not one of "
                            f"{LAST_ACTIONS}")
        elif k == "step":
            ok = (isinstance(v, int) and not isinstance(v, bool) and v >= 0) or (
                isinstance(v, list) and len(v) == 2
                and all(x is None or (isinstance(x, int) and not isinstance(x, bool))
                        for x in v))
            if not ok:
                raise RuleError(f"{where}: rule {rid!r}: \"step\" must be an int >= 0 or "
                                "[min, max]")
    if "do" not in obj:
        raise RuleError(f"{where}: rule {rid!r} has no \"do\"")
    do = obj["do"]
    if isinstance(do, str):
        if do not in DOS:
            raise RuleError(f"{where}: rule {rid!r}: do {do!r} is not one of {DOS} or "
                            "{\"tap\": {...}}")
    elif isinstance(do, dict) and list(do) == ["tap"]:
        spec = _check_match(do["tap"], f"{where}: rule {rid!r}", "tap")
        if "id" not in spec and "text" not in spec:
            raise RuleError(f"{where}: rule {rid!r}: tap needs an id or a text")
    else:
        raise RuleError(f"{where}: rule {rid!r}: do must be one of {DOS} or "
                        "{\"tap\": {\"id\" or \"text\": ...}}")
    return Rule(rid.strip(), dict(when), do, source)


def parse_rules(text: str, source: str = "skills", first_line: int = 1) -> list[Rule]:
    """Every rule of ``text`` (one JSON object per line). Ids must be unique.

    Raises:
        RuleError: the first line that does not parse, named by ``source`` and its line
            number (``first_line`` is the number of the text's first line in its file).
    """
    if not isinstance(text, str):
        raise RuleError(f"{source}: skills must be text, got {type(text).__name__}")
    out: list[Rule] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(text.splitlines()):
        line = raw.strip()
        n = first_line + i
        if not line or line.startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise RuleError(f"{_where(source, n)}: not JSON ({e.msg}, column {e.colno}): "
                            f"{line[:120]!r}") from None
        rule = parse_rule(obj, source, n)
        if rule.id in seen:
            raise RuleError(f"{_where(source, n)}: rule id {rule.id!r} is already used on "
                            f"line {seen[rule.id]}")
        seen[rule.id] = n
        out.append(rule)
    return out


def rules_text(rules: Sequence[Rule]) -> str:
    return "".join(r.line() + "\n" for r in rules)


def _matches(node: Any, spec: dict[str, Any], goal: str = "") -> bool:
    if "id" in spec:
        pat = spec["id"]
        if not (fnmatch.fnmatchcase(node.id, pat) if "*" in pat else node.id == pat):
            return False
    if "text" in spec:
        want = spec["text"]
        if want in (GOAL_TEXT, GOAL_SPAN):
            want = quoted_text(goal) if want == GOAL_TEXT else goal_span(goal)
            if want is None:
                return False
        if want.lower() not in (node.text or "").lower():
            return False
    for k in ("clickable", "focused"):
        if k in spec and bool(getattr(node, k)) != spec[k]:
            return False
    return True


def find_node(nodes: Sequence[Any], spec: dict[str, Any], goal: str = "") -> Any | None:
    """The first node matching ``spec`` (``goal``: the task, for ``"$goal_text"``),
    clickable nodes first."""
    hits = [n for n in nodes if _matches(n, spec, goal)]
    for n in hits:
        if n.clickable:
            return n
    return hits[0] if hits else None


def has_overlay(nodes: Sequence[Any]) -> bool:
    """A dialog over the screen: a container node (a dialog or frame layout class) drawn
    after (over) some clickable node. The screen's own root container comes first, so it
    never counts; on a real device a frame nested inside the content can (a heuristic: a
    rule that needs certainty names the dialog's element instead)."""
    seen_clickable = False
    for n in nodes:
        if seen_clickable and n.cls.rsplit(".", 1)[-1] in _OVERLAY_CLASSES:
            return True
        seen_clickable = seen_clickable or bool(n.clickable)
    return False


def overlay_part(nodes: Sequence[Any]) -> tuple[Any | None, list[Any]]:
    """The dialog container over the screen (:func:`has_overlay`'s) and the nodes drawn
    after it (a node's class short, as tree text keeps it, or full, as a device's tree has
    it)."""
    nodes = list(nodes)
    seen_click = False
    for i, n in enumerate(nodes):
        if seen_click and n.cls.rsplit(".", 1)[-1] in _OVERLAY_CLASSES:
            return n, nodes[i + 1:]
        seen_click = seen_click or bool(n.clickable)
    return None, []


def dismiss_button(nodes: Sequence[Any]) -> tuple[Any | None, Any | None]:
    """The dialog container over the screen (None: no dialog) and its first clickable node
    that reads like close / accept / no thanks / cancel (its text, else its id's last
    part; None: the dialog has no such button, BACK is the way out)."""
    container, over = overlay_part(nodes)
    if container is None:
        return None, None
    return container, next((n for n in over if n.clickable
                            and _DISMISS.search(n.text or n.id.split(":")[-1])), None)


def quoted_text(goal: str) -> str | None:
    """The goal's first quoted text (``search for "usb c cable"`` -> ``usb c cable``)."""
    m = _QUOTED.search(goal or "")
    return m.group(1).strip() if m else None


def goal_span(goal: str) -> str | None:
    """The text a goal asks to type, read without a model: its quoted text (quotes of any
    kind), else the words after an asking verb ("search for", "look up", "google", "find",
    ...) up to a clause that follows ("and select ...", ", ...", "on ebay.com"), less a
    leading article, else the goal itself when it is a question (its whole text is the
    search), else None ("Open the Settings" asks to type nothing).

    A deterministic heuristic for agents without the trained span extractor
    (:mod:`digirl_lite.policy.span_extractor`, the policy's copy path): no simulator
    parser, only English. :func:`quoted_text` (double quotes only) stays what
    ``"$goal_text"`` and ``type_goal_text`` read, so evolved rules keep their meaning."""
    goal = (goal or "").strip()
    m = _ANY_QUOTED.search(goal)
    if m:
        return m.group(2).strip() or None
    m = _ASKING.search(goal)
    if m:
        rest = _ARTICLE.sub("", _SPAN_TAIL.sub("", m.group("rest")).strip(" .!?"))
        return rest or None
    if _QUESTION.search(goal):
        return goal.rstrip(" ?.!") or None
    return None


def _holds(rule: Rule, ctx: StepContext) -> bool:
    for k, v in rule.when.items():
        if k == "element" and any(find_node(ctx.nodes, spec, ctx.goal) is None
                                   for spec in (v if isinstance(v, list) else [v])):
            return False
        if k == "absent" and any(find_node(ctx.nodes, spec, ctx.goal) is not None
                                 for spec in (v if isinstance(v, list) else [v])):
            return False
        if k == "text" and not any(v.lower() in (n.text or "").lower() for n in ctx.nodes):
            return False
        if k == "overlay" and has_overlay(ctx.nodes) != v:
            return False
        if k == "last_action" and not {"unparseable": ctx.last_unparseable,
                                        "no_change": ctx.last_no_change,
                                        "repeated_no_change": ctx.last_repeated_no_change}[v]:
            return False
        if k == "step":
            lo, hi = (v, v) if isinstance(v, int) else v
            if (lo is not None and ctx.step < lo) or (hi is not None and ctx.step > hi):
                return False
        if k == "goal" and v.lower() not in ctx.goal.lower():
            return False
    return True


def tap_action(node: Any, width: int, height: int) -> Action:
    """A tap at the centre of ``node`` (screen pixels of a ``width`` x ``height`` screen)."""
    x, y = node.center
    return Action.tap(x=round(min(max(x / width, 0.0), 1.0), 4),
                      y=round(min(max(y / height, 0.0), 1.0), 4))


def decide(rules: Sequence[Rule], ctx: StepContext, width: int, height: int
           ) -> tuple[Rule, str | None] | None:
    """The first rule whose conditions hold and that can act: ``(rule, action text)``;
    the text is None for ``"agent"`` (the rule hands over). None when no rule holds."""
    for rule in rules:
        if rule.id in ctx.fired_here or not _holds(rule, ctx):
            continue
        do = rule.do
        if do == "agent":
            return rule, None
        if do == "back":
            return rule, format_action(Action.key(ActionType.PRESS_BACK))
        if do == "home":
            return rule, format_action(Action.key(ActionType.PRESS_HOME))
        if do == "enter":
            return rule, format_action(Action.key(ActionType.PRESS_ENTER))
        if do in ("type_goal_text", "type_goal_span"):
            q = quoted_text(ctx.goal) if do == "type_goal_text" else goal_span(ctx.goal)
            if q is None:
                continue  # nothing to type: the rule cannot act
            return rule, format_action(Action.type_text(q))
        if do == "dismiss":
            container, button = dismiss_button(ctx.nodes)
            if container is None:
                continue  # no dialog: nothing to dismiss
            return rule, format_action(tap_action(button, width, height) if button is not None
                                       else Action.key(ActionType.PRESS_BACK))
        if do == "wait":
            return rule, format_action(Action.tap(x=0.5, y=0.01))
        node = find_node(ctx.nodes, do["tap"], ctx.goal)
        if node is None:
            continue
        return rule, format_action(tap_action(node, width, height))
    return None
