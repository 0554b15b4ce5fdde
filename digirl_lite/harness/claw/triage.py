"""Traces and triage: an episode as triage reads it, the patterns worth learning, and
the two triages that write experience units from them (scripted on CPU, an LLM's)."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from digirl_lite.envs.uitree import parse_tree_text
from digirl_lite.harness.claw.units import ClawError, ExperienceUnit, _merge_into, _slug
from digirl_lite.harness.evidence import EvidenceStep
from digirl_lite.harness.rules import has_overlay

if TYPE_CHECKING:
    from digirl_lite.harness.claw.bank import ExperienceBank

_DISMISS_WORDS = ("close", "no thanks", "not now", "cancel", "dismiss", "skip", "later",
                  "reject", "decline", "x", "accept", "ok", "got it")
"""Words of an overlay's dismiss control, most preferred first (ids and texts are searched)."""


# ---------------------------------------------------------------------------------------
# traces and triage
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Trace:
    """One episode as triage reads it: ``steps`` (:class:`EvidenceStep`: each step's tree
    text, action, who decided, whether it parsed and changed the screen) and, where known,
    ``nodes``: each step's UI tree (:class:`~digirl_lite.envs.uitree.UINode` tuples, the
    screen the action was taken on; missing ones are read back from the step's tree text).
    ``seed``: the environment seed that replays it, where known."""

    id: str
    task: str
    success: bool
    steps: tuple[EvidenceStep, ...]
    nodes: tuple[tuple[Any, ...] | None, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "nodes", tuple(
            None if n is None else tuple(n) for n in self.nodes))

    def nodes_at(self, i: int) -> tuple[Any, ...]:
        """Step ``i``'s UI tree (from its tree text where no nodes were kept)."""
        if i < len(self.nodes) and self.nodes[i] is not None:
            return self.nodes[i]
        if 0 <= i < len(self.steps):
            return tuple(parse_tree_text(self.steps[i].tree))
        return ()


def _overlay(nodes: Sequence[Any]) -> list[Any]:
    """The nodes of a dialog over the screen (its container and every node drawn after it),
    by :func:`~digirl_lite.harness.rules.has_overlay`'s test (the container is the node at
    which a growing prefix of the tree first has an overlay); empty when there is none."""
    nodes = list(nodes)
    if not has_overlay(nodes):
        return []
    for k in range(len(nodes)):
        if has_overlay(nodes[:k + 1]):
            return nodes[k:]
    return []  # pragma: no cover - the whole list has one


def _node_at(nodes: Sequence[Any], x: float, y: float) -> Any | None:
    """The topmost node under (x, y) (drawn last), clickable ones first."""
    under = [n for n in nodes if n.bounds[0] <= x <= n.bounds[2]
             and n.bounds[1] <= y <= n.bounds[3]]
    click = [n for n in under if n.clickable]
    return (click or under or [None])[-1]


def _tapped(step: EvidenceStep, nodes: Sequence[Any], width: int, height: int) -> str | None:
    """The id of the node a tap landed on (the step's ``element`` where known)."""
    if step.element and step.element.get("id"):
        return step.element["id"]
    from digirl_lite.actions import ActionType, parse_action

    a = parse_action(step.action)
    if not a.is_valid or a.action_type is not ActionType.DUAL_POINT or a.touch_yx != a.lift_yx:
        return None
    n = _node_at(nodes, a.touch_yx[1] * width, a.touch_yx[0] * height)
    return n.id if n is not None and n.id else None


def _is_back(action: str) -> bool:
    from digirl_lite.actions import ActionType, parse_action

    return parse_action(action).action_type is ActionType.PRESS_BACK


def _dismiss_control(overlay: Sequence[Any]) -> Any | None:
    """The overlay's clickable control that most looks like a dismissal."""
    click = [n for n in overlay if n.clickable and n.id]
    for word in _DISMISS_WORDS:
        pat = re.compile(r"(?<![a-z])" + re.escape(word) + r"(?![a-z])")
        for n in click:
            if pat.search(f"{n.id} {n.text}".lower()):
                return n
    return None


def _keywords(nodes: Sequence[Any], extra: Sequence[str] = ()) -> list[str]:
    out = []
    for t in [*(n.text for n in nodes), *extra]:
        t = (t or "").strip().lower()
        if len(t) > 1 and t not in out:
            out.append(t)
    return out[:8]


@dataclass
class TriageResult:
    """What a triage made of the traces: ``units`` (checked and grounded), ``refused``
    (messages: a unit that did not validate, an ungrounded trigger, a reply that is not
    JSON), ``kept`` (trace id -> its learnable patterns), ``discarded`` (trace id -> why)."""

    units: list[ExperienceUnit] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    kept: dict[str, list[str]] = field(default_factory=dict)
    discarded: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"units": [u.id for u in self.units], "refused": list(self.refused),
                "kept": dict(self.kept), "discarded": dict(self.discarded)}


class Triage(Protocol):
    """Turns traces into experience units (:class:`ScriptedTriage`, :class:`LLMTriage`)."""

    name: str

    def triage(self, traces: Sequence[Trace], cycle: int,
               bank: ExperienceBank | None = None) -> TriageResult: ...


def _run_triage(triage: Any, traces: Sequence[Trace], cycle: int,
                bank: ExperienceBank | None) -> TriageResult:
    """A :class:`Triage`, or any ``(traces, cycle) -> list of units`` callable."""
    if hasattr(triage, "triage"):
        return triage.triage(traces, cycle, bank)
    res = triage(traces, cycle)
    return res if isinstance(res, TriageResult) else TriageResult(units=list(res))


def check_grounded(eu: ExperienceUnit, traces: Sequence[Trace]) -> None:
    """Refuse a unit whose trigger (or tap target) names an element or text that none of
    the traces' screens ever held: its rule could never act.

    Raises:
        ClawError: what it names and that no screen held it.
    """
    screens = [trace.nodes_at(i) for trace in traces for i in range(len(trace.steps))]
    screens = [s for s in screens if s]
    wants: list[tuple[str, dict[str, Any]]] = []
    for k, v in eu.trigger.items():
        if k == "element":
            wants.append(("trigger element", v))
        elif k == "text":
            wants.append(("trigger text", {"text": v}))
    if isinstance(eu.strategy, dict) and "tap" in eu.strategy:
        wants.append(("tap target", eu.strategy["tap"]))
    for what, spec in wants:
        spec = {k: v for k, v in spec.items() if k in ("id", "text") and v != "$goal_text"}
        if not spec:
            continue
        if not screens:
            raise ClawError(f"experience unit {eu.id!r}: its {what} {spec} cannot be checked: "
                            "none of the traces holds a UI tree (an element must have been "
                            "seen on a screen)")
        if not any(_match(n, spec) for s in screens for n in s):
            raise ClawError(f"experience unit {eu.id!r}: its {what} {spec} names nothing that "
                            f"was on any of the {len(screens)} screens of traces "
                            f"{[t.id for t in traces][:6]}: its rule could never act")


def _match(node: Any, spec: dict[str, Any]) -> bool:
    if "id" in spec:
        pat = spec["id"]
        if not (fnmatch.fnmatchcase(node.id, pat) if "*" in pat else node.id == pat):
            return False
    return "text" not in spec or spec["text"].lower() in (node.text or "").lower()


class ScriptedTriage:
    """Triage by rule (CPU): each learnable pattern of a trace becomes a unit mechanically.

    - **recovery**: an overlay on screen that the agent then dismissed, by a tap on one of
      its controls (trigger: that element; strategy: tap it) or by back (trigger: the
      overlay's container; strategy: back). Exploit: the traces show it working.
    - **overlay failure**: a failed trace with an overlay it never dismissed: tap the
      overlay's control that reads as a dismissal (close, no thanks, cancel, ...; back where
      none does). Explore.
    - **stuck**: the same action twice in a row on an unchanged screen: trigger
      ``last_action: repeated_no_change``, strategy back. Explore.
    - **unparseable**: an action that did not parse. Such a trace is kept (reported), but
      by default no unit is written: no rule strategy repairs an output (that is xi's
      repair and retry, a DarwinX edit), "agent" does nothing and "back" would undo the
      agent's progress after every slip. ``unparseable="back"`` (or another ``do``) writes
      an explore unit with that strategy anyway, for causal validation to judge.

    Clean successes (a success with none of these) and failures without a pattern are
    discarded. Units with the same trigger and strategy are one unit (traces merged).

    Args:
        skill: the skill units go to, or ``trace -> skill name``.
        unparseable: the strategy of the unparseable pattern's unit (None: no unit).
        width, height: the screen size taps are in (to find the node a tap landed on).
    """

    name = "scripted"

    def __init__(self, skill: str | Callable[[Trace], str] = "phone",
                 unparseable: Any = None, width: int = 1080, height: int = 2280) -> None:
        self.skill = skill
        self.unparseable = unparseable
        self.width, self.height = width, height
        if unparseable is not None:  # checked once, here
            ExperienceUnit("check", {"last_action": "unparseable"}, unparseable)

    def _skill(self, trace: Trace) -> str:
        return self.skill(trace) if callable(self.skill) else self.skill

    def patterns(self, trace: Trace, cycle: int) -> list[tuple[str, ExperienceUnit | None]]:
        """The trace's learnable patterns, each with its unit (None: kept, no unit)."""
        out: list[tuple[str, ExperienceUnit | None]] = []
        skill = self._skill(trace)

        def unit(uid: str, trigger: dict, strategy: Any, subtype: str, pattern: str,
                 keywords: list[str]) -> ExperienceUnit:
            return ExperienceUnit(
                uid, trigger, strategy, subtype, skill, keywords,
                {"cycle": cycle, "traces": [trace.id], "triage": "scripted",
                 "pattern": pattern}, born=cycle)

        steps = trace.steps
        dismissed: set[str] = set()
        unresolved: dict[str, list[Any]] = {}
        for i, st in enumerate(steps):
            ov = _overlay(trace.nodes_at(i))
            if not ov:
                continue
            box = ov[0].id or ov[0].cls
            nxt = _overlay(trace.nodes_at(i + 1)) if i + 1 < len(steps) else None
            gone = nxt is not None and (not nxt or (nxt[0].id or nxt[0].cls) != box)
            if gone and st.valid and st.screen_changed:
                tapped = _tapped(st, trace.nodes_at(i), self.width, self.height)
                ctl = next((n for n in ov if n.id == tapped and n.clickable), None)
                kw = _keywords(ov, ["pop-up"])
                if ctl is not None:
                    out.append(("recovery", unit(
                        f"tap-{_slug(ctl.id)}", {"element": {"id": ctl.id}},
                        {"tap": {"id": ctl.id}}, "exploit", "recovery", kw)))
                    dismissed.add(box)
                elif _is_back(st.action) and ov[0].id:
                    out.append(("recovery", unit(
                        f"back-on-{_slug(ov[0].id)}", {"element": {"id": ov[0].id}}, "back",
                        "exploit", "recovery", kw)))
                    dismissed.add(box)
            else:
                unresolved.setdefault(box, ov)
        if not trace.success:
            for box, ov in unresolved.items():
                if box in dismissed:
                    continue
                ctl = _dismiss_control(ov)
                kw = _keywords(ov, ["pop-up"])
                if ctl is not None:
                    out.append(("overlay", unit(
                        f"tap-{_slug(ctl.id)}", {"element": {"id": ctl.id}},
                        {"tap": {"id": ctl.id}}, "explore", "overlay", kw)))
                elif ov[0].id:
                    out.append(("overlay", unit(
                        f"back-on-{_slug(ov[0].id)}", {"element": {"id": ov[0].id}}, "back",
                        "explore", "overlay", kw)))
        for a, b in zip(steps, steps[1:]):
            if (a.valid and b.valid and a.action == b.action and not a.screen_changed
                    and not b.screen_changed and not b.decided_by.startswith("rule:")):
                out.append(("stuck", unit("unstick-back", {"last_action": "repeated_no_change"},
                                          "back", "explore", "stuck",
                                          ["stuck", "repeated action", "no change"])))
                break
        if any(not s.valid for s in steps):
            out.append(("unparseable", None if self.unparseable is None else unit(
                f"unparseable-{_slug(str(self.unparseable))}", {"last_action": "unparseable"},
                self.unparseable, "explore", "unparseable", ["unparseable", "invalid action"])))
        return out

    def triage(self, traces: Sequence[Trace], cycle: int,
               bank: ExperienceBank | None = None) -> TriageResult:
        res = TriageResult()
        found: dict[str, ExperienceUnit] = {}
        for trace in traces:
            pats = self.patterns(trace, cycle)
            if not pats:
                res.discarded[trace.id] = ("clean success" if trace.success
                                           else "no learnable pattern")
                continue
            res.kept[trace.id] = sorted({p for p, _ in pats})
            for _, eu in pats:
                if eu is None:
                    continue
                have = found.get(eu.key())
                if have is None:
                    found[eu.key()] = eu
                else:
                    _merge_into(have, eu)
        for eu in found.values():
            try:
                check_grounded(eu, traces)
            except ClawError as e:  # pragma: no cover - scripted units come from the trees
                res.refused.append(str(e))
                continue
            res.units.append(eu)
        return res

    __call__ = triage


def scripted_triage(traces: Sequence[Trace], cycle: int, bank: ExperienceBank | None = None,
                    **options: Any) -> list[ExperienceUnit]:
    """The units :class:`ScriptedTriage` (``options``) writes from ``traces``."""
    return ScriptedTriage(**options).triage(traces, cycle, bank).units


LLM_INSTRUCTIONS = """\
You triage an Android phone agent's recent episodes into EXPERIENCE UNITS: small rules that
act before the agent on the steps where a learnable pattern shows. Keep only learnable
patterns: an error the agent recovered from (a pop-up or dialog it dismissed), the same
action repeated on an unchanged screen, unparseable actions, pop-ups or dialogs it failed
on, a detour that wasted steps. Discard routine clean successes. Name only elements you saw
in the screens below (by their [id] or text): a unit naming anything else is refused.

A unit's "trigger" holds conditions that must all be true:
  "element": {"id": ..., "text": ..., "clickable": true|false}  (a node on screen matches)
  "absent": {...same...}  (no node matches)   "text": "..." (some node's text contains it)
  "overlay": true|false   "goal": "..." (the task contains it)   "step": n or [min, max]
  "last_action": "unparseable" | "no_change" | "repeated_no_change"
Its "strategy" is one of "back", "home", "enter", "type_goal_text", or
{"tap": {"id": ...}} / {"tap": {"text": ...}}.
"subtype" is "exploit" (a handling the episodes show working) or "explore" (a handling to
try on a failure).

Answer with JSON only, no prose:
{"units": [{"id": "short-slug", "trigger": {...}, "strategy": ..., "keywords": ["..."],
            "subtype": "exploit" | "explore", "traces": ["trace ids it comes from"],
            "why": "one sentence"}]}
An empty list is a fine answer when nothing is learnable.
"""


class LLMTriage:
    """Triage by a language model behind the judge's backends (the real path): the traces
    as text (task, outcome, each step's action, who decided it, whether it parsed and
    changed the screen, and the screen's tree) and the unit format go out in one request;
    the JSON reply lists units, each checked (:meth:`ExperienceUnit.check`) and grounded
    (:func:`check_grounded`) before it is kept.

    A reply that is not JSON, or a backend that fails, raises :class:`ClawError` quoting
    the reply (:meth:`ExperienceBank.cycle` records it and goes on); a unit of the reply that
    does not validate is refused (``TriageResult.refused``, quoting it) and the others kept.

    Args:
        backend: a :class:`~digirl_lite.judge.backends.Backend` (``generate(parts)``).
        skill: the skill its units go to when the reply names none.
        max_traces, max_steps, max_nodes: how much of the traces goes into the prompt.
    """

    name = "llm"

    def __init__(self, backend: Any, skill: str = "phone", max_traces: int = 12,
                 max_steps: int = 20, max_nodes: int = 30,
                 instructions: str = LLM_INSTRUCTIONS) -> None:
        self.backend = backend
        self.skill = skill
        self.max_traces, self.max_steps, self.max_nodes = max_traces, max_steps, max_nodes
        self.instructions = instructions
        self.last_reply: str | None = None

    def prompt(self, traces: Sequence[Trace], bank: ExperienceBank | None = None) -> str:
        parts = [self.instructions]
        if bank is not None and (bank.active() or bank.nursery()):
            parts.append("Units the agent already has (do not repeat them):\n" + "\n".join(
                u.to_rule().line() for u in bank.active() + bank.nursery()))
        for t in list(traces)[:self.max_traces]:
            lines = [f"Trace {t.id}: task {t.task!r}, "
                     f"{'success' if t.success else 'failure'}, {len(t.steps)} steps"]
            for i, s in enumerate(t.steps[:self.max_steps]):
                flags = ("" if s.valid else " UNPARSEABLE") + (
                    "" if s.screen_changed else " (screen unchanged)")
                lines.append(f"  step {s.step}: {s.action[:200]} [by {s.decided_by}]{flags}")
                tree = s.tree or _tree_of(t.nodes_at(i), self.max_nodes)
                if tree:
                    lines += ["    " + x for x in tree.splitlines()[:self.max_nodes]]
            parts.append("\n".join(lines))
        return "\n\n".join(parts)

    def triage(self, traces: Sequence[Trace], cycle: int,
               bank: ExperienceBank | None = None) -> TriageResult:
        from digirl_lite.judge.backends import BackendError

        try:
            reply = self.backend.generate([self.prompt(traces, bank)]).text
        except BackendError as e:
            raise ClawError(f"LLM triage: the backend failed: {e}") from None
        self.last_reply = reply
        return self.parse(reply, traces, cycle)

    __call__ = triage

    def parse(self, reply: str, traces: Sequence[Trace], cycle: int) -> TriageResult:
        """The units of a reply.

        Raises:
            ClawError: the reply is not JSON, or not ``{"units": [...]}`` / a list (quoted).
        """
        obj = _loads_reply(reply)
        items = obj.get("units") if isinstance(obj, dict) else obj
        if not isinstance(items, list):
            raise ClawError("LLM triage reply is not {\"units\": [...]}: "
                            f"{str(reply)[:400]!r}")
        res = TriageResult()
        ids = {t.id for t in traces}
        for k, item in enumerate(items):
            where = f"LLM triage reply, unit {k + 1}"
            try:
                if not isinstance(item, dict):
                    raise ClawError(f"{where}: a unit is a JSON object")
                extra = [x for x in item if x not in (
                    "id", "trigger", "strategy", "keywords", "subtype", "skill", "traces",
                    "why")]
                if extra:
                    raise ClawError(f"{where}: unknown key(s) {extra}")
                used = [t for t in (item.get("traces") or []) if t in ids]
                prov = {"cycle": cycle, "traces": used, "triage": "llm"}
                if item.get("why"):
                    prov["why"] = str(item["why"])[:300]
                rec = {"id": item.get("id") or "unit", "trigger": item.get("trigger", {}),
                       "strategy": item.get("strategy"),
                       "keywords": item.get("keywords") or [],
                       "subtype": item.get("subtype", "explore"),
                       "skill": item.get("skill") or self.skill, "provenance": prov,
                       "born": cycle}
                if "strategy" not in item:
                    raise ClawError(f"{where}: no \"strategy\"")
                eu = ExperienceUnit.from_dict(rec, where)
                check_grounded(eu, traces)
            except ClawError as e:
                res.refused.append(f"{e} -- refused: {json.dumps(item)[:300]}")
                continue
            res.units.append(eu)
            for t in eu.provenance["traces"]:
                res.kept.setdefault(t, []).append(eu.id)
        for t in traces:
            if t.id not in res.kept:
                res.discarded[t.id] = "no unit from the LLM"
        return res


def _tree_of(nodes: Sequence[Any], max_nodes: int) -> str:
    from digirl_lite.envs.uitree import tree_text

    return tree_text(nodes, max_nodes) if nodes else ""


def _loads_reply(reply: str) -> Any:
    text = str(reply or "").strip()
    m = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL | re.IGNORECASE)
    if m:
        text = m.group(1).strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if starts:
        s = min(starts)
        e = max(text.rfind("}"), text.rfind("]"))
        try:
            return json.loads(text[s:e + 1])
        except json.JSONDecodeError:
            pass
    raise ClawError(f"LLM triage reply is not valid JSON: {str(reply)[:400]!r}")
