"""Darwin-Claw's settings and the experience bank: the nursery / active / evicted state
machine, a whole cycle (triage, causal validation, verdicts, TTL) and the bank's JSON."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from digirl_lite.errors import ConfigError
from digirl_lite.harness.claw.triage import ScriptedTriage, Trace, TriageResult, _run_triage
from digirl_lite.harness.claw.units import (
    DEFAULT_WEIGHTS,
    EU_PREFIX,
    ClawError,
    ExperienceUnit,
    _merge_into,
)
from digirl_lite.harness.claw.validation import Runner, Validation, validate
from digirl_lite.paths import atomic_write_text


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
    never half of one (the package's :func:`~digirl_lite.paths.atomic_write_text`, with the
    folder made first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)


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

# ---------------------------------------------------------------------------------------
# what a run around a bank shares (Darwin-Claw's runs, the training option, E3)
# ---------------------------------------------------------------------------------------
TRIAGE_KINDS = ("scripted", "llm")


def check_claw_fields(options: Any, triage: str, backend: Any,
                      names: tuple[str, str, str] = ("claw", "triage", "triage_backend")
                      ) -> None:
    """A bank's settings (``options``: :class:`~digirl_lite.harness.claw.ClawConfig`
    fields), the triage kind and its LLM backend, each refused with a ConfigError naming its
    field (``names``: the three fields as the caller's config calls them)."""
    opt_name, triage_name, backend_name = names
    if triage not in TRIAGE_KINDS:
        raise ConfigError(f"{triage_name}: {triage!r} is not one of {TRIAGE_KINDS}")
    if triage == "llm":
        if not backend:
            raise ConfigError(f"{backend_name}: the LLM triage needs a backend "
                              "({\"backend\": \"gemini\" | \"openai\", ...})")
        from digirl_lite.judge.backends import make_backend

        try:
            make_backend(dict(backend))
        except ValueError as e:
            raise ConfigError(f"{backend_name}: {e}") from None
    if not isinstance(options, dict):
        raise ConfigError(f"{opt_name}: must be a dict of ClawConfig fields, got {options!r}")
    try:
        ClawConfig.from_dict(options)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{opt_name}: {e}") from None


def make_triage(triage: str, backend: Any = None) -> Any:
    """The triage a config names: :class:`~digirl_lite.harness.claw.ScriptedTriage`, or
    :class:`~digirl_lite.harness.claw.LLMTriage` on ``backend``."""
    from digirl_lite.harness.claw.triage import LLMTriage

    if triage == "llm":
        from digirl_lite.judge.backends import make_backend

        return LLMTriage(make_backend(dict(backend)))
    return ScriptedTriage()


def units_record(bank: Any, state: str = "active") -> list[dict[str, Any]]:
    """The bank's active (or ``"nursery"``) units as a report lists them."""
    us = bank.active() if state == "active" else bank.nursery()
    return [{"id": u.id, "subtype": u.subtype, "trigger": u.trigger, "strategy": u.strategy,
             "S": u.S, "e": u.e, "c": u.c, "eta": u.eta, "born": u.born} for u in us]


def cycle_record(rep: dict[str, Any], traces: list[Any], bank: Any, runner: Any
                 ) -> dict[str, Any]:
    """One cycle's report (:meth:`ExperienceBank.cycle`'s ``rep`` on ``traces``, validated
    through ``runner``) as a run records it: what was collected, triaged, admitted, promoted
    and evicted, and the units after it (also E3's, ``benchmarks/claw_drift.py``)."""
    ev = rep["events"]
    return {
        "collected": len(traces), "collected_successes": sum(bool(t.success) for t in traces),
        "triage": {"kept": rep["triage"].get("kept", {}),
                   "discarded": len(rep["triage"].get("discarded", {}))},
        "admitted": rep["admitted"], "merged": rep["merged"], "archived": rep["archived"],
        "refused": rep["refused"], "errors": rep["errors"],
        "promoted": [e["eu"] for e in ev if e["event"] == "promoted"],
        "evicted": [{"eu": e["eu"], "why": e.get("why")} for e in ev
                    if e["event"] == "evicted"],
        "events": ev, "validations": rep["validations"],
        "runner_calls": runner.calls, "runner_episodes": runner.episodes,
        "active_after": units_record(bank), "nursery_after": units_record(bank, "nursery"),
    }
