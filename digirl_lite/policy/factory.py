"""The policy a config asks for (issue 18): the one place that names the implementations.

* :func:`initial_policy`: what a run starts with, before its starting policy is built:
  ``starting_policy`` a directory is loaded here (a saved policy of the config's kind, or a
  real Auto-UI checkpoint); "sft" / "shipped" give the right shape, replaced in
  :meth:`~digirl_lite.train.trainer.Trainer.build_starting_policy` (Auto-UI), or the base
  VLM at ``policy_path`` with fresh adapters (policy "vlm").
* :func:`fresh_policy`: what supervised fine-tuning starts from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from digirl_lite.errors import ConfigError
from digirl_lite.policy.base import POLICY_FILE, Policy, policy_kind

__all__ = ["initial_policy", "fresh_policy", "load_kwargs", "load_policy",
           "check_goal_words"]


def load_policy(directory: str | Path, device: str = "cpu", **kw: Any) -> Policy:
    """Open a policy saved by either implementation's ``save`` (``kw``: the VLM's ``base``
    when its base model has moved, ``dtype``, ``gradient_checkpointing``)."""
    kind = policy_kind(directory)
    if kind == "vlm":
        from digirl_lite.policy.vlm import VLMPolicy

        return VLMPolicy.load(directory, device=device, **kw)
    if kind == "autoui":
        from digirl_lite.policy.policy import AutoUIPolicy

        if kw:
            raise ValueError(f"{directory} holds an Auto-UI policy: {sorted(kw)} are the "
                             "VLM's")
        return AutoUIPolicy.load(directory, device=device)
    raise ValueError(f"{directory} holds no saved policy (no {POLICY_FILE})")


def load_kwargs(c: Any) -> dict[str, Any]:
    """What :func:`load_policy` needs from the config to open a
    saved policy of this run as the run builds it (a VLM: its base, precision and gradient
    checkpointing; nothing for Auto-UI)."""
    if c.policy != "vlm":
        return {}
    return {"base": c.policy_path, "dtype": c.vlm_dtype,
            "gradient_checkpointing": c.gradient_checkpointing}


def fresh_policy(c: Any) -> Policy:
    """The simulator preset's fresh T5 (seed ``sft_seed``), or the VLM at ``policy_path`` with
    fresh adapters (initialised from ``sft_seed``: every run seed shares them, as it shares
    the starting policy)."""
    if c.policy == "vlm":
        from digirl_lite.policy.vlm import VLMPolicy

        return VLMPolicy.from_pretrained(
            c.policy_path, lora=c.lora, image_size=c.vlm_image_size, dtype=c.vlm_dtype,
            gradient_checkpointing=c.gradient_checkpointing, seed=c.sft_seed)
    from digirl_lite.policy.policy import AutoUIPolicy

    return AutoUIPolicy.sim_preset(seed=c.sft_seed, goal_features=c.goal_features,
                                   goal_token_dropout=c.goal_token_dropout,
                                   token_embeddings=c.token_embeddings)


def check_goal_words(policy: Any, c: Any, what: str) -> None:
    """A policy that reads unseen goal words through the goal features (its saved known
    words) under a config whose ``goal_unseen_words`` is not "features" is a ConfigError
    naming ``what``."""
    if getattr(policy, "known_goal_words", None) is not None and \
            c.goal_unseen_words != "features":
        raise ConfigError(f"{what} reads goal words no train text held through the goal "
                          f"features alone, but goal_unseen_words is "
                          f"{c.goal_unseen_words!r}: set it to 'features'")


def initial_policy(c: Any) -> Policy:
    """See the module's docstring. A directory that is not what the config says is a
    ConfigError naming what it holds."""
    from digirl_lite.policy.policy import AutoUIPolicy

    src = c.starting_policy
    d = Path(src).expanduser() if src not in ("sft", "shipped") else None
    found = policy_kind(d) if d is not None else None
    if c.policy == "vlm":
        from digirl_lite.policy.vlm import VLMPolicy

        if d is None:
            return fresh_policy(c)
        if found != "vlm":
            what = f"an {found} policy" if found else "no saved policy"
            raise ConfigError(f"starting_policy {str(d)!r} holds {what}; policy 'vlm' starts "
                              "from a saved VLM policy (or 'sft', 'shipped': the model at "
                              "policy_path)")
        try:
            return VLMPolicy.load(d, **load_kwargs(c))
        except (OSError, ValueError) as e:
            raise ConfigError(f"starting_policy {str(d)!r}: {e}") from None
    if d is None:
        return AutoUIPolicy.sim_preset(seed=c.seed, goal_features=c.goal_features,
                                       goal_token_dropout=c.goal_token_dropout,
                                       token_embeddings=c.token_embeddings)
    if found == "vlm":
        raise ConfigError(f"starting_policy {str(d)!r} holds a saved VLM policy: set policy "
                          "'vlm' (and policy_path its base model)")
    try:
        policy = (AutoUIPolicy.load(d) if (d / POLICY_FILE).is_file()
                  else AutoUIPolicy.from_pretrained(d))
    except (OSError, ValueError) as e:
        raise ConfigError(f"starting_policy {str(d)!r}: {e}") from None
    has = policy.goal_features.name if policy.goal_features is not None else "none"
    if has != c.goal_features:
        raise ConfigError(f"starting_policy {str(d)!r} reads goal features {has!r}, but "
                          f"goal_features is {c.goal_features!r}: set it to {has!r}")
    check_goal_words(policy, c, f"starting_policy {str(d)!r}")
    has = getattr(policy.model.config, "token_embeddings", None) or "trained"
    if has != c.token_embeddings:
        raise ConfigError(f"starting_policy {str(d)!r} has token embeddings {has!r}, but "
                          f"token_embeddings is {c.token_embeddings!r}: set it to {has!r}")
    return policy
