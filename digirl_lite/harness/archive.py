"""DarwinX's archive: every evaluated variant as a :class:`Node` (parent, edits, g, R, solved
set, lineage gain G, kind), saved to and loaded from ``archive.json``, and parent sampling
over it (:func:`select_parent`).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from digirl_lite.paths import atomic_write_text

__all__ = ["Node", "Archive", "select_parent"]


@dataclass
class Node:
    """One evaluated variant."""

    id: str
    parent: str | None
    generation: int
    harness: dict[str, Any]
    """:meth:`Harness.as_dict`: H0 and every edit from the root."""
    edits: list[dict[str, Any]] = field(default_factory=list)
    """This node's own edits (with provenance)."""
    candidate: str = ""
    screen: dict[str, float] = field(default_factory=dict)
    """avg@k_screen per evolution task."""
    g: float = 0.0
    R: float = 0.0
    G: float = 0.0
    solved: list[str] = field(default_factory=list)
    lineage_solved: list[str] = field(default_factory=list)
    """The tasks this lineage has shown it solves (its probe re-checked the parent's)."""
    probe: dict[str, Any] | None = None
    confirm: dict[str, float] | None = None
    """avg@k_confirm per evolution task (accepted variants)."""
    kind: str = "root"
    accepted: bool = True
    reason: str = ""
    proposer: str = ""
    evidence: dict[str, int] = field(default_factory=dict)
    decided: dict[str, int] = field(default_factory=dict)
    t: float = 0.0
    merged_from: list[str] = field(default_factory=list)
    """A merge (``kind`` "merge"): the ids of the variants merged (``parent`` is the first)."""

    @property
    def confirmed(self) -> bool:
        return self.accepted and self.confirm is not None


@dataclass
class Archive:
    nodes: list[Node] = field(default_factory=list)

    def add(self, node: Node) -> Node:
        if any(n.id == node.id for n in self.nodes):
            raise ValueError(f"node {node.id} is already in the archive")
        self.nodes.append(node)
        return node

    def get(self, node_id: str) -> Node:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def accepted_by_candidate(self, cid: str) -> Node | None:
        for n in self.nodes:
            if n.accepted and n.candidate == cid:
                return n
        return None

    def population(self) -> list[Node]:
        return [n for n in self.nodes if n.accepted]

    def save(self, path: str | Path, **extra: Any) -> None:
        atomic_write_text(Path(path), json.dumps({"nodes": [asdict(n) for n in self.nodes],
                                                  **extra}, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Archive:
        d = json.loads(Path(path).read_text())
        return cls([Node(**n) for n in d["nodes"]])


def select_parent(archive: Archive, beta: float, rng: random.Random) -> Node:
    """p* ~ (1 - beta) argmax_G over confirmed variants + beta uniform over the population
    (Broaden); ties in G go to the newest (the deepest lineage)."""
    pop = archive.population()
    if not pop:
        raise ValueError("the archive has no accepted variant")
    if beta > 0 and rng.random() < beta:
        return pop[rng.randrange(len(pop))]
    confirmed = [n for n in pop if n.confirmed] or pop
    best = max(n.G for n in confirmed)
    return [n for n in confirmed if n.G >= best - 1e-12][-1]
