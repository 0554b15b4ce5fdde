"""The run's whole config, :class:`DigiRLConfig`: the field groups of this package in one
flat dataclass (``cfg.field``, one JSON object of fields), checked group by group; and what
compares two configs (:func:`unread`, :func:`effective_fields`, :func:`with_algorithm`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from digirl_lite.errors import ConfigError
from digirl_lite.learners import learner_class, learner_names
from digirl_lite.learners.ppo import OnPolicyConfig
from digirl_lite.train.config import (
    claw,
    evaluation,
    fleet,
    learning,
    policy,
    run,
    sft,
    simulator,
)
from digirl_lite.train.config.claw import ClawLoopConfig
from digirl_lite.train.config.evaluation import EVAL_ONLY, EvaluationConfig
from digirl_lite.train.config.fleet import FleetConfig
from digirl_lite.train.config.learning import LearningConfig
from digirl_lite.train.config.policy import PolicyConfig
from digirl_lite.train.config.run import RunConfig
from digirl_lite.train.config.sft import StartingPolicyConfig
from digirl_lite.train.config.simulator import SimulatorConfig

__all__ = ["DigiRLConfig", "OWN_DEFAULT", "unread", "effective_fields", "with_algorithm"]

OWN_DEFAULT = ("actor_lr", "policy_loss_norm", "offline_imitation")
"""Fields whose None means the algorithm's own value (its learner's ``defaults``):
:meth:`DigiRLConfig.resolved`."""


def unread(algorithm: str) -> tuple[str, ...]:
    """The algorithm-specific fields ``algorithm``'s learner does not read (those another
    registered learner reads: :attr:`~digirl_lite.learners.base.Learner.reads`); set away
    from their defaults they are an error (an ablation that would silently change nothing).
    :func:`with_algorithm` resets them."""
    names = {f.name for f in fields(DigiRLConfig)}
    own = set(learner_class(algorithm).reads)
    return tuple(dict.fromkeys(
        name for a in learner_names() for name in learner_class(a).reads
        if name in names and name not in own))


def effective_fields(d: dict[str, Any]) -> dict[str, Any]:
    """A config's fields (``DigiRLConfig.as_dict()``, as saved with a run) as the run uses
    them: the fields its algorithm does not read (:func:`unread`) and the evaluation-only
    ones (:data:`EVAL_ONLY`) left out, and those whose None means the algorithm's own value
    (:data:`OWN_DEFAULT`) given that value. Two runs whose effective fields agree are the
    same run, whatever their defaults were when each was written (checkpoints on resume,
    grid results). An algorithm no learner is registered for keeps every field."""
    try:
        learner = learner_class(d.get("algorithm", "digirl"))
    except ConfigError:
        return {k: v for k, v in d.items() if k not in EVAL_ONLY}
    out = {k: v for k, v in d.items() if k not in (*unread(learner.name), *EVAL_ONLY)}
    for name in OWN_DEFAULT:
        if name in out and out[name] is None:
            out[name] = learner.defaults.get(name)
    return out


# A dataclass takes its bases' fields last base first: the run's fields come first.
@dataclass
class DigiRLConfig(ClawLoopConfig, OnPolicyConfig, LearningConfig, EvaluationConfig,
                   SimulatorConfig, StartingPolicyConfig, PolicyConfig, FleetConfig,
                   RunConfig):
    """A DigiRL (or Filtered BC, AWR, PPO, GRPO) run: every field of
    :class:`~.run.RunConfig` (the run), :class:`~.fleet.FleetConfig` (phones and fleet),
    :class:`~.policy.PolicyConfig` (the policy), :class:`~.sft.StartingPolicyConfig` (the
    starting policy), :class:`~.simulator.SimulatorConfig` (the simulated phone),
    :class:`~.evaluation.EvaluationConfig` (evaluations), :class:`~.learning.LearningConfig`
    (critics, filters, actor), PPO's and GRPO's section, which lives with them
    (:class:`digirl_lite.learners.ppo.OnPolicyConfig`), and :class:`~.claw.ClawLoopConfig`
    (Darwin-Claw around the learning policy). A learner's settings of its own
    (fields no other learner has) go in ``learner_options`` (:attr:`Learner.Options`)."""

    def resolved(self, name: str) -> Any:
        """Field ``name``, or, where it is None, the algorithm's own value (its learner's
        ``defaults``: :data:`OWN_DEFAULT`'s fields); e.g. ``resolved("actor_lr")`` is 1e-4
        for DigiRL and 1e-5 for PPO. None where the learner has no value of its own."""
        value = getattr(self, name)
        return learner_class(self.algorithm).defaults.get(name) if value is None else value

    def __post_init__(self) -> None:
        if isinstance(self.eval_splits, list):  # from JSON
            self.eval_splits = tuple(self.eval_splits)
        _check_types(self)
        run.check(self)
        learning.check(self)
        policy.check(self)
        defaults = {f.name: f.default for f in fields(self)}
        for name in unread(self.algorithm):
            if getattr(self, name) != defaults[name]:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} has no effect with algorithm="
                    f"{self.algorithm!r}: leave it at {defaults[name]!r} (with_algorithm() "
                    "resets what another algorithm does not read)")
        fleet.check(self)
        sft.check(self)
        evaluation.check(self)
        simulator.check(self)
        claw.check(self)

    def as_dict(self) -> dict[str, Any]:
        """The fields as JSON has them (``eval_splits`` a list), so a config compares equal
        to the one saved with a run; :meth:`from_dict` takes either."""
        return {**asdict(self), "eval_splits": list(self.eval_splits)}

    def check_paths(self) -> None:
        """Fail early, naming every field that cannot work (a missing path, a judge without
        its key or extra, an Android section that does not parse), before anything is built
        or collected. Devices are reached later, still before any collection
        (:func:`digirl_lite.envs.setup.make_phones`)."""
        from digirl_lite.envs.judges import check_judge

        missing: list[str] = []

        def need(what: str, path: Any, kind: str = "dir") -> None:
            if not path:
                missing.append(f"{what}: not set")
                return
            p = Path(str(path)).expanduser()
            ok = p.is_dir() if kind == "dir" else p.is_file()
            if not ok:
                missing.append(f"{what}: no {'directory' if kind == 'dir' else 'file'} {p}")

        if self.starting_policy not in ("sft", "shipped"):
            need("starting_policy", self.starting_policy)
        if self.policy == "vlm":
            need("policy_path (policy 'vlm': the base model's directory)", self.policy_path)
        if self.image_encoder != "sim":
            need("image_encoder (a local BLIP-2 directory)", self.image_encoder)
        if self.text_encoder != "minilm":
            need("text_encoder (a local RoBERTa-layout directory)", self.text_encoder)
        for name in ("task_file", "test_task_file"):
            if getattr(self, name) is not None:
                need(name, getattr(self, name), "file")
        if self.eval_splits:
            from digirl_lite.envs.setup import split_path

            for name in self.eval_splits:
                need("eval_splits", split_path(self, name), "file")
        if self.env == "android":
            import os

            from digirl_lite.envs.setup import android_plan

            try:
                plan = android_plan(self.android)
            except ConfigError as e:
                missing.append(str(e))
                plan = None
            if plan is not None and plan.emulators is not None:  # real apps on emulators
                sdk = plan.emulators.get("sdk_root") or os.environ.get("ANDROID_SDK_ROOT") \
                    or os.environ.get("ANDROID_HOME")
                need("android.emulators.sdk_root (the Android SDK)", sdk)
                for name in ("task_file", "test_task_file"):
                    if getattr(self, name) is None:
                        missing.append(f"{name}: required with emulators (the AitW lists; the "
                                       "shipped lists are the simulator's)")
        for name in ("judge", "eval_judge"):
            if name == "eval_judge" and self.eval_judge is None:
                continue
            try:
                check_judge(getattr(self, name), self.env, self.android.get("reset", "home")
                            if self.env == "android" else None)
            except ConfigError as e:
                missing.append(f"{name}: {e}" if name == "eval_judge" else str(e))
        if missing:
            raise ConfigError("this configuration cannot run:\n  " + "\n  ".join(missing))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DigiRLConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown config fields {unknown}")
        return cls(**d)


def _type_ok(value: Any, hint: Any) -> bool:
    import types
    import typing

    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is not None:  # dict[str, Any], list[str], tuple[int, ...]
        return isinstance(value, origin)
    return isinstance(value, hint)


def _check_types(cfg: DigiRLConfig) -> None:
    """Every field holds a value of its declared type (a JSON number where a float is
    expected is converted), else a ValueError naming the field."""
    import typing

    hints = typing.get_type_hints(type(cfg))
    for f in fields(cfg):
        v, hint = getattr(cfg, f.name), hints[f.name]
        if not _type_ok(v, hint):
            name = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
            raise ValueError(f"{f.name} must be {name}, got {v!r} ({type(v).__name__})")
        if hint is float and isinstance(v, int):
            setattr(cfg, f.name, float(v))


def with_algorithm(cfg: DigiRLConfig, algorithm: str) -> DigiRLConfig:
    """``cfg`` with another ``algorithm`` (e.g. the Filtered BC arm beside a DigiRL run),
    the fields it does not read (:func:`unread`) back at their defaults, and those its
    learner cannot take made fit (:meth:`~digirl_lite.learners.base.Learner.carry_over`)."""
    learner = learner_class(algorithm)
    defaults = {f.name: f.default for f in fields(DigiRLConfig)}
    # the learner's own settings (learner_options) are another learner's: not carried over
    d = learner.carry_over({**cfg.as_dict(), "algorithm": algorithm, "learner_options": {}},
                           defaults)
    return DigiRLConfig.from_dict({**d, **{k: defaults[k] for k in unread(algorithm)}})
