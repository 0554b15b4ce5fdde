"""The replay buffer of trajectories (spec/DIGIRL.md section 7: 5,000 trajectories, 80/20).

Each trajectory's split is a pure function of ``(seed, traj_id)``, so it never changes as the
buffer grows or is reloaded from a checkpoint: a trajectory the critics validate on is never
trained on later. Infrastructure truncations and trajectories with unjudged steps are kept
(nothing collected is lost) but left out of sampling unless asked for
(:attr:`Trajectory.is_usable`).
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable, KeysView
from typing import Any, Literal, NamedTuple

import numpy as np

from digirl_lite.data.records import Trajectory

__all__ = ["ReplayBuffer", "StepRef", "split_of"]

Split = Literal["train", "val", "all"]


def split_of(traj_id: str, seed: int = 0, val_fraction: float = 0.2) -> str:
    """``"val"`` for about ``val_fraction`` of ids (a stable hash of seed and id), else
    ``"train"``."""
    h = hashlib.blake2b(f"{seed}:{traj_id}".encode(), digest_size=8).digest()
    u = int.from_bytes(h, "big") / 2.0**64
    return "val" if u < val_fraction else "train"


class StepRef(NamedTuple):
    """A sampled step: the trajectory and the step's index in it."""

    trajectory: Trajectory
    index: int


class ReplayBuffer:
    """Up to ``capacity`` trajectories, oldest dropped first.

    Args:
        capacity: the most trajectories held (5,000 in the paper; 2,000 in released defaults).
        val_fraction: share of trajectories held out for validation (0.2).
        seed: decides the split and, unless a generator is passed, sampling.
    """

    def __init__(self, capacity: int = 5000, val_fraction: float = 0.2, seed: int = 0) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
        self.capacity = capacity
        self.val_fraction = val_fraction
        self.seed = seed
        self._items: deque[Trajectory] = deque()
        self._ids: set[str] = set()
        self._screen_refs: dict[str, int] = {}  # screen id -> uses by buffered steps
        self._rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(self._items)

    def add(self, trajectories: Iterable[Trajectory]) -> list[Trajectory]:
        """Add trajectories (a repeated traj_id is an error); return those evicted.

        The screens an evicted trajectory used are still in the caller's ScreenTable:
        :func:`digirl_lite.train.memory.bound_to_buffer` drops those no buffered
        trajectory uses any more."""
        evicted: list[Trajectory] = []
        for t in trajectories:
            if t.traj_id in self._ids:
                raise ValueError(f"trajectory {t.traj_id!r} is already in the buffer")
            self._items.append(t)
            self._ids.add(t.traj_id)
            self._count_screens(t, +1)
            while len(self._items) > self.capacity:
                old = self._items.popleft()
                self._ids.discard(old.traj_id)
                self._count_screens(old, -1)
                evicted.append(old)
        return evicted

    def _count_screens(self, t: Trajectory, sign: int) -> None:
        refs = self._screen_refs
        for s in t.steps:
            for sid in (s.screen_id, s.next_screen_id):
                n = refs.get(sid, 0) + sign
                if n:
                    refs[sid] = n
                else:
                    del refs[sid]

    def screen_ids(self) -> KeysView[str]:
        """The screens the buffered trajectories' steps use (a live view; O(1) ``in``).

        Kept up to date by :meth:`add` at the cost of the steps added and evicted, so
        pruning a :class:`~digirl_lite.data.ScreenTable` to the buffer
        (``screens.retain(buffer.screen_ids())``) needs no pass over the buffer."""
        return self._screen_refs.keys()

    def split(self, t: Trajectory) -> str:
        return split_of(t.traj_id, self.seed, self.val_fraction)

    def trajectories(self, split: Split = "train", usable_only: bool = True) -> list[Trajectory]:
        """Trajectories of a split, oldest first; ``usable_only`` drops infra/unjudged ones."""
        if split not in ("train", "val", "all"):
            raise ValueError(f"split must be 'train', 'val' or 'all', got {split!r}")
        return [t for t in self._items
                if (split == "all" or self.split(t) == split)
                and (t.is_usable or not usable_only)]

    def counts(self) -> dict[str, int]:
        """How many trajectories the buffer holds, per kind (for logs)."""
        items = list(self._items)
        return {
            "total": len(items),
            "train": sum(self.split(t) == "train" for t in items),
            "val": sum(self.split(t) == "val" for t in items),
            "success": sum(t.is_success for t in items),
            "infra_truncated": sum(t.is_infra_truncated for t in items),
            "with_unjudged": sum(t.num_unjudged > 0 for t in items),
        }

    def sample_trajectories(
        self, n: int, split: Split = "train", replace: bool = False,
        rng: np.random.Generator | None = None,
    ) -> list[Trajectory]:
        """``n`` usable trajectories at random (all of them if fewer and not ``replace``)."""
        pool = self.trajectories(split)
        if not pool:
            return []
        rng = rng or self._rng
        k = n if replace else min(n, len(pool))
        idx = rng.choice(len(pool), size=k, replace=replace)
        return [pool[i] for i in idx]

    def sample_steps(
        self, n: int, split: Split = "train", rng: np.random.Generator | None = None,
    ) -> list[StepRef]:
        """``n`` steps uniformly over all steps of usable trajectories (with replacement)."""
        pool = [t for t in self.trajectories(split) if t.steps]
        if not pool:
            return []
        rng = rng or self._rng
        lengths = np.array([len(t.steps) for t in pool])
        flat = rng.integers(0, int(lengths.sum()), size=n)
        ends = np.cumsum(lengths)
        ti = np.searchsorted(ends, flat, side="right")
        starts = ends - lengths
        return [StepRef(pool[i], int(f - starts[i])) for i, f in zip(ti, flat)]

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs besides the trajectories themselves (kept in a store):
        settings, the ids in order, and the sampling generator's state."""
        return {"capacity": self.capacity, "val_fraction": self.val_fraction,
                "seed": self.seed, "traj_ids": [t.traj_id for t in self._items],
                "rng": self._rng.bit_generator.state}

    @classmethod
    def from_state_dict(
        cls, state: dict[str, Any], trajectories: Iterable[Trajectory],
    ) -> ReplayBuffer:
        """Rebuild a buffer from :meth:`state_dict` and the trajectories (e.g. from a store)."""
        buf = cls(state["capacity"], state["val_fraction"], state["seed"])
        by_id = {t.traj_id: t for t in trajectories}
        missing = [i for i in state["traj_ids"] if i not in by_id]
        if missing:
            raise KeyError(f"{len(missing)} buffered trajectories are missing, e.g. {missing[0]!r}")
        buf.add(by_id[i] for i in state["traj_ids"])
        buf._rng.bit_generator.state = state["rng"]
        return buf
