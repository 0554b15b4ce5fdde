"""What the Trainer, the fleets, the evaluation and the viewers ask of a policy (issue 18).

Two implementations: :class:`~digirl_lite.policy.policy.AutoUIPolicy` (a T5 reading a frozen
encoder's image features) and :class:`~digirl_lite.policy.vlm.VLMPolicy` (a Hugging Face
vision-language model reading the screenshot itself). Code outside ``digirl_lite.policy``
talks to :class:`Policy` and gets a policy's screen input with :func:`policy_inputs`; it
never names either class (:func:`digirl_lite.policy.factory.load_policy` opens a saved one
of either kind). This module imports neither implementation: they import it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from digirl_lite.data.records import ScreenTable

__all__ = ["Policy", "Sample", "Masks", "policy_inputs", "POLICY_FILE", "policy_kind"]

POLICY_FILE = "digirl_policy.json"
"""Written by every policy's ``save``: ``{"kind": "autoui" | "vlm", ...}``."""


class Sample(NamedTuple):
    """One sampled action: its text, the token ids the model wrote (eos included), and each
    token's log-probability under the distribution it was drawn from (temperature and any
    grammar mask applied; None for greedy decoding)."""

    text: str
    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...] | None


class Masks(NamedTuple):
    """The masks a sampling call put on the model's next-token scores, as an on-policy
    learner must put them again when it scores the sampled tokens (issue 47, item 5): the
    recorded log-probabilities are under the masked distribution, and an importance ratio
    is only 1 before an update when both sides are.

    Attributes:
        constrained: the action grammar (``constrained_decoding``).
        copy_text: the copy mask (``copy_typed_text``): False, True (any span of the goal)
            or a span chooser (the run's span extractor).
        copy_once: the copy mask does not type a text its episode typed already
            (``typed_span_once``): the scoring needs each row's texts typed before it.
        max_new_tokens: the sampling's cap (the grammar's budget depends on it).
    """

    constrained: bool = False
    copy_text: Any = False
    copy_once: bool = False
    max_new_tokens: int = 64

    @property
    def active(self) -> bool:
        return bool(self.constrained or self.copy_text)


@runtime_checkable
class Policy(Protocol):
    """A policy as the library uses it.

    ``screens`` below is what :func:`policy_inputs` gives for the policy's
    :attr:`screen_input`: a (B, d) float32 matrix of image features ("features") or B
    screenshots, PIL images ("images").
    """

    screen_input: Literal["features", "images"]
    model: torch.nn.Module
    """The network (for DDP-style broadcasting, train/eval modes, the behaviour copy)."""
    value_head: torch.nn.Module
    """Per-token values for Darwin's learner (issue 17)."""
    device: torch.device

    def sample(self, prompts: Sequence[str], screens: Any, temperature: float = 1.0,
               max_new_tokens: int = 128, generator_seed: int | None = None,
               constrained: bool = False, copy_text: bool = False,
               typed: Sequence[Sequence[str]] | None = None) -> list[Sample]:
        """Batched sampling: each action's text, token ids (eos included) and per-token
        log-probabilities as drawn. ``constrained``: only strings that parse
        (:mod:`~digirl_lite.policy.grammar`); ``copy_text``: typed text is a span of the
        prompt's goal (:mod:`~digirl_lite.policy.copying`; a span chooser instead of True:
        one of the spans it gives); ``typed``: with it, one per prompt, the texts the
        episode typed already, not copied again while another span is left."""

    def act(self, prompts: Sequence[str], screens: Any, temperature: float = 1.0,
            max_new_tokens: int = 128, generator_seed: int | None = None,
            constrained: bool = False, copy_text: bool = False) -> list[str]:
        """:meth:`sample`'s texts."""

    def log_prob(self, prompts: Sequence[str], screens: Any, actions: Sequence[str],
                 clamp: tuple[float, float] | None = None) -> torch.Tensor:
        """(B,) teacher-forced log-likelihood of each action string, summed over its tokens
        (eos included). Differentiable."""

    def token_log_probs_and_values(self, prompts: Sequence[str], screens: Any,
                                   actions: Sequence[str]
                                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log_probs, values, mask), each (B, T): per action token."""

    def token_ids_log_probs_and_values(self, prompts: Sequence[str], screens: Any,
                                       token_ids: Sequence[Sequence[int]]
                                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`token_log_probs_and_values` of the given token ids."""

    def action_token_ids(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
        """Each action string's token ids as the policy writes it (eos included)."""

    def parameters(self) -> Iterable[torch.nn.Parameter]:
        """The actor's trainable parameters (a LoRA policy: its adapters only)."""

    def num_parameters(self) -> int:
        ...

    def to(self, device: str | torch.device) -> Policy:
        ...

    def save(self, directory: str | Path) -> Path:
        ...


def policy_inputs(policy: Policy, screen_ids: Sequence[str], screens: ScreenTable) -> Any:
    """The screens ``screen_ids`` of ``screens`` as ``policy`` reads them: their feature rows
    (B, d) or their images (a list of B PIL images)."""
    if policy.screen_input == "features":
        return screens.features(list(screen_ids))
    images = [screens.image(i) for i in screen_ids]
    missing = [i for i, im in zip(screen_ids, images) if im is None]
    if missing:
        raise ValueError(f"{len(missing)} screens have no image (e.g. {missing[0]!r}): a "
                         "policy that reads screenshots needs them kept")
    return images


def policy_kind(directory: str | Path) -> str | None:
    """"autoui" or "vlm" for a directory a policy saved, None for anything else."""
    p = Path(directory) / POLICY_FILE
    if not p.is_file():
        return None
    return json.loads(p.read_text()).get("kind", "autoui")  # older saves: AutoUI
