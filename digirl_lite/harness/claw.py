"""Darwin-Claw: experience units learned from an agent's own traces, kept only when they are
shown to cause better outcomes (spec/DARWIN.md section C; issue 30, item 4).

A cycle (:meth:`ExperienceBank.cycle`) goes:

1. **Triage** of the traces since the last cycle (:class:`Trace`): only traces with a
   learnable pattern are kept (a pop-up or overlay that was dismissed, the same action
   repeated on an unchanged screen, an unparseable action, a pop-up the agent failed on);
   clean routine successes are discarded. Each pattern becomes an **experience unit**
   (:class:`ExperienceUnit`): a trigger (a rule's ``when``, :mod:`.rules`), keywords, a
   handling strategy (a rule's ``do``), subtype exploit or explore, and provenance.
   :class:`ScriptedTriage` writes units mechanically (CPU, tests); :class:`LLMTriage` asks a
   model behind the judge's backends (the real path). A unit whose trigger names nothing the
   traces' screens ever showed is refused there, with a message that says so.
2. **Nursery**: new units enter probation (limited capacity, a time-to-live in cycles).
3. **Causal validation** (:func:`validate`): the same tasks at the same seeds are run with
   and without the unit. Relevance first: coverage c is the share of episodes in which the
   unit's rule acted; a unit that never acts gets no verdict. Then effect e (completion rate
   with minus without, on the episodes it acted in) and efficiency eta (the fall in invalid
   actions per step there). Score S = w1 e + w2 c + w3 eta (:func:`score`, effect first).
4. **Lifecycle**: a nursery unit with e > 0 is promoted into an active slot of its skill
   (3 exploit + 3 explore by default), taken by competition on S; an active unit with a
   persistently negative effect, and a nursery unit whose TTL ran out, are evicted and kept
   in the archive; a user may pin (active, never evicted by the machine) or evict any unit.

The bank persists as JSON (:meth:`ExperienceBank.save`, atomic); validated units are
written as inline blocks of a human-readable ``SKILL.md`` per skill (:func:`write_skill_md`,
read back by :func:`read_skill_md`), and :func:`skill_rules` gives the active ones as the
rule lines of a harness's ``skills`` component, which
:class:`~digirl_lite.harness.harness.HarnessAgent` loads. Every step an experience unit
decides is marked ``decided_by = "rule:eu:<id>"``, which is also how a run reports that a
unit acted (:class:`Outcome`).

Bad input is refused with a :class:`ClawError` that names where (the file and line of a
``SKILL.md`` block, the LLM's reply) and the rest goes on. This module imports no torch
and no client library.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from digirl_lite.envs.uitree import parse_tree_text
from digirl_lite.harness.evidence import EvidenceStep
from digirl_lite.harness.rules import Rule, RuleError, has_overlay, parse_rule, rules_text

__all__ = ["ClawError", "ExperienceUnit", "ClawConfig", "ExperienceBank", "Trace", "Outcome",
           "Validation", "TriageResult", "Triage", "ScriptedTriage", "LLMTriage",
           "scripted_triage", "check_grounded", "score", "validate", "write_skill_md",
           "read_skill_md", "skill_rules", "skill_edit", "traces_from_episodes",
           "outcomes_from_episodes", "FleetRunner", "SUBTYPES", "STATES", "DEFAULT_WEIGHTS",
           "EU_PREFIX"]

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
_DISMISS_WORDS = ("close", "no thanks", "not now", "cancel", "dismiss", "skip", "later",
                  "reject", "decline", "x", "accept", "ok", "got it")
"""Words of an overlay's dismiss control, most preferred first (ids and texts are searched)."""


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


# ---------------------------------------------------------------------------------------
# configuration and the bank
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClawConfig:
    """Darwin-Claw's settings.

    Attributes:
        weights: (w1, w2, w3) of S = w1 e + w2 c + w3 eta (effect first).
        nursery_capacity: units on probation at once; a new one is refused while it is full
            (the ones there keep their chance; a pattern that persists comes back).
        ttl: cycles a unit may stay in the nursery: one admitted at cycle b and not
            promoted by the end of cycle b + ttl - 1 is evicted.
        exploit_slots, explore_slots: active units per skill and subtype.
        evict_after: relevant validations in a row with e < 0 that evict an active unit
            (a nursery unit is never promoted with e <= 0 and leaves on its TTL).
    """

    weights: tuple[float, float, float] = DEFAULT_WEIGHTS
    nursery_capacity: int = 16
    ttl: int = 3
    exploit_slots: int = 3
    explore_slots: int = 3
    evict_after: int = 2

    def __post_init__(self) -> None:
        w = tuple(float(x) for x in self.weights)
        if len(w) != 3 or any(x < 0 for x in w):
            raise ValueError(f"weights are three non-negative numbers, got {self.weights!r}")
        object.__setattr__(self, "weights", w)
        for name, lo in (("nursery_capacity", 1), ("ttl", 1), ("exploit_slots", 0),
                         ("explore_slots", 0), ("evict_after", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"ClawConfig.{name} must be an int >= {lo}, got {v!r}")

    def slots(self, subtype: str) -> int:
        return self.exploit_slots if subtype == "exploit" else self.explore_slots

    def as_dict(self) -> dict[str, Any]:
        return {"weights": list(self.weights), "nursery_capacity": self.nursery_capacity,
                "ttl": self.ttl, "exploit_slots": self.exploit_slots,
                "explore_slots": self.explore_slots, "evict_after": self.evict_after}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClawConfig:
        known = {f.name for f in fields(cls)}
        bad = [k for k in d if k not in known]
        if bad:
            raise ValueError(f"unknown ClawConfig key(s) {bad}; known: {sorted(known)}")
        return cls(**{k: (tuple(v) if k == "weights" else v) for k, v in d.items()})


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader (or a crash) sees the old file or the new one,
    never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ExperienceBank:
    """Every experience unit, in its state (nursery, active, evicted: the archive), with a
    log of what happened to each (``log``: ``{"cycle", "eu", "event", "why"}``).

    The state machine: :meth:`admit` (into the nursery), :meth:`judge` (one validation:
    promotion on e > 0 into a slot taken by competition on S, eviction of an active unit
    after ``evict_after`` negative effects in a row), :meth:`expire` (the nursery's TTL),
    :meth:`pin`, :meth:`unpin`, :meth:`evict` (the user's); :meth:`cycle` runs a whole cycle.
    """

    FORMAT = "digirl-claw-bank"
    VERSION = 1

    def __init__(self, config: ClawConfig | None = None,
                 units: Iterable[ExperienceUnit] = (), cycle_no: int = 0) -> None:
        self.config = config or ClawConfig()
        self.units: dict[str, ExperienceUnit] = {}
        for u in units:
            if u.id in self.units:
                raise ClawError(f"experience unit id {u.id!r} appears twice")
            self.units[u.id] = u
        self.cycle_no = cycle_no
        """The cycle that runs next (the number of cycles run so far)."""
        self.log: list[dict[str, Any]] = []

    # -- queries ---------------------------------------------------------------------------
    def get(self, eu_id: str) -> ExperienceUnit:
        eu = self.units.get(eu_id.removeprefix(EU_PREFIX))
        if eu is None:
            raise ClawError(f"no experience unit {eu_id!r} in the bank")
        return eu

    def _in(self, state: str, skill: str | None, subtype: str | None) -> list[ExperienceUnit]:
        return [u for u in self.units.values() if u.state == state
                and (skill is None or u.skill == skill)
                and (subtype is None or u.subtype == subtype)]

    def nursery(self, skill: str | None = None, subtype: str | None = None
                ) -> list[ExperienceUnit]:
        return self._in("nursery", skill, subtype)

    def active(self, skill: str | None = None, subtype: str | None = None
               ) -> list[ExperienceUnit]:
        return self._in("active", skill, subtype)

    def archive(self, skill: str | None = None) -> list[ExperienceUnit]:
        """The evicted units (kept: their records say why they left)."""
        return self._in("evicted", skill, None)

    def skills(self) -> list[str]:
        return sorted({u.skill for u in self.units.values()})

    def find(self, unit: ExperienceUnit, live_only: bool = False) -> ExperienceUnit | None:
        """The bank's unit with the same trigger and strategy (live ones first)."""
        key = unit.key()
        same = [u for u in self.units.values() if u.key() == key]
        live = [u for u in same if u.state != "evicted"]
        return live[0] if live else (None if live_only or not same else same[0])

    # -- the state machine -----------------------------------------------------------------
    def _event(self, eu: ExperienceUnit, event: str, why: str, cycle: int | None) -> dict:
        rec = {"cycle": self.cycle_no if cycle is None else cycle, "eu": eu.id,
               "event": event, "why": why}
        self.log.append(rec)
        eu.note = f"{event} at cycle {rec['cycle']}" + (f": {why}" if why else "")
        return rec

    def admit(self, unit: ExperienceUnit, cycle: int | None = None) -> tuple[str, str]:
        """Put a new unit in the nursery. Returns ``(status, id)``: ``"admitted"`` (under
        ``id``, made unique when another unit has it), ``"merged"`` (a live unit with the
        same trigger and strategy exists: its provenance and keywords grow, an exploit
        subtype wins over explore), ``"archived"`` (the same unit was evicted before: it is
        not admitted again; a user may :meth:`pin` it).

        Raises:
            ClawError: the unit does not validate, or the nursery is full.
        """
        cycle = self.cycle_no if cycle is None else cycle
        unit.check()
        same = self.find(unit)
        if same is not None and same.state != "evicted":
            _merge_into(same, unit)
            return "merged", same.id
        if same is not None:
            return "archived", same.id
        if len(self.nursery()) >= self.config.nursery_capacity:
            raise ClawError(f"experience unit {unit.id!r} refused: the nursery is full "
                            f"({self.config.nursery_capacity} units on probation)")
        eu = copy.deepcopy(unit)
        base, n = eu.id, 2
        while eu.id in self.units:
            eu.id = f"{base}-{n}"
            n += 1
        eu.state, eu.pinned, eu.born = "nursery", False, cycle
        eu.provenance = {"cycle": cycle, "traces": [], "triage": "user", **eu.provenance}
        eu.negative = eu.validated = 0
        eu.e = eu.c = eu.eta = eu.S = None
        self.units[eu.id] = eu
        self._event(eu, "admitted", f"{eu.subtype}, skill {eu.skill}", cycle)
        return "admitted", eu.id

    def judge(self, v: Validation, cycle: int | None = None) -> list[dict[str, Any]]:
        """Apply one validation to its unit; returns the events it caused. An irrelevant
        validation (the unit never acted) changes nothing but the unit's note: e, c, eta and
        S stay those of its last relevant validation (one consistent record)."""
        cycle = self.cycle_no if cycle is None else cycle
        eu = self.get(v.eu_id)
        if eu.state == "evicted":
            return []
        if not v.relevant:
            eu.note = f"not relevant in cycle {cycle} (its rule never acted)"
            return [self._event(eu, "not relevant", "its rule never acted on these tasks",
                                cycle)]
        eu.e, eu.c, eu.eta, eu.S = v.e, v.c, v.eta, v.S
        eu.validated += 1
        eu.negative = eu.negative + 1 if v.e < 0 else 0
        events = [self._event(eu, "validated", f"e = {v.e:+.3f}, c = {v.c:.3f}, eta = "
                                               f"{v.eta:+.3f}, S = {v.S:.3f}", cycle)]
        if eu.state == "nursery" and v.e > 0:
            events += self._promote(eu, cycle)
        elif (eu.state == "active" and not eu.pinned
              and eu.negative >= self.config.evict_after):
            events.append(self._evict(eu, f"negative effect in {eu.negative} validations in "
                                          f"a row (last e = {v.e:+.3f})", cycle))
        return events

    def _slot_set(self, eu: ExperienceUnit) -> tuple[list[ExperienceUnit], int]:
        """The unpinned active units of ``eu``'s skill and subtype and how many slots they
        have (the pinned ones hold theirs for good)."""
        same = [u for u in self.active(eu.skill, eu.subtype) if u is not eu]
        pinned = sum(u.pinned for u in same)
        return [u for u in same if not u.pinned], max(0, self.config.slots(eu.subtype) - pinned)

    def _promote(self, eu: ExperienceUnit, cycle: int) -> list[dict[str, Any]]:
        others, cap = self._slot_set(eu)
        if len(others) < cap:
            eu.state = "active"
            return [self._event(eu, "promoted", f"e = {eu.e:+.3f} > 0, a free "
                                                f"{eu.subtype} slot", cycle)]
        if not others:
            return [self._event(eu, "waiting", f"every {eu.subtype} slot of skill "
                                               f"{eu.skill!r} is pinned", cycle)]
        low = min(others, key=_s_key)
        if _s_key(eu) > _s_key(low):
            ev = [self._evict(low, f"displaced from its {low.subtype} slot by {eu.id!r} "
                                   f"(S {_fmt_s(low.S)} < {_fmt_s(eu.S)})", cycle)]
            eu.state = "active"
            return ev + [self._event(eu, "promoted", f"took {low.id!r}'s {eu.subtype} slot "
                                                     f"(S {_fmt_s(eu.S)} > {_fmt_s(low.S)})",
                                     cycle)]
        return [self._event(eu, "waiting", f"e > 0 but S {_fmt_s(eu.S)} does not beat the "
                                           f"lowest active {eu.subtype} unit {low.id!r} "
                                           f"(S {_fmt_s(low.S)})", cycle)]

    def _evict(self, eu: ExperienceUnit, why: str, cycle: int | None) -> dict[str, Any]:
        eu.state, eu.pinned = "evicted", False
        return self._event(eu, "evicted", why, cycle)

    def _fit(self, skill: str, subtype: str, cycle: int | None, by: str) -> list[dict]:
        """Evict the lowest-S unpinned active units beyond the slots left by pinned ones."""
        out = []
        while True:
            act = self.active(skill, subtype)
            free = [u for u in act if not u.pinned]
            cap = max(0, self.config.slots(subtype) - (len(act) - len(free)))
            if len(free) <= cap:
                return out
            out.append(self._evict(min(free, key=_s_key), f"displaced: {by}", cycle))

    def expire(self, cycle: int | None = None) -> list[dict[str, Any]]:
        """End of ``cycle``: evict the nursery units whose TTL ran out."""
        cycle = self.cycle_no if cycle is None else cycle
        out = []
        for eu in self.nursery():
            age = cycle - eu.born + 1
            if age >= self.config.ttl:
                out.append(self._evict(eu, f"TTL expired: {age} cycle(s) in the nursery "
                                           "without promotion", cycle))
        return out

    def pin(self, eu_id: str) -> ExperienceUnit:
        """The user's pin: the unit is active from now on and the machine never evicts it
        (it holds its slot; an unpinned unit beyond the slots left is displaced)."""
        eu = self.get(eu_id)
        eu.pinned, eu.state = True, "active"
        self._event(eu, "pinned", "by the user", None)
        self._fit(eu.skill, eu.subtype, None, f"{eu.id!r} was pinned")
        return eu

    def unpin(self, eu_id: str) -> ExperienceUnit:
        """Back under the competition (it stays active while a slot is there for it)."""
        eu = self.get(eu_id)
        eu.pinned = False
        self._event(eu, "unpinned", "by the user", None)
        self._fit(eu.skill, eu.subtype, None, f"{eu.id!r} was unpinned")
        return eu

    def evict(self, eu_id: str, why: str = "by the user") -> ExperienceUnit:
        """The user's eviction (pinned or not): into the archive."""
        eu = self.get(eu_id)
        self._evict(eu, why, None)
        return eu

    # -- a cycle ---------------------------------------------------------------------------
    def cycle(self, traces: Sequence[Trace], runner: Runner,
              tasks_seeds: Sequence[tuple[str, int]], triage: Any = None) -> dict[str, Any]:
        """One Darwin-Claw cycle: triage ``traces`` (default :class:`ScriptedTriage`) into
        the nursery, validate every live unit on ``tasks_seeds`` with ``runner`` (one
        baseline run without any unit, one run per unit: each is measured alone), apply
        the verdicts (best S first, so slot competition is deterministic), expire the
        nursery's TTL. A triage that fails (an LLM reply that is not JSON) or a unit whose
        run fails is recorded in the report and the cycle goes on.

        Returns the report: ``cycle``, ``triage`` (kept and discarded traces, refusals),
        ``admitted``, ``merged``, ``refused``, ``validations`` (per unit), ``events``,
        ``errors``, and the ``active`` / ``nursery`` ids after the cycle.
        """
        c = self.cycle_no
        report: dict[str, Any] = {"cycle": c, "triage": {}, "admitted": [], "merged": [],
                                  "archived": [], "refused": [], "validations": {},
                                  "events": [], "errors": []}
        triage = triage if triage is not None else ScriptedTriage()
        try:
            res = _run_triage(triage, traces, c, self)
        except ClawError as e:
            res = TriageResult(refused=[str(e)])
        report["triage"] = res.as_dict()
        report["refused"] += res.refused
        for eu in res.units:
            try:
                status, eid = self.admit(eu, c)
            except ClawError as e:
                report["refused"].append(str(e))
                continue
            report[status].append(eid)
        live = self.nursery() + self.active()
        verdicts: list[Validation] = []
        if live:
            try:
                baseline = list(runner("", list(tasks_seeds)))
            except Exception as e:  # noqa: BLE001 - recorded; the units keep their state
                report["errors"].append(f"baseline run failed: {type(e).__name__}: {e}")
                live, baseline = [], []
            for eu in live:
                try:
                    v = validate(eu, runner, tasks_seeds, self.config.weights, baseline)
                except Exception as e:  # noqa: BLE001 - one unit's failure stops no other
                    report["errors"].append(f"{eu.id}: validation failed: "
                                            f"{type(e).__name__}: {e}")
                    continue
                verdicts.append(v)
                report["validations"][eu.id] = v.as_dict()
        verdicts.sort(key=lambda v: (not v.relevant, -(v.S if v.relevant else 0.0), v.eu_id))
        for v in verdicts:
            report["events"] += self.judge(v, c)
        report["events"] += self.expire(c)
        self.cycle_no = c + 1
        report["active"] = [u.id for u in self.active()]
        report["nursery"] = [u.id for u in self.nursery()]
        return report

    # -- persistence -----------------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        return {"format": self.FORMAT, "version": self.VERSION,
                "config": self.config.as_dict(), "cycle": self.cycle_no,
                "units": [u.as_dict() for u in self.units.values()], "log": list(self.log)}

    def save(self, path: str | Path) -> Path:
        """Write the bank as JSON, atomically (a crash leaves the previous file)."""
        path = Path(path)
        _atomic_write(path, json.dumps(self.as_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> ExperienceBank:
        """Raises :class:`ClawError` naming the file (and the unit) that does not parse."""
        path = Path(path)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ClawError(f"{path}, line {e.lineno}: not JSON ({e.msg}, column "
                            f"{e.colno})") from None
        if not isinstance(d, dict) or d.get("format") != cls.FORMAT:
            raise ClawError(f"{path}: not an experience bank (no \"format\": "
                            f"\"{cls.FORMAT}\")")
        try:
            config = ClawConfig.from_dict(d.get("config") or {})
        except (TypeError, ValueError) as e:
            raise ClawError(f"{path}: config: {e}") from None
        units = [ExperienceUnit.from_dict(u, f"{path}, unit {i + 1}")
                 for i, u in enumerate(d.get("units") or [])]
        bank = cls(config, units, int(d.get("cycle", 0)))
        bank.log = list(d.get("log") or [])
        return bank


def _s_key(u: ExperienceUnit) -> float:
    return float("-inf") if u.S is None else float(u.S)


def _fmt_s(s: float | None) -> str:
    """S for people: ``0.25``, ``0.787``, ``n/a`` before a validation."""
    if s is None:
        return "n/a"
    out = f"{s:.3f}".rstrip("0").rstrip(".")
    return "0" if out in ("", "-0") else out


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


# ---------------------------------------------------------------------------------------
# SKILL.md files
# ---------------------------------------------------------------------------------------
SKILL_FILE = "SKILL.md"


def _skill_md(bank: ExperienceBank, skill: str) -> str:
    cfg = bank.config
    act = sorted(bank.active(skill), key=lambda u: (not u.pinned, -_s_key(u), u.id))
    nur = sorted(bank.nursery(skill), key=lambda u: (-_s_key(u), u.id))
    w1, w2, w3 = cfg.weights
    lines = [f"# Skill: {skill}", "",
             "Experience units learned by Darwin-Claw (`digirl_lite.harness.claw`), written "
             f"after {bank.cycle_no} cycle(s). The active units are loaded by the harness as "
             "rules, in the order below (the first whose trigger holds acts); the nursery ones "
             "are on probation and not loaded. Each unit's record is the JSON block under its "
             "heading. Score S = "
             f"{w1:g} e + {w2:g} c + {w3:g} eta (e: change in completion rate where it acted; "
             "c: share of episodes it acted in; eta: fall in invalid actions per step).", ""]

    def block(u: ExperienceUnit) -> list[str]:
        flags = f"{u.subtype}, {u.state}" + (", pinned" if u.pinned else "")
        return [f"### {u.rule_id} ({flags}, S={_fmt_s(u.S)})", "", u.describe(), "",
                "```json", json.dumps(u.as_dict(), indent=2), "```", ""]

    n_ex = sum(u.subtype == "exploit" for u in act)
    lines += [f"## Active ({n_ex} of {cfg.exploit_slots} exploit, {len(act) - n_ex} of "
              f"{cfg.explore_slots} explore slots)", ""]
    if not act:
        lines += ["No active unit.", ""]
    for u in act:
        lines += block(u)
    lines += ["## Nursery (on probation, not loaded by the harness)", ""]
    if not nur:
        lines += ["No unit on probation.", ""]
    for u in nur:
        lines += block(u)
    return "\n".join(lines).rstrip("\n") + "\n"


def write_skill_md(bank: ExperienceBank, directory: str | Path) -> list[Path]:
    """Write ``<directory>/<skill>/SKILL.md`` for every skill the bank knows (its active
    units, then its nursery marked as such; a skill whose units were all evicted gets a
    file with none, so a harness never loads a stale unit). Atomic per file."""
    out = []
    for skill in bank.skills():
        path = Path(directory) / skill / SKILL_FILE
        _atomic_write(path, _skill_md(bank, skill))
        out.append(path)
    return out


_FENCE_OPEN = re.compile(r"^\s*```\s*json\s*$", re.IGNORECASE)
_FENCE_CLOSE = re.compile(r"^\s*```\s*$")


def read_skill_md(path: str | Path, errors: list[ClawError] | None = None
                  ) -> list[ExperienceUnit]:
    """The experience units of a SKILL.md: every fenced ```json block is one unit's record
    (the headings and prose around them are for people). A unit without a ``skill`` takes
    its folder's name.

    Args:
        errors: None: the first block that does not parse raises. A list: each such block's
            :class:`ClawError` is appended to it and the rest are read.

    Raises:
        ClawError: a block that is not JSON or not a valid unit, an unclosed block, or an
            id used twice, naming the file and the line.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ClawError(f"{path}: cannot read ({e})") from None
    default_skill = path.parent.name if _SKILL_RE.match(path.parent.name or "") else "phone"
    lines = text.splitlines()
    out: list[ExperienceUnit] = []
    seen: dict[str, int] = {}

    def fail(err: ClawError) -> None:
        if errors is None:
            raise err
        errors.append(err)

    i = 0
    while i < len(lines):
        if not _FENCE_OPEN.match(lines[i]):
            i += 1
            continue
        start = i + 1  # 1-based line of the fence
        j = i + 1
        while j < len(lines) and not _FENCE_CLOSE.match(lines[j]):
            j += 1
        if j >= len(lines):
            fail(ClawError(f"{path}, line {start}: a ```json block that is never closed"))
            break
        body = "\n".join(lines[i + 1:j])
        i = j + 1
        try:
            rec = json.loads(body)
        except json.JSONDecodeError as e:
            fail(ClawError(f"{path}, line {start + e.lineno}: not JSON ({e.msg}, column "
                           f"{e.colno}): {lines[start + e.lineno - 1].strip()[:120]!r}"))
            continue
        if isinstance(rec, dict) and "skill" not in rec:
            rec["skill"] = default_skill
        try:
            eu = ExperienceUnit.from_dict(rec, f"{path}, line {start}")
        except ClawError as e:
            fail(e)
            continue
        if eu.id in seen:
            fail(ClawError(f"{path}, line {start}: experience unit id {eu.id!r} is already "
                           f"used by the block on line {seen[eu.id]}"))
            continue
        seen[eu.id] = start
        out.append(eu)
    return out


def _skill_paths(source: str | Path | Sequence[str | Path]) -> list[Path]:
    items = [source] if isinstance(source, (str, Path)) else list(source)
    out = []
    for s in items:
        p = Path(s)
        out += sorted(p.rglob(SKILL_FILE)) if p.is_dir() else [p]
    return out


def skill_rules(source: ExperienceBank | str | Path | Sequence[str | Path],
                errors: list[ClawError] | None = None) -> str:
    """The active units as rule lines for a harness's ``skills`` component (one JSON object
    per line; pinned units first, then by S, best first: the first rule that holds acts).

    ``source``: a bank, or SKILL.md files / folders holding them (read with
    :func:`read_skill_md`; ``errors`` as there).

    Raises:
        ClawError: a block that does not parse (``errors`` None), or one unit id in two
            files.
    """
    if isinstance(source, ExperienceBank):
        units = source.active()
    else:
        units, where = [], {}
        for p in _skill_paths(source):
            for u in read_skill_md(p, errors):
                if u.id in where:
                    err = ClawError(f"{p}: experience unit id {u.id!r} is also in {where[u.id]}")
                    if errors is None:
                        raise err
                    errors.append(err)
                    continue
                where[u.id] = p
                if u.state == "active":
                    units.append(u)
    units = sorted(units, key=lambda u: (not u.pinned, -_s_key(u), u.id))
    return rules_text([u.to_rule() for u in units])


def skill_edit(source: ExperienceBank | str | Path | Sequence[str | Path]) -> Any:
    """The active units as an additive :class:`~digirl_lite.harness.harness.Edit` of kind
    ``skill`` (for :meth:`Harness.extend`), or None when no unit is active."""
    from digirl_lite.harness.harness import Edit

    text = skill_rules(source)
    if not text:
        return None
    return Edit("skill", text, {"proposer": "darwin-claw", "evidence": "experience units"})


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


# ---------------------------------------------------------------------------------------
# causal validation
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """One episode of a validation run: its task and seed, success (None: an infrastructure
    fault cut it; it counts in no rate), its length, its invalid steps, and ``hits``: the
    rule ids that acted in it (a step with ``decided_by == "rule:<id>"``; a unit's rule id
    is ``eu:<unit id>``)."""

    task: str
    seed: int
    success: bool | None
    steps: int = 0
    invalid: int = 0
    hits: frozenset[str] = frozenset()

    @property
    def infra(self) -> bool:
        return self.success is None


Runner = Callable[[str, Sequence[tuple[str, int]]], Sequence[Any]]
"""``runner(extra_rules_text, tasks_seeds) -> outcomes``: every (task, seed) played once
with the harness plus ``extra_rules_text`` (rule lines), one outcome each."""


def _hits(o: Any) -> set[str]:
    """Rule ids that acted in an outcome: its ``hits``, or the ``rule:<id>`` keys of a
    ``decided`` count (:class:`digirl_lite.harness.runner.Outcome`)."""
    if hasattr(o, "hits"):
        return set(o.hits)
    return {k[len("rule:"):] for k, n in (getattr(o, "decided", None) or {}).items()
            if k.startswith("rule:") and n}


def _ok(o: Any) -> bool:
    return o.success is not None and not getattr(o, "infra", False)


@dataclass(frozen=True)
class Validation:
    """One unit's causal validation. ``relevant``: its rule acted in some episode (else no
    verdict: e and eta are 0 and mean nothing). ``hits`` of ``episodes``; ``pairs``: the
    (task, seed) pairs compared; ``rate_with`` / ``rate_without`` and ``invalid_with`` /
    ``invalid_without`` (invalid actions per step) on them."""

    eu_id: str
    relevant: bool
    e: float
    c: float
    eta: float
    S: float
    hits: int = 0
    episodes: int = 0
    pairs: int = 0
    rate_with: float = 0.0
    rate_without: float = 0.0
    invalid_with: float = 0.0
    invalid_without: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def validate(eu: ExperienceUnit, runner: Runner, tasks_seeds: Sequence[tuple[str, int]],
             weights: Sequence[float] = DEFAULT_WEIGHTS,
             baseline: Sequence[Any] | None = None) -> Validation:
    """Run the same tasks at the same seeds without and with ``eu`` (its rule alone on top
    of the runner's harness) and measure what it causes.

    c = share of the with-unit episodes in which its rule acted; c = 0: not relevant, no
    verdict. On the (task, seed) pairs it acted in: e = completion rate with minus
    without; eta = invalid actions per step without minus with. S = :func:`score`.
    ``baseline``: the outcomes of ``runner("", tasks_seeds)`` when already run (a cycle
    shares one among its units). Episodes an infrastructure fault cut count nowhere.
    """
    ts = [(str(t), int(s)) for t, s in tasks_seeds]
    if len(set(ts)) != len(ts):
        raise ValueError("tasks_seeds holds a (task, seed) pair twice: a pair is one episode")
    base = list(baseline) if baseline is not None else list(runner("", ts))
    with_ = list(runner(eu.to_rule().line() + "\n", ts))
    ok_with = [o for o in with_ if _ok(o)]
    hit = {(o.task, o.seed) for o in ok_with if eu.rule_id in _hits(o)}
    n = len(ok_with)
    c = len(hit) / n if n else 0.0
    if not hit:
        return Validation(eu.id, False, 0.0, 0.0, 0.0, score(0.0, 0.0, 0.0, weights),
                          0, n)
    w_by = {(o.task, o.seed): o for o in ok_with}
    b_by = {(o.task, o.seed): o for o in base if _ok(o)}
    pairs = sorted(k for k in hit if k in b_by)
    if not pairs:
        return Validation(eu.id, True, 0.0, c, 0.0, score(0.0, c, 0.0, weights), len(hit), n)

    def rate(by: dict) -> float:
        return sum(bool(by[k].success) for k in pairs) / len(pairs)

    def invalid(by: dict) -> float:
        steps = sum(by[k].steps for k in pairs)
        return sum(by[k].invalid for k in pairs) / steps if steps else 0.0

    rw, rb, iw, ib = rate(w_by), rate(b_by), invalid(w_by), invalid(b_by)
    e, eta = rw - rb, ib - iw
    return Validation(eu.id, True, e, c, eta, score(e, c, eta, weights), len(hit), n,
                      len(pairs), rw, rb, iw, ib)


# ---------------------------------------------------------------------------------------
# from a fleet's episodes
# ---------------------------------------------------------------------------------------
def _episode_nodes(episode: Any, n: int) -> list[tuple[Any, ...] | None]:
    """Each step's UI tree as the agent saw it (``Episode.trees``: the environment reads it
    with ``ui_tree`` on; never the simulator's state)."""
    trees = list(getattr(episode, "trees", None) or [])
    return [tuple(t) if t is not None else None for t in (trees + [None] * n)[:n]]


def traces_from_episodes(episodes: Sequence[Any], width: int = 1080, height: int = 2280,
                         max_nodes: int = 60) -> list[Trace]:
    """A fleet's episodes (:class:`~digirl_lite.rollout.fleet.Episode`) as traces, the
    simulator's screens as UI trees. Episodes an infrastructure fault cut are left out
    (they say nothing about the agent)."""
    from digirl_lite.envs.uitree import tree_text

    out = []
    for ep in episodes:
        t = ep.trajectory
        if t.is_infra_truncated:
            continue
        nodes = _episode_nodes(ep, len(t.steps))
        steps = []
        for i, s in enumerate(t.steps):
            nd = nodes[i] or ()
            st = EvidenceStep(step=i, tree=tree_text(nd, max_nodes) if nd else "",
                              action=s.action_text[:300], decided_by=s.decided_by or "agent",
                              valid=s.action.is_valid,
                              screen_changed=s.screen_id != s.next_screen_id)
            tapped = _tapped(st, nd, width, height) if nd else None
            if tapped:
                n = next(x for x in nd if x.id == tapped)
                st = EvidenceStep(st.step, st.tree, st.action, st.decided_by, st.valid,
                                  st.screen_changed, {"id": n.id, "text": n.text})
            steps.append(st)
        out.append(Trace(t.traj_id, t.task, bool(t.is_success), tuple(steps), tuple(nodes),
                         t.seeds.get("env")))
    return out


def outcomes_from_episodes(episodes: Sequence[Any]) -> list[Outcome]:
    """One :class:`Outcome` per episode (its env seed, the rules that acted in it)."""
    out = []
    for ep in episodes:
        t = ep.trajectory
        out.append(Outcome(
            task=t.task, seed=int(t.seeds.get("env", -1)),
            success=None if t.is_infra_truncated else bool(t.is_success), steps=len(t.steps),
            invalid=sum(not s.action.is_valid for s in t.steps),
            hits=frozenset(s.decided_by[len("rule:"):] for s in t.steps
                           if (s.decided_by or "").startswith("rule:"))))
    return out


class FleetRunner:
    """A :data:`Runner` on a fleet: for each run of consecutive seeds, a fresh
    :class:`~digirl_lite.harness.harness.HarnessAgent` around ``make_agent(screens)``, whose
    skills are ``extra_rules_text`` (the unit under test, first) then ``components``' own
    skills; each (task, seed) is one episode at env seed ``seed`` (a run of consecutive seeds
    goes to the fleet in one ``collect``, into its own screen table).

    Args:
        fleet: a fleet (``collect``) whose environments read the UI tree (``ui_tree``).
        make_agent: ``(screens) -> StepAgent``, the frozen agent; ``screens`` is the
            :class:`~digirl_lite.data.records.ScreenTable` the fleet records the run's
            screens in (a :class:`~digirl_lite.harness.harness.PolicyAgent` reads its image
            features from it).
        components: the harness around it (None: H0).
        crn_salt: common random numbers (:attr:`PolicyAgent.crn_salt`): every call with the
            same salt, so a run with a unit and one without draw the same noise wherever the
            agent sees the same screen (None: the agent's own draws).
        collect_kwargs: passed to every ``fleet.collect`` (``reset_options`` ...).
    """

    def __init__(self, fleet: Any, make_agent: Callable[[Any], Any],
                 components: dict[str, str] | None = None, id_prefix: str = "claw",
                 width: int = 1080, height: int = 2280, crn_salt: int | None = None,
                 collect_kwargs: dict[str, Any] | None = None) -> None:
        from digirl_lite.harness.harness import H0_COMPONENTS

        self.fleet, self.make_agent = fleet, make_agent
        self.components = dict(components or H0_COMPONENTS)
        self.id_prefix, self.width, self.height = id_prefix, width, height
        self.crn_salt = crn_salt
        self.collect_kwargs = dict(collect_kwargs or {})
        self.calls = 0
        self.episodes = 0

    def __call__(self, extra_rules_text: str, tasks_seeds: Sequence[tuple[str, int]]
                 ) -> list[Outcome]:
        from digirl_lite.data.records import ScreenTable
        from digirl_lite.harness.harness import HarnessAgent

        comps = dict(self.components)
        extra = extra_rules_text.strip()
        comps["skills"] = (extra + "\n" if extra else "") + comps.get("skills", "")
        runs: list[list[tuple[str, int]]] = []
        for t, s in tasks_seeds:
            if runs and runs[-1][-1][1] + 1 == s:
                runs[-1].append((t, s))
            else:
                runs.append([(t, s)])
        out: list[Outcome] = []
        for k, run in enumerate(runs):
            screens = ScreenTable()
            agent = HarnessAgent(comps, self.make_agent(screens), self.width, self.height,
                                 where="claw runner")
            if self.crn_salt is not None:
                agent.crn_salt = self.crn_salt
            eps = self.fleet.collect(agent, [t for t, _ in run], screens,
                                     id_prefix=f"{self.id_prefix}-{self.calls}-{k}",
                                     seed=run[0][1], **self.collect_kwargs)
            out += outcomes_from_episodes(eps)
        self.calls += 1
        self.episodes += len(out)
        return out
