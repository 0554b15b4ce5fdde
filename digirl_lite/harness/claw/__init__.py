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
unit acted (:class:`ValidationEpisode`).

Bad input is refused with a :class:`ClawError` that names where (the file and line of a
``SKILL.md`` block, the LLM's reply) and the rest goes on. This module imports no torch
and no client library.

The package, by concern: :mod:`.units` (the unit, the error, the score), :mod:`.bank` (the
settings, the state machine, a cycle, the JSON), :mod:`.skill_md` (SKILL.md files and the
harness rules they give), :mod:`.triage` (traces, scripted and LLM triage, grounding),
:mod:`.validation` (causal validation) and :mod:`.fleet` (traces, validation episodes and a
runner from a fleet's episodes). Import the names from here.
"""

from digirl_lite.harness.claw.bank import ClawConfig, ExperienceBank
from digirl_lite.harness.claw.fleet import FleetRunner, outcomes_from_episodes, traces_from_episodes
from digirl_lite.harness.claw.skill_md import (
    SKILL_FILE,
    read_skill_md,
    skill_edit,
    skill_rules,
    write_skill_md,
)
from digirl_lite.harness.claw.triage import (
    LLM_INSTRUCTIONS,
    LLMTriage,
    ScriptedTriage,
    Trace,
    Triage,
    TriageResult,
    check_grounded,
    scripted_triage,
)
from digirl_lite.harness.claw.units import (
    DEFAULT_WEIGHTS,
    EU_PREFIX,
    STATES,
    SUBTYPES,
    TRIAGES,
    ClawError,
    ExperienceUnit,
    describe_strategy,
    describe_trigger,
    score,
)
from digirl_lite.harness.claw.validation import Runner, Validation, ValidationEpisode, validate

__all__ = ["ClawError", "ExperienceUnit", "ClawConfig", "ExperienceBank", "Trace",
           "ValidationEpisode", "Validation", "TriageResult", "Triage", "ScriptedTriage",
           "LLMTriage", "scripted_triage", "check_grounded", "score", "validate",
           "write_skill_md", "read_skill_md", "skill_rules", "skill_edit",
           "traces_from_episodes", "outcomes_from_episodes", "FleetRunner", "SUBTYPES",
           "STATES", "DEFAULT_WEIGHTS", "EU_PREFIX",
           # also public in the one-file module, kept importable from here
           "TRIAGES", "SKILL_FILE", "LLM_INSTRUCTIONS", "Runner", "describe_trigger",
           "describe_strategy"]
