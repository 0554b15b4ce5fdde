"""What a proposer reads (spec/DARWIN.md section B, "Evidence for edits") and the interface
every proposer has (issue 30, item 3).

- :class:`Evidence`: failure-derived (a failed episode: its steps and the UI tree at the
  step where it went wrong), teacher-derived (a reference trajectory for a task the agent
  never solved, from the simulator's expert or a user's demonstrations) and self-derived
  (the agent's own pass contrasted with its failure on the same task).
- :class:`Memory`: the shared memory K_g (failure themes, what worked, what regressed),
  aggregated after each generation (:meth:`Memory.aggregate`), read by the proposer (an LLM
  proposer puts only the newest entries in its prompt).
- :class:`Proposer`: ``propose(components, evidence, memory) -> list[Edit]``; a reply that is
  not a valid edit raises :class:`ProposalError` (the loop records a rejected child and goes
  on).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from digirl_lite.harness.harness import Edit

__all__ = ["Evidence", "EvidenceStep", "Memory", "Proposer", "ProposalError", "EVIDENCE_KINDS"]

EVIDENCE_KINDS = ("failure", "teacher", "self")


class ProposalError(ValueError):
    """A proposer's reply that is not a valid edit (the message quotes it and says why)."""


@dataclass(frozen=True)
class EvidenceStep:
    """One step as a proposer sees it: the screen's tree (text), the action, who decided it,
    whether it parsed and whether the screen changed after it."""

    step: int
    tree: str
    action: str
    decided_by: str = "agent"
    valid: bool = True
    screen_changed: bool = True
    element: dict[str, str] | None = None
    """For a tap: the tree node it landed on (``{"id", "text"}``), where known."""

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tree": self.tree, "action": self.action,
                "decided_by": self.decided_by, "valid": self.valid,
                "screen_changed": self.screen_changed, "element": self.element}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvidenceStep:
        return cls(**d)


@dataclass(frozen=True)
class Evidence:
    """One piece of evidence.

    ``kind``: ``"failure"`` (``steps``: the failed episode; ``at``: the index of the step
    where it went wrong: the first unparseable or unchanged-screen step, else the last),
    ``"teacher"`` (``steps``: the reference trajectory; ``contrast``: the agent's failed
    attempt), ``"self"`` (``steps``: the agent's pass; ``contrast``: its failure on the same
    task). ``theme``: a short failure theme (``"unparseable"``, ``"stuck"``,
    ``"overlay"``, ``"budget"``, ``"wrong_page"``) for the memory's counts.
    """

    kind: str
    task: str
    steps: tuple[EvidenceStep, ...]
    contrast: tuple[EvidenceStep, ...] = ()
    at: int = -1
    theme: str = ""
    summary: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "task": self.task, "theme": self.theme, "at": self.at,
                "summary": self.summary, "steps": [s.as_dict() for s in self.steps],
                "contrast": [s.as_dict() for s in self.contrast]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Evidence:
        """The inverse of :meth:`as_dict` (a record of GEPA's reflective dataset)."""
        return cls(d["kind"], d["task"], tuple(EvidenceStep.from_dict(s) for s in d["steps"]),
                   tuple(EvidenceStep.from_dict(s) for s in d["contrast"]), at=d["at"],
                   theme=d["theme"], summary=d["summary"])


@dataclass
class Memory:
    """K_g: failure themes (counts), edits that worked and edits that regressed (their
    content and the gate's numbers), newest last; bounded so a prompt stays small."""

    themes: Counter = field(default_factory=Counter)
    worked: list[dict[str, Any]] = field(default_factory=list)
    regressed: list[dict[str, Any]] = field(default_factory=list)
    keep: int = 200

    def aggregate(self, evidence: Sequence[Evidence], worked: Sequence[dict[str, Any]] = (),
                  regressed: Sequence[dict[str, Any]] = ()) -> Memory:
        """K_{g+1} = Agg(K_g, worked, regressed, failure themes): a new memory."""
        themes = Counter(self.themes)
        themes.update(e.theme for e in evidence if e.theme)
        return Memory(themes, (self.worked + list(worked))[-self.keep:],
                      (self.regressed + list(regressed))[-self.keep:], self.keep)

    def tried(self) -> set[str]:
        """Every edit content already judged (worked or regressed): not proposed again."""
        return {d.get("content", "") for d in self.worked + self.regressed}

    def as_dict(self) -> dict[str, Any]:
        return {"themes": dict(self.themes), "worked": list(self.worked),
                "regressed": list(self.regressed), "keep": self.keep}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Memory:
        return cls(Counter(d.get("themes") or {}), list(d.get("worked") or []),
                   list(d.get("regressed") or []), int(d.get("keep", 200)))


class Proposer(Protocol):
    """Turns evidence into additive edits of a harness's components."""

    name: str

    def propose(self, components: dict[str, str], evidence: Sequence[Evidence],
                memory: Memory) -> list[Edit]:
        """Edits for a child of the harness with ``components``.

        Raises:
            ProposalError: the proposal is not a valid edit (says why, quotes it).
        """
