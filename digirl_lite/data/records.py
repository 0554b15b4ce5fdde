"""Typed records: steps, trajectories, and the table of screens they point to.

A :class:`Step` and a :class:`Trajectory` are frozen dataclasses that map one to one onto the
columns of the on-disk store (:mod:`digirl_lite.data.store`). Screenshots and their image
features are *not* held by steps: a step holds ``screen_id`` / ``next_screen_id``, content
hashes into a :class:`ScreenTable`, so the home screen seen in every episode is stored once
and its features are computed once. The critics' two-frame state (spec/DIGIRL.md section 3:
last two screenshots, the first frame repeated on step 0) is built by index at batch time
(:meth:`ScreenTable.stack`), never stored.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np

from digirl_lite.actions import Action, parse_action
from digirl_lite.filters import GAMMA, mc_returns

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

__all__ = [
    "Ending",
    "Source",
    "Verdict",
    "Step",
    "Trajectory",
    "ScreenTable",
    "screen_id_of_image",
    "screen_id_of_features",
]


class Ending(str, Enum):
    """How an episode ended. INFRA is never an agent failure: see :attr:`Trajectory.is_usable`."""

    SUCCESS = "success"
    """The judge said success (reward 1; this also ends the episode)."""
    AGENT_STOP = "agent_stop"
    """The agent emitted STATUS_TASK_COMPLETE / TASK_IMPOSSIBLE and the judge did not agree."""
    BUDGET = "budget"
    """The step budget H ran out (reward 0)."""
    INFRA = "infrastructure"
    """The device or the harness failed (crash, blank screen, timeout): not the agent's doing."""


class Source(str, Enum):
    OFFLINE = "offline"
    ONLINE = "online"


class Verdict(str, Enum):
    """A judge's verdict on one step. UNJUDGED (API down, unparsable reply) is never a 0."""

    SUCCESS = "success"
    FAILURE = "failure"
    UNJUDGED = "unjudged"


@dataclass(frozen=True)
class Step:
    """One step of an episode.

    Attributes:
        task: the instruction.
        prompt: the policy prompt (``Previous Actions: ... Goal: ...</s>``).
        action_text: what the policy wrote, verbatim.
        action: ``parse_action(action_text)`` (an INVALID action for malformed text).
        reward: the step reward (1 on the step the judge says success, else 0).
        done: whether the episode ended after this step.
        screen_id: the screenshot the action was taken on (a key of a ScreenTable).
        next_screen_id: the screenshot after the action.
        mc_return: discounted return-to-go (gamma 0.5), see :meth:`Trajectory.with_mc_returns`.
        timings: seconds spent per phase, e.g. ``{"policy_s": .., "env_s": .., "judge_s": ..}``.
        verdict: the judge's verdict on ``next_screen_id`` (None where no judge ran).
        judge_reply: the judge's reply text, if any.
        policy_version: the version of the policy weights that wrote ``action_text`` (the
            fleet's counter, bumped by the learner), so the staleness of asynchronous
            collection is measurable; -1 where unknown (offline pile, imports, stores
            written before the field existed).
        action_token_ids: the token ids the policy wrote ``action_text`` with (eos
            included), for an on-policy learner that must score the very tokens sampled;
            empty where unknown (scripted agents, older stores).
        action_log_probs: each of those tokens' log-probability under the distribution it
            was drawn from (temperature and any grammar mask applied): the behaviour policy's
            per-token log-probabilities of PPO's ratio; empty where unknown or greedy.
        decided_by: who chose the action when a harness wraps the agent (issue 30):
            ``"agent"``, ``"rule:<id>"`` (a skill rule acted instead of the agent) or
            ``"xi:<how>"`` (the action projection changed the agent's output: ``repair``,
            ``retry``, ``snap``); empty where no harness ran.

    Image features are looked up by ``screen_id`` in the :class:`ScreenTable` (stored once
    per screen): ``screens.features([step.screen_id])``.
    """

    task: str
    prompt: str
    action_text: str
    action: Action
    reward: float
    done: bool
    screen_id: str
    next_screen_id: str
    mc_return: float = 0.0
    timings: Mapping[str, float] = field(default_factory=dict)
    verdict: Verdict | None = None
    judge_reply: str | None = None
    policy_version: int = -1
    action_token_ids: tuple[int, ...] = ()
    action_log_probs: tuple[float, ...] = ()
    decided_by: str = ""

    def __post_init__(self) -> None:
        if not math.isfinite(self.reward):
            raise ValueError(f"step reward must be finite, got {self.reward}")
        object.__setattr__(self, "action_token_ids", tuple(int(x) for x in self.action_token_ids))
        object.__setattr__(self, "action_log_probs", tuple(float(x) for x in self.action_log_probs))
        if self.action_log_probs and len(self.action_log_probs) != len(self.action_token_ids):
            raise ValueError(f"{len(self.action_log_probs)} action log-probabilities for "
                             f"{len(self.action_token_ids)} action tokens")
        if self.verdict is not None:
            object.__setattr__(self, "verdict", Verdict(self.verdict))
        object.__setattr__(self, "timings", dict(self.timings))

    @classmethod
    def from_text(cls, *, action_text: str, **kwargs: Any) -> Step:
        """A step whose ``action`` is parsed from ``action_text`` (never raises on bad text)."""
        return cls(action_text=action_text, action=parse_action(action_text), **kwargs)


@dataclass(frozen=True)
class Trajectory:
    """One episode.

    Attributes:
        traj_id: unique id (stable across saves; decides the train/validation split).
        task: the instruction.
        steps: the steps in order.
        final_reward: the episode's reward (1 success, 0 otherwise).
        ending: how it ended (:class:`Ending`).
        source: offline pile or online collection.
        iteration: online iteration that collected it (-1 for the offline pile).
        horizon: the step budget H it ran under (the 1/H keep rule of Eq. 4.3 needs it).
        seeds: seeds that reproduce it, e.g. ``{"env": 3, "policy": 7}``.
        truncation_reason: for INFRA endings, what failed and where.
        true_success: the environment's own check at the episode's last step (the
            simulator's ``is_success``, a served simulated phone's ``digirl: isSuccess``;
            ``info["true_success"]``), beside the judge's verdict that made the reward;
            None where the environment has no check (a real device) or did not get to
            answer (an infrastructure truncation), and for records written before it
            existed (issue 32).
    """

    traj_id: str
    task: str
    steps: tuple[Step, ...]
    final_reward: float
    ending: Ending
    source: Source = Source.ONLINE
    iteration: int = -1
    horizon: int = 20
    seeds: Mapping[str, int] = field(default_factory=dict)
    truncation_reason: str | None = None
    true_success: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        if self.true_success is not None:
            object.__setattr__(self, "true_success", bool(self.true_success))
        object.__setattr__(self, "ending", Ending(self.ending))
        object.__setattr__(self, "source", Source(self.source))
        object.__setattr__(self, "seeds", {k: int(v) for k, v in dict(self.seeds).items()})
        where = f"trajectory {self.traj_id!r}"
        if not self.traj_id:
            raise ValueError("a trajectory needs a non-empty traj_id")
        if self.horizon <= 0:
            raise ValueError(f"{where}: horizon must be positive, got {self.horizon}")
        if (self.ending is Ending.SUCCESS) != (self.final_reward > 0):
            raise ValueError(
                f"{where}: ending {self.ending.value!r} does not match final_reward "
                f"{self.final_reward} (success <=> reward > 0)"
            )
        if self.ending is Ending.INFRA and not self.truncation_reason:
            raise ValueError(f"{where}: an infrastructure truncation needs truncation_reason")
        if self.ending is not Ending.INFRA and self.truncation_reason:
            raise ValueError(f"{where}: truncation_reason is only for infrastructure endings")
        if not self.steps and self.ending is not Ending.INFRA:
            raise ValueError(f"{where}: only an infrastructure truncation may have no steps")

    # -- derived views ------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.steps)

    @property
    def is_success(self) -> bool:
        return self.ending is Ending.SUCCESS

    @property
    def is_infra_truncated(self) -> bool:
        return self.ending is Ending.INFRA

    @property
    def num_unjudged(self) -> int:
        return sum(s.verdict is Verdict.UNJUDGED for s in self.steps)

    @property
    def is_usable(self) -> bool:
        """Fit for critic labels and actor data: not cut by infrastructure, no unjudged step.

        An infrastructure truncation or an unjudged step says nothing about the agent; using
        it as a failure would teach the critics a false 0 (issue 2, issue 4).
        """
        return not self.is_infra_truncated and self.num_unjudged == 0

    @property
    def rewards(self) -> np.ndarray:
        return np.array([s.reward for s in self.steps], dtype=np.float64)

    def with_mc_returns(self, gamma: float = GAMMA) -> Trajectory:
        """A copy whose steps carry ``mc_return`` = discounted return-to-go."""
        g = mc_returns(self.rewards, gamma)
        return replace(
            self, steps=tuple(replace(s, mc_return=float(v)) for s, v in zip(self.steps, g))
        )

    def state_frames(self) -> tuple[list[str], list[str]]:
        """Screen ids of the two-frame states s_0 .. s_T (T + 1 states).

        State s_h is (previous screen, current screen); s_0 repeats its frame; s_T is the
        state after the last action. Returns (prev_ids, cur_ids), each of length T + 1.
        """
        if not self.steps:
            return [], []
        cur = [s.screen_id for s in self.steps] + [self.steps[-1].next_screen_id]
        prev = [cur[0]] + cur[:-1]
        return prev, cur


# ----------------------------------------------------------------------------------------
# Screens
# ----------------------------------------------------------------------------------------
def screen_id_of_image(image: Image.Image) -> str:
    """Content hash of a screenshot (mode, size and pixels), 32 hex characters."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{image.mode}:{image.size[0]}x{image.size[1]}:".encode())
    h.update(image.tobytes())
    return h.hexdigest()


def screen_id_of_features(features: np.ndarray) -> str:
    """Content hash of a feature vector, for screens known only by features (imports)."""
    a = np.ascontiguousarray(features, dtype=np.float32)
    return "f" + hashlib.blake2b(a.tobytes(), digest_size=16).hexdigest()[:31]


class ScreenTable:
    """Distinct screens, each with an optional image and optional feature vector.

    ``add`` deduplicates by content, so a screen seen again costs a dict lookup. Features
    of all screens form one (N, d) float32 matrix; :meth:`stack` builds the critics'
    two-frame state (B, 2d) by index.

    Args:
        feature_dim: d, the length of every feature vector (None: decided by the first one).
    """

    def __init__(self, feature_dim: int | None = None) -> None:
        self.feature_dim = feature_dim
        self._ids: list[str] = []
        self._index: dict[str, int] = {}
        self._images: list[Any] = []  # PIL image, zero-arg loader, or None
        self._features: list[np.ndarray | None] = []
        self._paths: list[str | None] = []
        self._matrix: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, screen_id: object) -> bool:
        return screen_id in self._index

    @property
    def ids(self) -> list[str]:
        return list(self._ids)

    def add(
        self,
        image: Image.Image | Callable[[], Image.Image | None] | None = None,
        features: Any = None,
        screen_id: str | None = None,
        source_path: str | None = None,
    ) -> str:
        """Record a screen once; return its id. A repeat only fills in what was missing.

        The id is the image's content hash, else the features' hash, unless given. A loader
        (zero-argument callable) may stand for an image that is read on demand; then the id
        must be given.
        """
        feats = None
        if features is not None:
            if hasattr(features, "detach"):
                features = features.detach().cpu().numpy()
            feats = np.asarray(features, dtype=np.float32).reshape(-1)
            if self.feature_dim is None:
                self.feature_dim = int(feats.shape[0])
            elif feats.shape[0] != self.feature_dim:
                raise ValueError(
                    f"screen features have {feats.shape[0]} floats, the table holds "
                    f"{self.feature_dim}"
                )
        if screen_id is None:
            if image is not None and not callable(image):
                screen_id = screen_id_of_image(image)
            elif feats is not None:
                screen_id = screen_id_of_features(feats)
            else:
                raise ValueError("a screen needs an image, features or an explicit screen_id")
        i = self._index.get(screen_id)
        if i is None:
            self._index[screen_id] = len(self._ids)
            self._ids.append(screen_id)
            self._images.append(image)
            self._features.append(feats)
            self._paths.append(source_path)
            self._matrix = None
        else:
            if self._images[i] is None and image is not None:
                self._images[i] = image
            if self._features[i] is None and feats is not None:
                self._features[i] = feats
                self._matrix = None
            if self._paths[i] is None and source_path is not None:
                self._paths[i] = source_path
        return screen_id

    def index_of(self, screen_ids: Iterable[str]) -> np.ndarray:
        """Row indices of ``screen_ids``; KeyError naming the first unknown id."""
        try:
            return np.fromiter((self._index[s] for s in screen_ids), dtype=np.int64)
        except KeyError as e:
            raise KeyError(f"screen {e.args[0]!r} is not in this ScreenTable") from None

    def row(self, screen_id: str) -> tuple[Any, np.ndarray | None]:
        """(image or its loader, features or None) of one screen, as stored. Reads neither
        the matrix nor a loader, so another thread may :meth:`add` meanwhile (the
        asynchronous learner copies completed trajectories' screens out of the table its
        fleet is still writing)."""
        i = self._index[screen_id]
        return self._images[i], self._features[i]

    def has_features(self, screen_id: str) -> bool:
        return self._features[self._index[screen_id]] is not None

    def matrix(self) -> np.ndarray:
        """All features as one (N, d) float32 matrix (NaN rows for screens without any)."""
        if self._matrix is None:
            d = self.feature_dim or 0
            m = np.full((len(self._ids), d), np.nan, dtype=np.float32)
            for i, f in enumerate(self._features):
                if f is not None:
                    m[i] = f
            self._matrix = m
        return self._matrix

    def features(self, screen_ids: Sequence[str]) -> np.ndarray:
        """(B, d) features of ``screen_ids``; ValueError if any screen has none."""
        idx = self.index_of(screen_ids)
        missing = [self._ids[i] for i in idx if self._features[i] is None]
        if missing:
            raise ValueError(f"{len(missing)} screen(s) have no features, e.g. {missing[0]!r}")
        return self.matrix()[idx]

    def stack(self, prev_ids: Sequence[str], cur_ids: Sequence[str]) -> np.ndarray:
        """The critics' two-frame state: (B, 2d) = [features(prev) | features(cur)]."""
        if len(prev_ids) != len(cur_ids):
            raise ValueError(f"{len(prev_ids)} previous frames but {len(cur_ids)} current")
        return np.concatenate([self.features(prev_ids), self.features(cur_ids)], axis=1)

    def image(self, screen_id: str) -> Image.Image | None:
        """The screenshot (loaded on demand for stores opened from disk), or None."""
        i = self._index[screen_id]
        img = self._images[i]
        if callable(img):
            img = img()
        return img

    def in_memory(self) -> int:
        """How many screens hold a decoded image (not a loader) in memory."""
        return sum(1 for img in self._images if img is not None and not callable(img))

    def decoded(self, screen_ids: Iterable[str]) -> list[str]:
        """Those of ``screen_ids`` in the table that hold a decoded image (not a loader)."""
        out = []
        for sid in screen_ids:
            i = self._index.get(sid)
            if i is not None and self._images[i] is not None and not callable(self._images[i]):
                out.append(sid)
        return out

    def offload(self, loaders: Mapping[str, Callable[[], Image.Image | None]]) -> int:
        """Replace in-memory images by loaders of the same pictures (e.g. from the store
        that has just written them), so a long run does not keep every screenshot decoded.
        Screens without an in-memory image are left as they are. Returns how many were
        replaced."""
        n = 0
        for sid, loader in loaders.items():
            i = self._index.get(sid)
            if i is not None and self._images[i] is not None and not callable(self._images[i]):
                self._images[i] = loader
                n += 1
        return n

    def remove(self, screen_ids: Iterable[str]) -> int:
        """Drop screens (image or loader, features, path); unknown ids are ignored.

        One call compacts the table once, O(N) whatever the number removed, so drop screens
        in batches, not one by one. Row indices (:meth:`index_of`) of the screens kept
        change; the features matrix is compacted along with them, so anything that looks up
        by id (:meth:`features`, :meth:`stack`, critic batches) stays consistent. Returns
        how many were removed.
        """
        drop = {self._index[s] for s in screen_ids if s in self._index}
        if not drop:
            return 0
        keep = [i for i in range(len(self._ids)) if i not in drop]
        self._ids = [self._ids[i] for i in keep]
        self._images = [self._images[i] for i in keep]
        self._features = [self._features[i] for i in keep]
        self._paths = [self._paths[i] for i in keep]
        self._index = {sid: i for i, sid in enumerate(self._ids)}
        if self._matrix is not None:
            self._matrix = self._matrix[np.asarray(keep, dtype=np.int64)]
        return len(drop)

    def retain(self, keep: Container[str]) -> list[str]:
        """Drop every screen whose id is not in ``keep`` (one compaction, see
        :meth:`remove`); return the ids dropped."""
        gone = [sid for sid in self._ids if sid not in keep]
        self.remove(gone)
        return gone

    def source_path(self, screen_id: str) -> str | None:
        return self._paths[self._index[screen_id]]

    def rows(self) -> Iterable[tuple[str, Any, np.ndarray | None, str | None]]:
        """(id, image or loader, features, source path) per screen, in insertion order."""
        return zip(self._ids, self._images, self._features, self._paths)

    def merge(self, other: ScreenTable) -> None:
        """Add every screen of ``other`` (already-known ids only fill in what is missing)."""
        for sid, img, feats, path in other.rows():
            self.add(img, feats, screen_id=sid, source_path=path)

