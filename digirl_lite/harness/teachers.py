"""DarwinX's teachers: reference trajectories for tasks the agent never solved (issue 48, item 1).

spec/DARWIN.md B's teacher-derived evidence is a stronger agent's rollouts. A stronger agent
sees what any deployed agent sees (the screen, its UI tree, its own actions, the judge's
verdict), never the phone's internal state, and it can fail. :data:`TEACHERS` names the
choices (``EvolveConfig.teacher``):

- ``"screen"`` (the default): :class:`ScreenTeacher`, generic GUI behaviour read from the
  UI tree alone;
- ``"privileged_expert"``: the simulator's :class:`~digirl_lite.envs.sim.agents.ScriptedExpert`,
  which reads ``obs.state`` and never fails; every report of a run that uses it says
  "privileged";
- ``"none"``: no teacher (failure- and self-derived evidence only).

:class:`ScreenTeacher` knows no simulator element id, site or app; per step, in order:

1. a screen with nothing to tap (a page loading): wait (a tap at the top of the screen);
2. a dialog drawn over the screen (a pop-up, a cookie banner, voice input): tap its button
   that reads like close / no thanks / cancel / accept
   (:func:`~digirl_lite.harness.proposers.dismiss_button`), else BACK;
3. a focused text field: ENTER when it holds the text to type, else type it (the goal's web
   address until a page of that address is shown, then the goal's span,
   :func:`~digirl_lite.harness.rules.goal_span`), BACK when a text it typed did not take;
4. a goal naming a web address not shown yet: tap an element naming it (a search result),
   else the address bar (the topmost text field holding a web address), else a search box;
5. a goal with a span: once a search box shows it, the first result when the goal asks for
   the first entry (the topmost row below the box, not sponsored), else stop; before that,
   tap a search box (one whose text says "search", else the address bar);
6. otherwise tap the element whose text best matches the goal's words (an app named in the
   goal), else BACK from a page that matches nothing (HOME after three BACKs), and stop
   when nothing is left (nothing to do on the screen HOME led to).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from digirl_lite.actions import Action, ActionType, format_action
from digirl_lite.envs.base import Observation
from digirl_lite.envs.uitree import UINode
from digirl_lite.harness.proposers import dismiss_button
from digirl_lite.harness.rules import goal_span, tap_action

__all__ = ["ScreenTeacher", "TEACHERS", "make_teacher", "teacher_label", "reads_state"]

TEACHERS = ("screen", "privileged_expert", "none")
"""The teacher choices of the DarwinX loop (see the module docstring)."""

_WORD = re.compile(r"[a-z0-9]+")
_ADDRESS = re.compile(r"(?:^|(?<=[\s,;:(]))(?:https?://)?(?:www\.)?"
                      r"(?P<host>[a-z0-9][a-z0-9-]*(?:\.[a-z0-9-]+)*\.[a-z]{2,})(?=$|[\s,;:.!?/)])",
                      re.I)
_FIRST = re.compile(r"\b(?:first|top|1st)\s+(?:entry|item|result|product|listing|one|link|hit|"
                    r"option|match)\b", re.I)
_SPONSORED = re.compile(r"\b(?:sponsored|advert\w*|ad)\b", re.I)
_SEARCHY = re.compile(r"\bsearch\b", re.I)
_ADDRESS_HINT = re.compile(r"\b(?:web\s+address|url)\b", re.I)
_STOP_WORDS = frozenset(
    "a an the and or to of in on at for me my app apps please open launch start go show "
    "run use new".split())


def _words(text: str) -> list[str]:
    return _WORD.findall((text or "").lower())


def _host(text: str) -> str | None:
    """The web address a text starts with (``https://www.ebay.com/x`` -> ``ebay.com``)."""
    m = _ADDRESS.match((text or "").strip())
    return m.group("host").lower() if m else None


def _is_field(n: UINode) -> bool:
    return n.cls.rsplit(".", 1)[-1] in ("EditText", "AutoCompleteTextView", "SearchView")


def _match_score(goal_words: Sequence[str], text: str) -> int:
    """How well ``text`` names something of the goal: its words the goal holds (a goal word
    inside one of them counts: "mail" names "Gmail"), and two goal words written as one
    ("you tube", "YouTube")."""
    want = [w for w in goal_words if w not in _STOP_WORDS]
    have = set(_words(text))
    score = sum(1 for w in set(want) if w in have or (len(w) >= 4 and any(
        w in h for h in have)))
    pairs = {a + b for a, b in zip(want, want[1:])}
    return score + sum(1 for h in have if h in pairs)


@dataclass
class _Episode:
    task: str = ""
    last: ActionType | None = None
    backs: int = 0


class ScreenTeacher:
    """A teacher that acts from the UI tree (and its text) alone (see the module docstring);
    it never reads ``obs.state``, and it fails where generic behaviour does (an app the goal
    names by another word, a phrasing its span reader misreads). ``act`` is the scripted
    agents' interface; :func:`make_teacher` puts it behind the fleets' batch interface.

    Args:
        width, height: the screen size gestures are in, where the observation has no
            screenshot to read it from.
    """

    def __init__(self, width: int = 1080, height: int = 2280) -> None:
        self.width, self.height = width, height
        self._ep = _Episode()

    def act(self, obs: Observation) -> str:
        if obs.step == 0 or obs.task != self._ep.task:
            self._ep = _Episode(task=obs.task)
        action = self._decide(obs)
        t = action.action_type
        self._ep.backs = self._ep.backs + 1 if t is ActionType.PRESS_BACK else 0
        self._ep.last = t
        return format_action(action)

    # -- one step -------------------------------------------------------------------------
    def _tap(self, n: UINode, obs: Observation) -> Action:
        w, h = getattr(obs.screenshot, "size", None) or (self.width, self.height)
        return tap_action(n, w, h)

    def _decide(self, obs: Observation) -> Action:
        nodes = list(obs.ui_tree or ())
        goal = obs.task
        if not any(n.clickable for n in nodes):  # a page still loading: wait
            return (self._tap(nodes[0], obs) if nodes
                    else Action.tap(x=0.5, y=0.01))
        container, button = dismiss_button(nodes)
        if container is not None:
            return self._tap(button, obs) if button is not None \
                else Action.key(ActionType.PRESS_BACK)
        fields = [n for n in nodes if _is_field(n)]
        bar = next((n for n in sorted(fields, key=lambda n: n.bounds[1])
                    if _host(n.text) or _ADDRESS_HINT.search(n.text)), None)
        address = next((m.group("host").lower() for m in _ADDRESS.finditer(goal)), None)
        # a page of the address is shown: the address bar (not being edited) holds it
        shown = bool(address) and bar is not None and not bar.focused \
            and (_host(bar.text) or "").endswith(address)
        span = goal_span(goal)
        want = address if address and not shown else span
        focused = next((n for n in fields if n.focused), None)
        if focused is not None:
            if want and focused.text.strip().lower() == want.lower():
                return Action.key(ActionType.PRESS_ENTER)
            if want and self._ep.last is not ActionType.TYPE:
                return Action.type_text(want)
            return Action.key(ActionType.PRESS_BACK)  # nothing to type here, or it did not take
        boxes = [n for n in fields if n is not bar]
        search = next((n for n in boxes if _SEARCHY.search(n.text)), None) \
            or (boxes[0] if boxes else None)
        if address and not shown:
            name = address.split(".")[0]
            named = [n for n in nodes if n.clickable and not _is_field(n)
                     and (address in n.text.lower() or name in _words(n.text))]
            way = named[0] if named else (bar or search)
            if way is not None:
                return self._tap(way, obs)
        elif span:
            done = next((n for n in boxes if n.text.strip().lower() == span.lower()), None)
            if done is not None:
                if not _FIRST.search(goal):
                    return Action.key(ActionType.STATUS_TASK_COMPLETE)
                rows = sorted((n for n in nodes if n.clickable and not _is_field(n)
                               and n.text and n.bounds[1] >= done.bounds[3]
                               and not _SPONSORED.search(n.text)),
                              key=lambda n: (n.bounds[1], n.bounds[0]))
                if rows:
                    return self._tap(rows[0], obs)
            elif search is not None or bar is not None:
                return self._tap(search or bar, obs)
        else:
            gw = _words(goal)
            scored = [(s, -i, n) for i, n in enumerate(nodes)
                      if n.clickable and not _is_field(n)
                      and (s := _match_score(gw, n.text)) > 0]
            if scored:
                return self._tap(max(scored, key=lambda t: t[:2])[2], obs)
        if self._ep.last is ActionType.PRESS_HOME:  # nothing left to try
            return Action.key(ActionType.STATUS_TASK_COMPLETE)
        return Action.key(ActionType.PRESS_HOME if self._ep.backs >= 3
                          else ActionType.PRESS_BACK)


def make_teacher(name: str) -> Any:
    """The teacher ``name`` of :data:`TEACHERS` behind the fleets' batch interface (a
    :class:`~digirl_lite.rollout.fleet.ScriptedBatchAgent`, one agent per phone), or None
    for ``"none"``.

    Raises:
        ValueError: ``name`` is not one of :data:`TEACHERS`.
    """
    from digirl_lite.rollout.fleet import ScriptedBatchAgent

    if name == "none":
        return None
    if name == "screen":
        agent = ScriptedBatchAgent(lambda slot: ScreenTeacher())
    elif name == "privileged_expert":
        from digirl_lite.envs.sim.agents import ScriptedExpert

        agent = ScriptedBatchAgent(lambda slot: ScriptedExpert())
    else:
        raise ValueError(f"teacher {name!r} is not one of {TEACHERS}")
    agent.teacher_name = name  # keys the runner's cache: one teacher's episodes, not another's
    return agent


def reads_state(name: str) -> bool:
    """Whether the teacher ``name`` reads the simulator's state (``obs.state``): only then
    do the loop's phones put it on their observations (``SimPhoneEnv.privileged_state``);
    on every other path they give None, as a real device (issue 48)."""
    return name == "privileged_expert"


def teacher_label(name: str) -> str:
    """How reports name the teacher: the privileged one says so."""
    return {"screen": "screen-only teacher",
            "privileged_expert": "PRIVILEGED teacher (the simulator's expert reads its state)",
            "none": "no teacher"}[name]
