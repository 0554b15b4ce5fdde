"""The starting policy (the paper's AutoUI role: a copier of people's demonstrations) and the
supervised fine-tuning that builds it on the simulator's expert demonstrations.

Every SFT field is part of the starting policy's cache key (:func:`digirl_lite.train.starting.
sft_key`); ``docs/config.md`` says what each of this project's choices measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from digirl_lite.train.config.simulator import sim_only

__all__ = ["StartingPolicyConfig", "SFT_PHONES"]

SFT_PHONES = ("older", "live")
"""The phones the simulator's demonstrations may be recorded on (``sft_phone``)."""


@dataclass
class StartingPolicyConfig:
    """Where the starting policy comes from, and how SFT builds one."""

    starting_policy: str = "sft"
    """"sft" (fine-tune on the simulator's demonstrations, cached), "shipped" (the package's
    ``policies/sft-<world>``; a VLM: ``policy_path`` as is) or a saved policy's directory."""
    sft_seed: int = 0
    """Seed of the starting policy (demonstrations, initialisation, batches), apart from
    ``seed``: as in the paper, every run seed starts from the same checkpoint."""
    sft_demos: int = 400
    """Expert demonstrations on clean screens for supervised fine-tuning (this project)."""
    sft_varied_products: bool = True
    """Demonstrations search for made-up products (General: places, shops, landmarks) beside
    the train list's, as people's recordings name many more things."""
    sft_surprise_rate: float = 0.05
    """Surprises in the demonstrations, as a fraction of the default rates, so the starting
    policy has seen recoveries; evaluation and practice use the full rates."""
    sft_phone: str = "older"
    """The phone the demonstrations are recorded on (:data:`SFT_PHONES`): "older" (drift day
    1, default surprises, no ``sim_surprises``) or "live" (the run's own phone)."""
    sft_popup_back_share: float = 0.0
    """The share of pop-ups the demonstrators close with BACK rather than the dialog's X
    (0, the shipped policies: always the X)."""
    sft_slip_rate: float = 0.0
    """Per-step slips in the demonstrations (a wrong tap, then a recovery:
    :class:`~digirl_lite.envs.sim.agents.SlippingExpert`); 0: clean demonstrations."""
    sft_phrasing_share: float = 0.0
    """Share of the demonstrations and copy drills written with the train phrasings
    (``train_phrasings``; General's too); 0: AitW's one phrasing."""
    sft_copy_updates: int = 1500
    """Copy drills before SFT (``envs.sim.drills.copy_drills``, batch ``sft_batch``), standing
    in for a real Auto-UI's pre-training. 0: none."""
    sft_copy_share: float = 0.25
    """Share of each SFT batch that is copy drills, so the skill survives SFT."""
    sft_updates: int = 1500
    """SFT updates (batch ``sft_batch``); enough for the tiny preset to copy the expert."""
    sft_batch: int = 64
    """Rows per SFT update (demonstration steps and copy drills)."""
    sft_lr: float = 1e-3
    """SFT's learning rate, with 50 warm-up updates and gradient clipping at 1.0."""


def check(cfg: Any) -> None:
    """The starting policy's fields of ``cfg`` (a
    :class:`~digirl_lite.train.config.DigiRLConfig`)."""
    if not 0 <= cfg.sft_copy_share < 1 or cfg.sft_copy_updates < 0:
        raise ValueError("sft_copy_share must be in [0, 1) and sft_copy_updates >= 0")
    if cfg.sft_batch <= 0:
        raise ValueError("sft_batch must be positive")
    sim_only(cfg, "sft_phone", SFT_PHONES)
    for name in ("sft_slip_rate", "sft_popup_back_share"):
        if not 0 <= getattr(cfg, name) <= 1:
            raise ValueError(f"{name} must be a probability in [0, 1], got "
                             f"{getattr(cfg, name)}")
