"""What every learner is: the interface between the Trainer's loop and an update rule.

A learner is one file: a :class:`Learner` subclass registered under its ``algorithm`` name
(:func:`digirl_lite.learners.register`) that declares what the run needs from it:

- its config section: :attr:`Learner.Options` (a dataclass of settings no other learner
  has, set as the config's ``learner_options``), :attr:`Learner.reads` (the
  algorithm-specific fields of :class:`~digirl_lite.train.config.DigiRLConfig` it reads;
  the other learners' are refused away from their defaults), :attr:`Learner.defaults`
  (its values of the fields whose None means "the algorithm's own": ``actor_lr``,
  ``policy_loss_norm``, ``offline_imitation``) and :meth:`Learner.check_config` (its
  checks);
- :attr:`Learner.critics` (the DigiRL critics the run builds, trains' optimiser and
  checkpoints for it) and :meth:`Learner.state_dict` (its own checkpointed state);
- :meth:`Learner.draw_tasks` (how an online iteration draws its tasks);
- :attr:`Learner.data_parallel` (whether it may run under ``accelerate launch`` with several
  processes).

It reads the run through :class:`Run`, a small public part of the Trainer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch

    from digirl_lite.data.records import Trajectory

__all__ = ["Learner", "Run", "CRITICS"]

CRITICS = ("step", "instruction")
"""The critics a learner may ask for (:attr:`Learner.critics`): DigiRL's step critic
(Eq. 4.3) and instruction critic (Eq. 4.4)."""


class Run(Protocol):
    """What a learner may use of its run (the :class:`~digirl_lite.train.Trainer`). Every
    attribute is read at each use: a resumed run replaces its policy, optimisers and random
    streams.

    Attributes:
        cfg: the run's :class:`~digirl_lite.train.config.DigiRLConfig`.
        policy: the actor.
        actor_opt: the actor's optimiser (built from :meth:`Learner.actor_param_groups`);
            a learner may swap it for a phase (PPO's offline imitation).
        screens: the trajectories' screens, with features.
        buffer: the replay buffer (``trajectories("train")``).
        rng: this process's minibatch draws (and, on process 0, the online tasks).
        text: the critics' text embeddings (an ``EmbeddingCache``).
        step_critic, instr_critic, critic_opt: the critics the learner asked for
            (:attr:`Learner.critics`) and their optimiser; None otherwise.
        accelerator: the run's Accelerate object (``device``).
    """

    cfg: Any
    policy: Any
    actor_opt: Any
    screens: Any
    buffer: Any
    rng: np.random.Generator
    text: Any
    step_critic: Any
    instr_critic: Any
    critic_opt: Any
    accelerator: Any

    def timed(self, name: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, its time added to phase ``name`` of the run's ``time_split``
        (``critics``, ``filter``, ``actor``; ``offline_*`` in the offline phase)."""

    def iterate(self, n: int, desc: str) -> Iterator[int]:
        """``range(n)`` with a progress bar when the phase is long enough to watch."""

    def sampling_masks(self) -> Any:
        """The masks the phones' sampling ran under (an on-policy learner scores the
        recorded tokens under the same)."""


class Learner:
    """One algorithm's updates, on a run's state.

    What it does: :meth:`offline` on the pile (the offline phase) and :meth:`update` on an
    online iteration's data; each returns the fields metrics.jsonl logs for the phase
    (``actor_loss`` among them).
    """

    name: ClassVar[str] = ""
    """Its ``algorithm`` (set by :func:`~digirl_lite.learners.register`)."""
    on_policy: ClassVar[bool] = False
    """Whether :meth:`update` trains on the iteration's own trajectories (PPO, GRPO) rather
    than on the replay buffer."""
    offline_work = "critics and actor"
    """What :meth:`offline` trains, for the run's one line about the offline phase."""

    # -- what it declares -------------------------------------------------------------------
    reads: ClassVar[tuple[str, ...]] = ()
    """The algorithm-specific config fields it reads. A field some learner reads is refused
    away from its default under a learner that does not (an ablation that would silently
    change nothing); ``with_algorithm`` resets them."""
    defaults: ClassVar[dict[str, Any]] = {"actor_lr": 1e-4}
    """Its values of the fields whose None means "the algorithm's own"
    (``DigiRLConfig.resolved``): here the paper's actor learning rate."""
    critics: ClassVar[tuple[str, ...]] = ()
    """The DigiRL critics it trains or reads (of :data:`CRITICS`): the run builds them,
    their optimiser and their checkpoint entries only for a learner that names them."""
    data_parallel: ClassVar[bool] = True
    """Whether it runs under ``accelerate launch`` with several processes (every process
    takes the same number of collective steps)."""
    Options: ClassVar[type | None] = None
    """A dataclass of the settings no other learner has, defaults included, declared in the
    learner's own file; a run sets them as ``learner_options`` ({"name": value}, checked
    by :meth:`parse_options`) and the learner reads them as :attr:`options`."""

    @classmethod
    def parse_options(cls, given: dict[str, Any]) -> Any:
        """``given`` (a config's ``learner_options``) as an :attr:`Options` instance (None
        for a learner without options). Raises ``ConfigError`` naming ``learner_options``
        and the option: one this learner does not declare, or a value its ``Options``
        refuses (a ``ValueError`` or ``TypeError`` from it)."""
        import dataclasses

        from digirl_lite.errors import ConfigError

        if not isinstance(given, dict):
            raise ConfigError(f"learner_options must be an object of option: value, not "
                              f"{given!r}")
        if cls.Options is None:
            if given:
                raise ConfigError(f"learner_options {sorted(given)}: algorithm {cls.name!r} "
                                  "declares no options of its own (its learner's Options)")
            return None
        known = [f.name for f in dataclasses.fields(cls.Options)]
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ConfigError(f"learner_options: algorithm {cls.name!r} has no option "
                              f"{', '.join(map(repr, unknown))} (its options: {known})")
        try:
            return cls.Options(**given)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"learner_options of algorithm {cls.name!r}: {e}") from None

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        """Refuse a config this learner cannot run (a ``ValueError`` or ``ConfigError``
        naming the field); called by ``DigiRLConfig`` after its own checks of types."""

    @classmethod
    def carry_over(cls, fields: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
        """Another algorithm's config ``fields`` (a dict, ``algorithm`` already this one's)
        made fit for this learner, ``defaults`` the fields' defaults (``with_algorithm``;
        the fields it does not read are reset there): unchanged here."""
        return fields

    @classmethod
    def grades_note(cls, grader: Any, checkpoint: str) -> str:
        """What the viewer's grades of this learner's run mean (HTML, for the run report;
        ``grader`` a :mod:`digirl_lite.viz.grades` grader, ``checkpoint`` its checkpoint
        as HTML)."""
        return f"Grades from checkpoint {checkpoint}."

    def __init__(self, run: Run) -> None:
        self.run = run

    @property
    def cfg(self) -> Any:
        """The run's :class:`~digirl_lite.train.config.DigiRLConfig` (not imported here: the
        learners sit below the Trainer, tests/package/test_layers.py)."""
        return self.run.cfg

    @functools.cached_property
    def options(self) -> Any:
        """The run's ``learner_options`` as this learner's :attr:`Options` (None without),
        parsed once (a run's config does not change)."""
        return self.parse_options(self.cfg.learner_options)

    @property
    def policy(self):
        return self.run.policy

    @property
    def rng(self) -> np.random.Generator:
        return self.run.rng

    def draw_tasks(self, n_tasks: int, n: int) -> np.ndarray:
        """An online iteration's ``n`` task indices into ``n_tasks`` training tasks (from
        :attr:`rng`): uniform, with replacement."""
        return self.rng.integers(0, n_tasks, n)

    def state_dict(self) -> dict[str, Any]:
        """Its own state for the run's checkpoint (tensors and plain values; the critics and
        the actor's optimiser are the run's)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (an empty dict: a checkpoint saved without one)."""

    def actor_param_groups(self) -> list[dict[str, Any]]:
        """The actor optimiser's parameter groups (at the run's actor learning rate unless a
        group says)."""
        return [{"params": list(self.policy.parameters())}]

    def make_actor_optimizer(self) -> torch.optim.Optimizer:
        """AdamW over :meth:`actor_param_groups` at ``actor_lr`` (or the learner's own,
        :attr:`defaults`)."""
        import torch

        return torch.optim.AdamW(self.actor_param_groups(), lr=self.cfg.resolved("actor_lr"))

    def offline(self, pile: Sequence[Trajectory]) -> dict[str, Any]:
        """The offline phase on ``pile`` (the buffer's training split of it)."""
        raise NotImplementedError

    def update(self, collected: Sequence[Trajectory]) -> dict[str, Any]:
        """An online iteration's update: ``collected`` is what it collected (already in the
        buffer)."""
        raise NotImplementedError
