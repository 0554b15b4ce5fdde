"""Experience units (spec/DARWIN.md section C): the unit record, its checks and its
description in words; the error type, the constants and the score S every part shares."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from digirl_lite.harness.rules import Rule, RuleError, parse_rule

SUBTYPES = ("exploit", "explore")
"""exploit: a handling the traces showed working (an overlay the agent did dismiss);
explore: a handling tried on a failure (the pop-up it never dismissed, a stuck screen)."""
STATES = ("nursery", "active", "evicted")
TRIAGES = ("scripted", "llm", "user")
DEFAULT_WEIGHTS = (0.6, 0.3, 0.1)
EU_PREFIX = "eu:"
"""An experience unit's rule id is ``eu:<unit id>`` (and its steps ``rule:eu:<unit id>``)."""
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,79}$")
_SKILL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ClawError(ValueError):
    """Bad input refused (an experience unit, a SKILL.md block, a bank file, an LLM's reply);
    the message names where (file and line, or the reply quoted) and why."""


def score(e: float, c: float, eta: float, weights: Sequence[float] = DEFAULT_WEIGHTS) -> float:
    """S = w1 e + w2 c + w3 eta: effect (change in completion rate on the episodes the unit
    acted in; primary), coverage (share of episodes it acted in; a prerequisite) and
    efficiency (fall in invalid actions per step; a bonus)."""
    w = tuple(float(x) for x in weights)
    if len(w) != 3:
        raise ValueError(f"weights are (w_effect, w_coverage, w_efficiency), got {weights!r}")
    return w[0] * float(e) + w[1] * float(c) + w[2] * float(eta)


# ---------------------------------------------------------------------------------------
# experience units
# ---------------------------------------------------------------------------------------
def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")
    return s[:60] or "unit"


@dataclass
class ExperienceUnit:
    """One experience unit.

    ``trigger`` is a rule's ``when`` and ``strategy`` its ``do`` (:mod:`.rules`); ``skill``
    names the SKILL.md it belongs to (slots are per skill and subtype). ``provenance``:
    ``{"cycle", "traces": [trace ids], "triage": "scripted" | "llm" | "user", ...}``.
    ``e``, ``c``, ``eta``, ``S``: the last relevant validation (None before one);
    ``negative``: relevant validations in a row with e < 0; ``note``: the last thing that
    happened to it (why it was evicted, for one).
    """

    id: str
    trigger: dict[str, Any]
    strategy: Any
    subtype: str = "explore"
    skill: str = "phone"
    keywords: list[str] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    state: str = "nursery"
    pinned: bool = False
    born: int = 0
    e: float | None = None
    c: float | None = None
    eta: float | None = None
    S: float | None = None
    validated: int = 0
    negative: int = 0
    note: str = ""

    def __post_init__(self) -> None:
        self.check()

    @property
    def rule_id(self) -> str:
        return EU_PREFIX + self.id

    def check(self, where: str = "") -> None:
        """Raises :class:`ClawError` (naming ``where``) for a unit that is not well formed."""
        w = f"{where}: " if where else ""
        if not isinstance(self.id, str) or not _ID_RE.match(self.id):
            raise ClawError(f"{w}an experience unit id is 1-80 characters of letters, digits "
                            f"and _ . : - (starting with a letter or digit), got {self.id!r}")
        w = f"{w}experience unit {self.id!r}: "
        if self.subtype not in SUBTYPES:
            raise ClawError(f"{w}subtype {self.subtype!r} is not one of {SUBTYPES}")
        if self.state not in STATES:
            raise ClawError(f"{w}state {self.state!r} is not one of {STATES}")
        if not isinstance(self.skill, str) or not _SKILL_RE.match(self.skill):
            raise ClawError(f"{w}skill {self.skill!r} must be a name of letters, digits and "
                            "_ . - (it names a SKILL.md's folder)")
        if not isinstance(self.keywords, list) or not all(
                isinstance(k, str) for k in self.keywords):
            raise ClawError(f"{w}keywords must be a list of strings, got {self.keywords!r}")
        if not isinstance(self.provenance, dict):
            raise ClawError(f"{w}provenance must be an object, got {self.provenance!r}")
        if not isinstance(self.pinned, bool):
            raise ClawError(f"{w}pinned must be true or false, got {self.pinned!r}")
        for name in ("born", "validated", "negative"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ClawError(f"{w}{name} must be an int >= 0, got {v!r}")
        for name in ("e", "c", "eta", "S"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ClawError(f"{w}{name} must be a number or null, got {v!r}")
        self.to_rule(where)

    def to_rule(self, where: str = "") -> Rule:
        """The unit as a harness rule (id ``eu:<id>``), checked by
        :func:`~digirl_lite.harness.rules.parse_rule`."""
        try:
            return parse_rule({"id": self.rule_id, "when": self.trigger, "do": self.strategy},
                              source=where or f"experience unit {self.id!r}")
        except RuleError as e:
            raise ClawError(str(e)) from None

    def key(self) -> str:
        """Equal keys: the same unit (same trigger and strategy)."""
        return json.dumps([self.trigger, self.strategy], sort_keys=True)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "skill": self.skill, "subtype": self.subtype,
                "state": self.state, "pinned": self.pinned, "trigger": self.trigger,
                "strategy": self.strategy, "keywords": list(self.keywords),
                "born": self.born, "provenance": self.provenance, "e": self.e, "c": self.c,
                "eta": self.eta, "S": self.S, "validated": self.validated,
                "negative": self.negative, "note": self.note}

    @classmethod
    def from_dict(cls, d: Any, where: str = "experience unit") -> ExperienceUnit:
        """A unit from its record; raises :class:`ClawError` naming ``where``."""
        if not isinstance(d, dict):
            raise ClawError(f"{where}: an experience unit is a JSON object, got "
                            f"{type(d).__name__}: {str(d)[:200]!r}")
        known = {f.name for f in fields(cls)}
        unknown = [k for k in d if k not in known]
        if unknown:
            raise ClawError(f"{where}: unknown key(s) {unknown}; an experience unit has "
                            f"{sorted(known)}")
        missing = [k for k in ("id", "trigger", "strategy") if k not in d]
        if missing:
            raise ClawError(f"{where}: missing {missing}")
        try:
            return cls(**copy.deepcopy(d))
        except ClawError as e:
            raise ClawError(f"{where}: {e}") from None
        except TypeError as e:  # pragma: no cover - every field has a default but the three
            raise ClawError(f"{where}: {e}") from None

    def describe(self) -> str:
        """One line of prose: what it does, its keywords and where it came from."""
        p = self.provenance
        traces = p.get("traces") or []
        shown = ", ".join(str(t) for t in traces[:4]) + (
            f" and {len(traces) - 4} more" if len(traces) > 4 else "")
        origin = (f"Learned at cycle {p.get('cycle', self.born)}"
                  + (f" from trace{'s' if len(traces) > 1 else ''} {shown}" if traces else "")
                  + (f" ({p['triage']} triage" + (f", pattern {p['pattern']}"
                                                      if p.get("pattern") else "") + ")"
                     if p.get("triage") else "") + ".")
        stats = ("Not validated yet." if self.S is None else
                 f"Last validation: e = {self.e:+.3f}, c = {self.c:.3f}, eta = "
                 f"{self.eta:+.3f}, S = {self.S:.3f}.")
        kw = (" Keywords: " + ", ".join(f'"{k}"' for k in self.keywords) + "."
              if self.keywords else "")
        note = f" {self.note[0].upper()}{self.note[1:]}." if self.note else ""
        return (f"When {describe_trigger(self.trigger)}: {describe_strategy(self.strategy)}."
                f"{kw} {origin} {stats}{note}")


def describe_trigger(when: dict[str, Any]) -> str:
    """A rule's ``when`` in words."""
    def match(spec: dict[str, Any]) -> str:
        parts = ([f"`{spec['id']}`"] if "id" in spec else []) + (
            [f"text \"{spec['text']}\""] if "text" in spec else []) + [
            f"{k} {str(spec[k]).lower()}" for k in ("clickable", "focused") if k in spec]
        return "an element " + " ".join(parts)

    out = []
    for k, v in when.items():
        if k == "element":
            out.append(f"{match(v)} is on screen")
        elif k == "absent":
            out.append(f"no {match(v)[3:]} is on screen")
        elif k == "text":
            out.append(f"the screen shows \"{v}\"")
        elif k == "overlay":
            out.append("a dialog is over the screen" if v else "no dialog is over the screen")
        elif k == "last_action":
            out.append({"unparseable": "the last output did not parse",
                        "no_change": "the last action left the screen unchanged",
                        "repeated_no_change": "the same action was repeated on an unchanged "
                                              "screen"}.get(v, f"last action {v}"))
        elif k == "step":
            out.append(f"at step {v}" if isinstance(v, int) else f"at steps {v[0]}..{v[1]}")
        elif k == "goal":
            out.append(f"the goal mentions \"{v}\"")
        else:  # pragma: no cover - parse_rule refuses other conditions
            out.append(f"{k} = {v}")
    return " and ".join(out) if out else "always"


def describe_strategy(do: Any) -> str:
    """A rule's ``do`` in words."""
    if isinstance(do, dict) and "tap" in do:
        spec = do["tap"]
        return "tap " + (f"`{spec['id']}`" if "id" in spec else f"\"{spec.get('text')}\"")
    return {"back": "press back", "home": "press home", "enter": "press enter",
            "type_goal_text": "type the goal's quoted text",
            "agent": "hand the step to the agent"}.get(do, str(do))


def _merge_into(have: ExperienceUnit, new: ExperienceUnit, keep: int = 20) -> None:
    """A re-found unit: its traces and keywords join the one already in the bank."""
    traces = list(have.provenance.get("traces") or [])
    for t in new.provenance.get("traces") or []:
        if t not in traces:
            traces.append(t)
    have.provenance["traces"] = traces[-keep:]
    have.keywords += [k for k in new.keywords if k not in have.keywords]
    if new.subtype == "exploit" and have.subtype == "explore" and have.state == "nursery":
        have.subtype = "exploit"
