"""A tiny randomly initialised Qwen2-VL for tests and smoke runs (issue 18, item 4).

Qwen2-VL is the architecture of the family researchers train phone agents with now
(Qwen2-VL, Qwen2.5-VL): a ViT over 14 x 14 patches, 2 x 2 patches merged into one image
token, and a Qwen2 decoder with multimodal rotary positions. :func:`make_tiny_vlm` writes one
with the layout ``save_pretrained`` gives a real checkpoint (``config.json``, safetensors,
tokenizer, processor with its chat template), built entirely offline:

* the tokenizer is a byte-level BPE trained here on a world's text, given as ``corpus`` (the
  simulator's: :func:`digirl_lite.envs.sim.demos.sim_corpus`, instructions, prompts, action
  strings)
  with Qwen2-VL's special tokens (``<|im_start|>``, ``<|im_end|>``, ``<|vision_start|>``,
  ``<|image_pad|>``, ...);
* the image processor is transformers' ``Qwen2VLImageProcessorPil`` (no torchvision);
* the weights are random (``seed``).

So :class:`~digirl_lite.policy.vlm.VLMPolicy` loads it exactly as it loads
Qwen/Qwen2-VL-2B-Instruct from a local directory, through the Auto classes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["TINY_VLM", "make_tiny_vlm", "CHAT_TEMPLATE", "TINY_LM", "make_tiny_chat_lm"]

TINY_VLM: dict[str, Any] = {
    # text: a 2-layer Qwen2 decoder
    "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2,
    # vision: a 2-block ViT, 14 x 14 patches, 2 x 2 merged per image token
    "vision_depth": 2, "vision_embed_dim": 32, "vision_heads": 2,
    # the byte-level BPE trained on the simulator's text (then the action format's pieces
    # and the 10,001 coordinates are added: 11,036 tokens in all)
    "vocab_size": 1024,
    # the image processor's pixel budget: the simulator's 270 x 570 screenshots resize to
    # 280 x 560 (a multiple of 28): 20 x 40 patches, 200 image tokens
    "min_pixels": 28 * 28 * 4, "max_pixels": 280 * 560,
}
"""The tiny model's sizes (about 1 M parameters, most of them the embeddings)."""

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""Qwen2-VL's chat template (the image as ``<|vision_start|><|image_pad|><|vision_end|>``,
which the processor expands to the image's tokens)."""

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
           "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def _tokenizer(vocab_size: int, corpus: Iterable[str], special: list[str] = SPECIAL,
               chat_template: str = CHAT_TEMPLATE, extra_text: tuple[str, ...] = (),
               markup: tuple[str, ...] = (), action_pieces: bool = True):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    from digirl_lite.policy.tokenizer import ACTION_PIECES, COORD_PIECES

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(list(corpus) + list(extra_text), trainer=trainer)
    # markup (Qwen3's <tool_call>, <think>, ...): one token each but not special, as in
    # Qwen3's own tokenizer, so decoding keeps it and TRL's parser finds the tool calls
    tok.add_tokens([AddedToken(p, normalized=False, special=False) for p in markup])
    # the action format's pieces and every 4-decimal coordinate as one token each, as in
    # the Auto-UI preset's tokenizer: a tap is then ~13 tokens to write, not ~56
    if action_pieces:  # (a tool-calling model writes no coordinates: 10k fewer logits)
        tok.add_tokens([AddedToken(p, normalized=False) for p in ACTION_PIECES + COORD_PIECES])
    return Qwen2TokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                              pad_token="<|endoftext|>", unk_token=None,
                              additional_special_tokens=special[1:], chat_template=chat_template)


TINY_LM: dict[str, Any] = {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
                           "num_attention_heads": 4, "num_key_value_heads": 2,
                           "vocab_size": 1024}
"""The tiny text model's sizes (:func:`make_tiny_chat_lm`)."""

QWEN3_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN3_MARKUP = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
                "</think>")
"""Qwen3's added tokens that are not special (decoding keeps them: TRL parses tool calls
from the decoded reply)."""


def make_tiny_chat_lm(out: str | Path, seed: int = 0, *, corpus: Iterable[str],
                      **overrides: Any) -> Path:
    """Write a tiny random Qwen3 causal LM (:data:`TINY_LM`, with ``overrides``) whose
    tokenizer carries Qwen3's chat template with tool calling (TRL's copy of it,
    ``trl.chat_template_utils.qwen3_chat_template``, so TRL's GRPOTrainer parses its tool
    calls as it does Qwen3's) into ``out``; returns the directory. Offline and deterministic
    in ``seed``: the model TRL recipes and tests run at tiny size (it writes noise; the point
    is the plumbing). ``corpus``: the lines its tokenizer is trained on (the simulator's:
    ``sim_corpus(seed=seed, n_demos=20)`` of :mod:`digirl_lite.envs.sim.demos`)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    try:
        from trl.chat_template_utils import qwen3_chat_template
    except ImportError as e:
        raise ImportError("make_tiny_chat_lm takes Qwen3's chat template from TRL: pip install "
                          "'digirl-lite[trl]'") from e
    s = {**TINY_LM, **overrides}
    unknown = set(overrides) - set(TINY_LM)
    if unknown:
        raise ValueError(f"unknown tiny LM sizes {sorted(unknown)} (known: {sorted(TINY_LM)})")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(s["vocab_size"], corpus, QWEN3_SPECIAL, qwen3_chat_template,
                     extra_text=(qwen3_chat_template,), markup=QWEN3_MARKUP,
                     action_pieces=False)
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN3_SPECIAL}
    config = Qwen3Config(vocab_size=len(tok), hidden_size=s["hidden_size"],
                         intermediate_size=s["intermediate_size"],
                         num_hidden_layers=s["num_hidden_layers"],
                         num_attention_heads=s["num_attention_heads"],
                         num_key_value_heads=s["num_key_value_heads"],
                         head_dim=s["hidden_size"] // s["num_attention_heads"],
                         max_position_embeddings=8192, bos_token_id=ids["<|endoftext|>"],
                         eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                         tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    (out / "tiny_lm.json").write_text(json.dumps({"made_by": "digirl_lite make_tiny_chat_lm",
                                                 "seed": seed, **s}, indent=1))
    return out


def make_tiny_vlm(out: str | Path, seed: int = 0, *, corpus: Iterable[str],
                  **overrides: Any) -> Path:
    """Write a tiny random Qwen2-VL (:data:`TINY_VLM`, with ``overrides``) with its tokenizer
    and processor into ``out``; returns the directory. Offline and deterministic in
    ``seed`` and ``corpus`` (the lines its tokenizer is trained on; the simulator's:
    ``sim_corpus(seed=seed, n_demos=20)`` of :mod:`digirl_lite.envs.sim.demos`), a few
    seconds."""
    import torch
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessorPil,
    )

    s = {**TINY_VLM, **overrides}
    unknown = set(overrides) - set(TINY_VLM)
    if unknown:
        raise ValueError(f"unknown tiny VLM sizes {sorted(unknown)} (known: {sorted(TINY_VLM)})")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(s["vocab_size"], corpus)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL}
    head_dim = s["hidden_size"] // s["num_attention_heads"]
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tok), "hidden_size": s["hidden_size"],
            "intermediate_size": s["intermediate_size"],
            "num_hidden_layers": s["num_hidden_layers"],
            "num_attention_heads": s["num_attention_heads"],
            "num_key_value_heads": s["num_key_value_heads"],
            "max_position_embeddings": 4096, "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
            # the multimodal rotary sections (temporal, height, width) cover head_dim / 2
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "mrope_section": _mrope_section(head_dim)},
        },
        vision_config={"depth": s["vision_depth"], "embed_dim": s["vision_embed_dim"],
                       "hidden_size": s["hidden_size"], "num_heads": s["vision_heads"],
                       "mlp_ratio": 2, "patch_size": 14, "spatial_merge_size": 2,
                       "temporal_patch_size": 2},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.generation_config.bos_token_id = ids["<|endoftext|>"]
    model.generation_config.do_sample = False
    model.save_pretrained(str(out))
    # the processor's parts, as a real checkpoint ships them (transformers' Qwen2VLProcessor
    # object itself needs torchvision for its video half: VLMPolicy builds the same inputs
    # from these two when it cannot load it)
    tok.save_pretrained(str(out))
    Qwen2VLImageProcessorPil(min_pixels=s["min_pixels"], max_pixels=s["max_pixels"],
                             ).save_pretrained(str(out))
    (out / "tiny_vlm.json").write_text(json.dumps({"made_by": "digirl_lite make_tiny_vlm",
                                                   "seed": seed, **s}, indent=1))
    return out


def _mrope_section(head_dim: int) -> list[int]:
    """Qwen2-VL splits each head's rotary frequencies (head_dim / 2) between time, height
    and width as 16 : 24 : 24 at head_dim 128; the same proportions here."""
    half = head_dim // 2
    t = max(1, round(half * 16 / 64))
    h = (half - t) // 2
    return [t, h, half - t - h]
