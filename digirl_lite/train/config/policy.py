"""The policy: Auto-UI's T5 or a VLM, its inputs, and how it samples actions.

Where a default is this project's choice, ``docs/config.md`` says why and what it measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from digirl_lite.errors import ConfigError

__all__ = ["PolicyConfig"]


@dataclass
class PolicyConfig:
    """The agent, what it reads, and how it samples (in the pile, collection, evaluation)."""

    policy: str = "autoui"
    """"autoui" (Auto-UI's T5 on a frozen encoder's image features) or "vlm" (a Hugging Face
    image-text-to-text model at ``policy_path``, with LoRA: :mod:`digirl_lite.policy.vlm`)."""
    policy_path: str | None = None
    """policy "vlm": the base model's local directory (a Qwen2-VL / Qwen2.5-VL / ...
    checkpoint, or what recipes/make_tiny_vlm.py writes). Nothing is downloaded."""
    lora: dict[str, Any] = field(default_factory=lambda: {
        "r": 8, "alpha": 16, "dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]})
    """policy "vlm": LoRA adapters (peft) on these modules, the only weights that train;
    ``r`` 0: full fine-tuning instead (every weight trains)."""
    vlm_image_size: list[int] = field(default_factory=lambda: [270, 570])
    """policy "vlm": (width, height) every screenshot is resized to before the model's own
    image processor (a quarter of the phone's 1080 x 2280)."""
    vlm_dtype: str = "fp32"
    """policy "vlm": the weights' precision, "fp32" or "bf16" (on a GPU)."""
    gradient_checkpointing: bool = False
    """policy "vlm": recompute activations in the backward pass (less memory, ~30% slower)."""
    image_encoder: str = "sim"
    """"sim" (the simulator's frozen layout encoder) or a local BLIP-2 directory."""
    goal_features: str = "none"
    """policy "autoui": "minilm" adds frozen all-MiniLM-L6-v2 features to each goal token
    (:mod:`~digirl_lite.policy.goal_features`); changes the policy's shape."""
    goal_token_dropout: float = 0.0
    """With ``goal_features``: the chance, at every training update, that a goal token's own
    embedding is dropped for the features alone there; 1: always, when acting too."""
    goal_unseen_words: str = "embeddings"
    """With ``goal_features``: "features" reads a goal word no train text held through the
    features alone, its tokens' embeddings dropped; "embeddings": every word as trained."""
    token_embeddings: str = "trained"
    """policy "autoui": "trained" (T5's own) or "minilm" (a frozen table of all-MiniLM-L6-v2's
    input embeddings); changes the policy's shape."""
    temperature: float = 1.0
    """Sampling temperature for collection and evaluation (paper: 1.0)."""
    max_new_tokens: int = 64
    """Cap on an action's tokens (paper: 128; the preset's actions take <= 40)."""
    constrained_decoding: bool = False
    """Sample only action strings that parse (:mod:`digirl_lite.policy.grammar`); the actor
    still trains on the unconstrained likelihood. Off in the paper."""
    copy_typed_text: bool = False
    """A TYPE action's text is a span of the instruction (:mod:`digirl_lite.policy.copying`);
    the actor still trains on the unmasked likelihood."""
    typed_span_extractor: str = "none"
    """With ``copy_typed_text``: "minilm" narrows the spans a TYPE may copy to a trained span
    extractor's best (:mod:`digirl_lite.policy.span_extractor`); "none": any span."""
    typed_span_phrasings: str | None = None
    """The train phrasing set the span extractor's data is written with (``train_phrasings``'
    names); None: as the starting policy's."""
    typed_span_once: bool = False
    """With ``copy_typed_text``: a TYPE does not copy a text its episode typed already while
    the mask leaves another span."""


def check(cfg: Any) -> None:
    """The policy's fields of ``cfg`` (a :class:`~digirl_lite.train.config.DigiRLConfig`)."""
    if cfg.policy not in ("autoui", "vlm"):
        raise ConfigError(f"policy must be 'autoui' or 'vlm', got {cfg.policy!r}")
    if cfg.token_embeddings != "trained":
        from digirl_lite.policy.policy import TOKEN_EMBEDDINGS

        if cfg.token_embeddings not in TOKEN_EMBEDDINGS:
            raise ConfigError(f"token_embeddings must be one of "
                              f"{', '.join(TOKEN_EMBEDDINGS)}, got {cfg.token_embeddings!r}")
        if cfg.policy != "autoui":
            raise ConfigError(f"token_embeddings: the table is the Auto-UI policy's; "
                              f"policy {cfg.policy!r} has its pretrained model's own (set "
                              "token_embeddings 'trained')")
        if cfg.starting_policy == "shipped":
            raise ConfigError("token_embeddings: the shipped starting policies have trained "
                              "token embeddings; set starting_policy 'sft' (built and cached "
                              "with the table) or a directory saved with it")
    _check_copying(cfg)
    _check_goal_features(cfg)
    if cfg.policy == "autoui":
        if cfg.policy_path is not None:
            raise ConfigError("policy_path is the base model of policy 'vlm'; policy "
                              "'autoui' loads a checkpoint from starting_policy")
        return
    if len(cfg.vlm_image_size) != 2 or min(cfg.vlm_image_size) < 28:
        raise ConfigError(f"vlm_image_size must be [width, height], each >= 28, got "
                          f"{cfg.vlm_image_size}")
    if cfg.vlm_dtype not in ("fp32", "bf16"):
        raise ConfigError(f"vlm_dtype must be 'fp32' or 'bf16', got {cfg.vlm_dtype!r}")
    if cfg.vlm_dtype == "bf16" and cfg.device == "cpu":
        raise ConfigError("vlm_dtype 'bf16' is for a GPU (device 'cuda'); on a CPU use "
                          "'fp32'")
    unknown = set(cfg.lora) - {"r", "alpha", "dropout", "target_modules"}
    if unknown or not isinstance(cfg.lora.get("r", 0), int) or cfg.lora.get("r", 0) < 0:
        raise ConfigError(f"lora must hold r (an int >= 0; 0: full fine-tuning), alpha, "
                          f"dropout and target_modules, got {cfg.lora}")


def _check_copying(cfg: Any) -> None:
    """The copy mask's fields: the span extractor and its phrasings, typing once."""
    if cfg.typed_span_extractor != "none":
        if cfg.typed_span_extractor != "minilm":
            raise ConfigError(f"typed_span_extractor must be 'none' or 'minilm', got "
                              f"{cfg.typed_span_extractor!r}")
        if not cfg.copy_typed_text:
            raise ConfigError("typed_span_extractor narrows the copy mask's spans: set "
                              "copy_typed_text true (or it to 'none')")
    if cfg.typed_span_once and not cfg.copy_typed_text:
        raise ConfigError("typed_span_once applies to the copy mask: set copy_typed_text "
                          "true (or it false)")
    if cfg.typed_span_phrasings is not None:
        from digirl_lite.envs.setup import sim_options

        phrasing_sets = sim_options().phrasing_sets
        if cfg.typed_span_extractor == "none":
            raise ConfigError("typed_span_phrasings: there is no span extractor to train "
                              "(set typed_span_extractor 'minilm', or it to null)")
        if cfg.typed_span_phrasings not in phrasing_sets:
            raise ConfigError(f"typed_span_phrasings must be one of "
                              f"{', '.join(phrasing_sets)} (or null), got "
                              f"{cfg.typed_span_phrasings!r}")


GOAL_UNSEEN_WORDS = ("embeddings", "features")
"""What ``goal_unseen_words`` may name."""


def _check_goal_features(cfg: Any) -> None:
    """``goal_features``, ``goal_token_dropout`` and ``goal_unseen_words``."""
    if cfg.goal_features != "none":
        from digirl_lite.policy.goal_features import GOAL_ENCODERS

        if cfg.goal_features not in GOAL_ENCODERS:
            raise ConfigError(f"goal_features must be 'none' or one of "
                              f"{', '.join(GOAL_ENCODERS)}, got {cfg.goal_features!r}")
        if cfg.policy != "autoui":
            raise ConfigError(f"goal_features: the goal features are the Auto-UI "
                              f"policy's; policy {cfg.policy!r} reads its prompt with "
                              "its own pretrained model (set goal_features 'none')")
        if not 0.0 <= cfg.goal_token_dropout <= 1.0:
            raise ConfigError(f"goal_token_dropout must be in [0, 1], got "
                              f"{cfg.goal_token_dropout}")
        if cfg.starting_policy == "shipped":
            raise ConfigError("goal_features: the shipped starting policies read no goal "
                              "features; set starting_policy 'sft' (built and cached with "
                              "them) or a directory saved with them")
    elif cfg.goal_token_dropout:
        raise ConfigError("goal_token_dropout drops goal tokens' embeddings in favour of "
                          "the goal features: set goal_features 'minilm' (or it to 0)")
    if cfg.goal_unseen_words not in GOAL_UNSEEN_WORDS:
        raise ConfigError(f"goal_unseen_words must be one of {', '.join(GOAL_UNSEEN_WORDS)}, "
                          f"got {cfg.goal_unseen_words!r}")
    if cfg.goal_unseen_words == "features" and cfg.goal_features == "none":
        raise ConfigError("goal_unseen_words 'features' reads unseen goal words through the "
                          "goal features: set goal_features 'minilm' (or it to 'embeddings')")
    if cfg.goal_unseen_words == "features" and cfg.goal_token_dropout >= 1.0:
        raise ConfigError("goal_unseen_words 'features' changes nothing at goal_token_dropout "
                          "1 (every goal word is read through the features): set it to "
                          "'embeddings'")
