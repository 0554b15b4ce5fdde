"""SKILL.md files: the bank's units written as fenced JSON blocks per skill, read back
(errors name the file and line), and the active ones as a harness's ``skills`` rules."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from digirl_lite.harness.claw.bank import ExperienceBank, _atomic_write, _fmt_s, _s_key
from digirl_lite.harness.claw.units import _SKILL_RE, ClawError, ExperienceUnit
from digirl_lite.harness.rules import rules_text

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
