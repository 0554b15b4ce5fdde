"""The environment interface shared by the simulated phone and Android emulators.

Gymnasium style::

    obs, info = env.reset(task=None, seed=None)
    obs, reward, terminated, truncated, info = env.step(action_text)
    env.close()

``terminated``: the episode ended on its own (the judge said success, or the agent emitted
STATUS_TASK_COMPLETE / TASK_IMPOSSIBLE). ``truncated``: it was cut, and
``info["truncation"]`` says by what: ``"budget"`` (H steps ran out; an agent failure) or
``"infrastructure"`` (a crashed device, blank screenshots, a timeout; not the agent's doing),
with ``info["reason"]`` saying what and where.

Ground truth, where the environment has its own check (issue 32): ``info["true_success"]``
is its verdict on the task (the simulator's ``is_success``; a served simulated phone's
``digirl: isSuccess``), independent of the judge whose verdict (``info["verdict"]``) makes
the reward; None or absent where it has none (a real device). ``info["reached_first_milestone"]``
says whether the episode has so far reached the task's first milestone (the site, Google,
the app), None or absent where the environment cannot tell. Recorders read both at the
episode's last step (``digirl_lite.rollout.episode.EpisodeRecorder``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

__all__ = ["Observation", "Env", "WorldInfo", "SimOptions", "TRUNCATION_BUDGET",
           "TRUNCATION_INFRA"]

TRUNCATION_BUDGET = "budget"
TRUNCATION_INFRA = "infrastructure"


@dataclass(frozen=True)
class Observation:
    """What the agent sees at one step.

    Attributes:
        screenshot: the screen (PIL image, 1080 x 2280 by default); treat as read-only.
        prompt: ``Previous Actions: <last action> Goal: <task></s>``.
        task: the instruction.
        step: steps taken so far in this episode (0 after reset).
        screen_id: a content name for the screenshot when the environment knows one cheaply
            (equal ids mean identical pixels), else None.
        state: the simulator's ground-truth state (for scripted experts and the oracle;
            None on real devices). Policies must not read it.
        ui_tree: the screen's UI tree (:class:`~digirl_lite.envs.uitree.UINode` tuple)
            when the environment reads it (``ui_tree`` on; issue 30), else None. Unlike
            ``state`` an agent may read it: a real device gives the same.
    """

    screenshot: Image.Image
    prompt: str
    task: str
    step: int = 0
    screen_id: str | None = None
    state: Any = None
    ui_tree: tuple | None = None


@runtime_checkable
class Env(Protocol):
    horizon: int

    def reset(self, task: Any = None, seed: int | None = None) -> tuple[Observation, dict]: ...

    def step(self, action_text: str) -> tuple[Observation, float, bool, bool, dict]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class WorldInfo:
    """What a trainer needs to know of a run's world, beyond its phones: given by the env
    factory (:func:`digirl_lite.envs.setup.world_info`) and filled in by the world itself
    (the simulator: :mod:`digirl_lite.envs.sim.info`; Android:
    :mod:`digirl_lite.envs.android.info`), so the trainer imports neither."""

    env: str
    """The config's ``env`` it describes ("sim", "android")."""
    pile_key: tuple[Any, ...]
    """The world's entries in the pile's cache key, in order (the run's own settings come
    before and after them): every world setting that changes what a pile holds."""
    feature_dim: int | None
    """The width of the screen features the world's screens are encoded to for policies
    that read screenshots (the critics' input); None: the image encoder's own default."""
    drift: bool
    """Whether the world has drift days (:meth:`reset_options`, :meth:`day`)."""

    def reset_options(self, day: int) -> dict[str, Any]:
        """The reset options that put a phone on drift ``day`` (``{"day": day}``); ``{}``
        for a world without days."""
        return {"day": day} if self.drift else {}

    def day(self, first: int, per_iteration: float, iterations: int) -> int:
        """The phone's drift day after ``iterations`` online iterations (none before the
        first: the pile's -1 counts as 0): ``first + floor(iterations * per_iteration)``; a
        world without days stays on ``first``."""
        if not self.drift:
            return first
        return first + math.floor(max(iterations, 0) * per_iteration + 1e-9)


@dataclass(frozen=True)
class SimOptions:
    """What a config may name of the simulated phone (``env`` "sim"): given by the env
    factory (:func:`digirl_lite.envs.setup.sim_options`) and filled in by the simulator
    (:func:`digirl_lite.envs.sim.options.options`), so the config imports neither."""

    phrasing_sets: tuple[str, ...]
    """The train phrasing sets (``train_phrasings``, ``typed_span_phrasings``)."""
    layouts: tuple[str, ...]
    """The dialog layouts ``sim_layout`` may name, the first the default."""
    surprises: tuple[str, ...]
    """The surprise names ``sim_surprises`` may set."""
    faults: tuple[str, ...]
    """The infrastructure fault names ``sim_faults`` may set."""
    check_faults: Callable[[dict[str, float]], None]
    """Raises TypeError or ValueError for ``sim_faults`` values the simulator refuses."""
