"""Darwin-Claw around the learning policy (spec/DARWIN.md section C): an experience bank
whose active units act before the policy in the online collection and the evaluations, and
which grows by a cycle after every online iteration's update (triage of that iteration's
episodes, causal validation with the updated policy, the lifecycle). The loop itself is
:class:`digirl_lite.train.claw.ClawLoop`; Darwin-Claw around a frozen policy is
:func:`digirl_lite.harness.claw.run.run_claw`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from digirl_lite.errors import ConfigError

__all__ = ["ClawLoopConfig"]


@dataclass
class ClawLoopConfig:
    """Experience units around the learning policy."""

    claw: bool = False
    """Darwin-Claw around the learning policy: its bank's active units act before the policy
    in online collection and evaluations; a cycle follows each online update."""
    claw_options: dict[str, Any] = field(default_factory=dict)
    """The bank's settings, :class:`~digirl_lite.harness.claw.ClawConfig` fields (weights,
    nursery capacity, TTL, slots, eviction); {}: its defaults."""
    claw_triage: str = "scripted"
    """How a cycle turns episodes into units: "scripted" (mechanical, CPU) or "llm"
    (a model behind ``claw_triage_backend``)."""
    claw_triage_backend: dict[str, Any] | None = None
    """The LLM triage's backend, as the judge's: {"backend": "gemini" | "openai", ...}."""


def check(cfg: Any) -> None:
    """The Claw fields of ``cfg`` (a :class:`~digirl_lite.train.config.DigiRLConfig`):
    ConfigError naming the field."""
    if not cfg.claw:
        defaults = ClawLoopConfig()
        for name in ("claw_options", "claw_triage", "claw_triage_backend"):
            if getattr(cfg, name) != getattr(defaults, name):
                raise ConfigError(f"{name}={getattr(cfg, name)!r} has no effect with "
                                  "claw=false: set claw true or leave it")
        return
    from digirl_lite.harness.claw.bank import check_claw_fields

    check_claw_fields(cfg.claw_options, cfg.claw_triage, cfg.claw_triage_backend,
                      ("claw_options", "claw_triage", "claw_triage_backend"))
    if cfg.learner != "sync":
        raise ConfigError("claw: the bank's cycle follows each iteration's own episodes, "
                          "which the asynchronous learner does not keep; use learner "
                          "'sync'")
    if not cfg.ui_tree:
        raise ConfigError("claw: experience units read the screen's UI tree (their "
                          "triggers name its elements); set ui_tree true")
