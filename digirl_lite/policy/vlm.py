"""``VLMPolicy``: any local Hugging Face image-text-to-text model as the agent (issue 18).

The model is loaded with transformers' Auto classes (``AutoModelForImageTextToText``) from a
local directory, and reads the screenshot with its own vision tower and image processor (no
separate feature extractor). Each step's prompt (``Previous Actions: ... Goal: ...``) goes in
the model's chat template as the user's turn, after the image and under a short system
prompt that states the action format; the reply is an AutoUI action string that
:func:`~digirl_lite.actions.parse_action` reads (malformed replies become INVALID steps, as
for Auto-UI), ended by the tokenizer's end-of-sequence token (``<|im_end|>`` for Qwen-VL).

Training is LoRA through ``peft`` by default (rank, alpha, target modules from the config;
the adapters are what ``save`` writes, beside the path of the base model), or full
fine-tuning with rank 0. A linear value head on the last hidden state gives Darwin's learner
its per-token values. Grammar-constrained decoding works as for Auto-UI
(:mod:`digirl_lite.policy.grammar`).

Log-probabilities are computed in one forward over prompt + action (teacher forcing), the
action's logits only (``logits_to_keep``), so a 150k-word vocabulary costs B x T x V, not
B x (P + T) x V.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from digirl_lite.errors import ConfigError
from digirl_lite.policy.base import POLICY_FILE, Sample
from digirl_lite.policy.tokenizer import HFTokenizer
from digirl_lite.policy.value_head import ValueHead

__all__ = ["VLMPolicy", "SYSTEM_PROMPT", "DEFAULT_LORA", "check_vlm_dir"]

log = logging.getLogger(__name__)

SYSTEM_PROMPT = ('Operate the phone. Reply with one action: Action Decision: "action_type": '
                 '"<TYPE>", "touch_point": "[y, x]", "lift_point": "[y, x]", "typed_text": '
                 '"<text>"')
"""The system turn: the action format, short (its tokens are in every forward)."""

DEFAULT_LORA: dict[str, Any] = {"r": 8, "alpha": 16, "dropout": 0.0,
                                "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
"""LoRA on the language model's attention projections (rank 8, alpha 16: the usual
starting point of LoRA fine-tuning recipes; Qwen-VL's vision tower names its projections
``qkv`` / ``proj``, so it stays frozen). ``r`` 0: full fine-tuning instead."""

_ADAPTER_DIR = "adapter"
_MODEL_DIR = "model"
_VALUE_FILE = "value_head.safetensors"
_QWEN_VL = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def check_vlm_dir(path: str | Path, field: str = "policy_path") -> dict[str, Any]:
    """The ``config.json`` of a local image-text-to-text checkpoint, else a ConfigError
    naming ``field`` and what the directory holds."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    d = Path(path).expanduser()
    if (d / POLICY_FILE).is_file():
        kind = json.loads((d / POLICY_FILE).read_text()).get("kind", "autoui")
        raise ConfigError(f"{field} {str(d)!r} holds a saved digirl_lite {kind} policy, not a "
                          "base model: pass it as starting_policy (a saved VLM policy) "
                          "with policy_path its base model")
    if not (d / "config.json").is_file():
        raise ConfigError(f"{field} {str(d)!r}: no config.json (not a Hugging Face "
                          "checkpoint directory)")
    try:
        config = AutoConfig.from_pretrained(str(d))
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"{field} {str(d)!r}: {e}") from None
    mt = getattr(config, "model_type", None)
    if mt not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        arch = ", ".join(getattr(config, "architectures", None) or []) or "no architecture"
        hint = (" (an Auto-UI/T5 checkpoint: policy 'autoui' with starting_policy this "
                "directory)" if mt == "t5" else "")
        raise ConfigError(f"{field} {str(d)!r} holds a {mt!r} model ({arch}), not an "
                          f"image-text-to-text model that policy 'vlm' can load{hint}")
    return config.to_dict()


class _Inputs:
    """The model's processor, or (where transformers' processor object cannot be built:
    Qwen-VL's needs torchvision for its video half) the same inputs from its tokenizer and
    image processor: the chat template's one ``<|image_pad|>`` per image expanded to the
    image's merged patches, as ``Qwen2VLProcessor`` does."""

    def __init__(self, directory: Path, model_type: str) -> None:
        import threading

        from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

        # a fast tokenizer rewrites its padding settings on every call: the learner and the
        # async learner's collecting thread (which share these inputs) take turns
        self.lock = threading.Lock()
        self.processor = None
        try:
            self.processor = AutoProcessor.from_pretrained(str(directory))
            self.tokenizer = self.processor.tokenizer
        except (ImportError, OSError, ValueError, AttributeError) as e:
            if model_type not in _QWEN_VL:
                raise ConfigError(f"policy_path {str(directory)!r}: its processor cannot be "
                                  f"loaded here ({type(e).__name__}: {e})") from None
            self.tokenizer = AutoTokenizer.from_pretrained(str(directory))
            self.image_processor = AutoImageProcessor.from_pretrained(str(directory))
            self.merge = int(getattr(self.image_processor, "merge_size", 2))
            log.info("%s: inputs built from its tokenizer and image processor (%s)",
                     directory, e)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    def __call__(self, texts: list[str], images: list[Any]) -> dict[str, torch.Tensor]:
        with self.lock:
            return self._call(texts, images)

    def chat(self, messages: list[dict[str, Any]]) -> str:
        """The prompt text of ``messages`` by the processor's chat template (which places
        the image), else the tokenizer's."""
        with self.lock:
            owner = self.processor if self.processor is not None and \
                getattr(self.processor, "chat_template", None) else self.tokenizer
            return owner.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=True)

    def encode_actions(self, texts: list[str]) -> list[list[int]]:
        with self.lock:
            return [list(r) for r in self.tokenizer(texts, add_special_tokens=False,
                                                    padding=False)["input_ids"]]

    def decode(self, ids: list[int]) -> str:
        with self.lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _call(self, texts: list[str], images: list[Any]) -> dict[str, torch.Tensor]:
        if self.processor is not None:
            return dict(self.processor(text=texts, images=images, return_tensors="pt",
                                       padding=True))
        img = self.image_processor(images=images, return_tensors="pt")
        grid = img["image_grid_thw"]
        out, k = [], 0
        for t in texts:
            parts = t.split("<|image_pad|>")
            pieces = [parts[0]]
            for rest in parts[1:]:
                n = int(grid[k].prod()) // (self.merge ** 2)
                pieces.append("<|image_pad|>" * n + rest)
                k += 1
            out.append("".join(pieces))
        enc = self.tokenizer(out, return_tensors="pt", padding=True)
        image_id = self.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        # the modality of each token (0 text, 1 image), which multimodal RoPE reads
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                "mm_token_type_ids": (enc["input_ids"] == image_id).long(),
                **{k: v for k, v in img.items()}}

    def save(self, directory: Path) -> None:
        if self.processor is not None:
            self.processor.save_pretrained(str(directory))
        else:
            self.tokenizer.save_pretrained(str(directory))
            self.image_processor.save_pretrained(str(directory))


class VLMPolicy:
    """A vision-language model behind the :class:`~digirl_lite.policy.base.Policy` calls.

    Build it with :meth:`from_pretrained` (a base checkpoint directory) or :meth:`load`
    (what :meth:`save` wrote).

    Args:
        model: the transformers model (a peft model when LoRA is on).
        inputs: its processor.
        base: the base checkpoint's directory (saved with the adapters).
        lora: the LoRA settings in force (None: full fine-tuning).
        image_size: (width, height) every screenshot is resized to before the processor.
    """

    screen_input = "images"
    bucket_rows: int = 8
    """Rows per forward in :meth:`log_prob` (memory: image tokens are most of a row)."""

    def __init__(self, model, inputs: _Inputs, *, base: str | Path,
                 lora: dict[str, Any] | None, image_size: Sequence[int] = (270, 570),
                 system_prompt: str = SYSTEM_PROMPT, device: str | torch.device = "cpu",
                 value_head: ValueHead | None = None) -> None:
        self.model = model.to(device)
        self.inputs = inputs
        self.tokenizer = HFTokenizer(inputs.tokenizer)  # the grammar's view of it
        inputs.tokenizer.padding_side = "left"  # HFTokenizer set "right"
        self.base = str(base)
        self.lora = dict(lora) if lora else None
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.system_prompt = system_prompt
        self.device = torch.device(device)
        hidden = _text_config(self.model.config)["hidden_size"]
        self.value_head_fresh = value_head is None
        self.value_head = (value_head or ValueHead(hidden)).to(device)
        self.eos_token_id = int(inputs.tokenizer.eos_token_id)
        self.pad_token_id = int(inputs.tokenizer.pad_token_id)

    # -- building -----------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, directory: str | Path, *, lora: dict[str, Any] | None = None,
                        image_size: Sequence[int] = (270, 570), device: str = "cpu",
                        dtype: str = "fp32", gradient_checkpointing: bool = False,
                        seed: int = 0, system_prompt: str = SYSTEM_PROMPT) -> VLMPolicy:
        """The base checkpoint in ``directory`` (nothing is downloaded) with fresh LoRA
        adapters (``lora``; None: :data:`DEFAULT_LORA`; ``{"r": 0}``: every weight
        trains), initialised from ``seed``."""
        from transformers import AutoModelForImageTextToText

        d = Path(directory).expanduser().resolve()
        config = check_vlm_dir(d)
        model = AutoModelForImageTextToText.from_pretrained(str(d), dtype=_DTYPES[dtype],
                                                            local_files_only=True)
        inputs = _Inputs(d, config["model_type"])
        lora = dict(DEFAULT_LORA if lora is None else {**DEFAULT_LORA, **lora})
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = _with_lora(model, lora)
        _checkpointing(model, gradient_checkpointing)
        return cls(model, inputs, base=d, lora=lora if lora["r"] else None,
                   image_size=image_size, system_prompt=system_prompt, device=device)

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu",
             base: str | Path | None = None, dtype: str | None = None,
             gradient_checkpointing: bool = False) -> VLMPolicy:
        """What :meth:`save` wrote: the base model (``base``, else the path it was saved
        with) and the adapters, or the full weights of a fully fine-tuned or merged one; in
        ``dtype`` ("fp32" / "bf16"; None: the one it was saved in)."""
        from safetensors.torch import load_file
        from transformers import AutoModelForImageTextToText

        d = Path(directory)
        meta = json.loads((d / POLICY_FILE).read_text())
        if meta.get("kind") != "vlm":
            raise ValueError(f"{d} holds a {meta.get('kind', 'autoui')!r} policy, not a VLM")
        torch_dtype = _DTYPES[dtype or meta.get("dtype", "fp32")]
        if meta["lora"]:
            from peft import PeftModel

            b = Path(base or meta["base"]).expanduser().resolve()
            config = check_vlm_dir(b, "the VLM policy's base model")
            model = AutoModelForImageTextToText.from_pretrained(str(b), dtype=torch_dtype,
                                                                local_files_only=True)
            model = PeftModel.from_pretrained(model, str(d / _ADAPTER_DIR), is_trainable=True)
        else:
            b = d / _MODEL_DIR
            config = check_vlm_dir(b, "the VLM policy's weights")
            model = AutoModelForImageTextToText.from_pretrained(str(b), dtype=torch_dtype,
                                                                local_files_only=True)
        _checkpointing(model, gradient_checkpointing)
        inputs = _Inputs(b, config["model_type"])
        hidden = _text_config(model.config)["hidden_size"]
        head = ValueHead(hidden)
        state = load_file(str(d / _VALUE_FILE))
        head.load_state_dict({k.removeprefix("value_head."): v for k, v in state.items()})
        p = cls(model, inputs, base=b, lora=meta["lora"],
                image_size=meta["image_size"], system_prompt=meta["system_prompt"],
                device=device, value_head=head)
        p.value_head_fresh = False
        return p

    def save(self, directory: str | Path) -> Path:
        """The adapters (peft's ``save_pretrained``, on their own) and the base model's path;
        with full fine-tuning the whole model and its processor. The value head beside."""
        from safetensors.torch import save_file

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        if self.lora:
            self.model.save_pretrained(str(d / _ADAPTER_DIR))
        else:
            self.model.save_pretrained(str(d / _MODEL_DIR))
            self.inputs.save(d / _MODEL_DIR)
        save_file({f"value_head.{k}": v.detach().contiguous()
                   for k, v in self.value_head.state_dict().items()}, str(d / _VALUE_FILE))
        (d / POLICY_FILE).write_text(json.dumps({
            "kind": "vlm", "base": self.base, "lora": self.lora,
            "dtype": {v: k for k, v in _DTYPES.items()}[next(self.model.parameters()).dtype],
            "image_size": list(self.image_size), "system_prompt": self.system_prompt,
            "value_head": True}, indent=1))
        return d

    def merge_and_save(self, directory: str | Path) -> Path:
        """The base model with the adapters merged into its weights, saved with its
        processor as a plain checkpoint (loadable as ``policy_path``, or by anything that
        reads Hugging Face checkpoints). The policy itself keeps its adapters."""
        import copy

        d = Path(directory)
        model = copy.deepcopy(self.model)
        if self.lora:
            model = model.merge_and_unload()
        model.save_pretrained(str(d))
        self.inputs.save(d)
        return d

    def to(self, device: str | torch.device) -> VLMPolicy:
        self.device = torch.device(device)
        self.model.to(self.device)
        self.value_head.to(self.device)
        return self

    def parameters(self):
        """The trainable parameters: the LoRA adapters (every weight with rank 0)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    # -- inputs ---------------------------------------------------------------------------
    def _texts(self, prompts: Sequence[str]) -> list[str]:
        return [self.inputs.chat(
            [{"role": "system", "content": [{"type": "text", "text": self.system_prompt}]},
             {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": p}]}])
            for p in prompts]

    def _images(self, screens: Any) -> list[Any]:
        from PIL import Image

        out = []
        for im in screens:
            if not isinstance(im, Image.Image):
                import numpy as np

                im = Image.fromarray(np.asarray(im, dtype=np.uint8))
            im = im.convert("RGB")
            if im.size != self.image_size:
                im = im.resize(self.image_size, Image.BILINEAR)
            out.append(im)
        return out

    def _encode(self, prompts: Sequence[str], screens: Any) -> dict[str, torch.Tensor]:
        images = self._images(screens)
        if len(images) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(images)} screenshots")
        enc = self.inputs(self._texts(prompts), images)
        dtype = next(self.model.parameters()).dtype
        return {k: (v.to(self.device, dtype) if v.is_floating_point() else v.to(self.device))
                for k, v in enc.items()}

    # -- inference ----------------------------------------------------------------------
    @torch.no_grad()
    def act(self, prompts: Sequence[str], screens: Any, temperature: float = 1.0,
            max_new_tokens: int = 128, generator_seed: int | None = None,
            constrained: bool = False, copy_text: bool = False) -> list[str]:
        return [s.text for s in self.sample(prompts, screens, temperature, max_new_tokens,
                                            generator_seed, constrained, copy_text=copy_text)]

    @torch.no_grad()
    def sample(self, prompts: Sequence[str], screens: Any, temperature: float = 1.0,
               max_new_tokens: int = 128, generator_seed: int | None = None,
               constrained: bool = False, copy_text: bool = False,
               typed: Sequence[Sequence[str]] | None = None) -> list[Sample]:
        """One reply per prompt (temperature 0: greedy), with its token ids (eos included)
        and their log-probabilities as drawn; ``typed`` as in
        :meth:`~digirl_lite.policy.policy.AutoUIPolicy.sample`."""
        from transformers import GenerationConfig, LogitsProcessorList

        if len(prompts) == 0:
            return []
        was_training = self.model.training
        self.model.eval()
        enc = self._encode(prompts, screens)
        plen = enc["input_ids"].shape[1]
        processors: list[Any] = []
        sampler = None
        if constrained:
            from digirl_lite.policy.grammar import action_logits_processor

            processors.append(action_logits_processor(self.tokenizer, max_new_tokens,
                                                      prompt_length=plen))
        if copy_text:
            from digirl_lite.policy.copying import copy_logits_processor

            processors.append(copy_logits_processor(
                self.tokenizer, prompts, prompt_length=plen,
                spans=None if copy_text is True else copy_text, typed=typed))
        if temperature > 0:
            from digirl_lite.policy.sampling import CategoricalSampler

            sampler = CategoricalSampler(temperature)
            processors.append(sampler)
        state = None
        if generator_seed is not None:
            state = torch.random.get_rng_state()
            torch.manual_seed(generator_seed)
        # a clean generation config in place of the checkpoint's own for the call: its
        # repetition_penalty, suppressed tokens, ... would reshape the distribution before
        # the sampler (transformers fills every field a passed config leaves unset from the
        # model's), so the recorded log-probabilities would not be those log_prob scores
        owner = self.model.get_base_model() if hasattr(self.model, "get_base_model") \
            else self.model
        saved = owner.generation_config
        owner.generation_config = GenerationConfig(eos_token_id=self.eos_token_id,
                                                   pad_token_id=self.pad_token_id)
        try:
            out = self.model.generate(
                **enc, max_new_tokens=max_new_tokens, do_sample=False,
                logits_processor=LogitsProcessorList(processors) if processors else None)
        finally:
            owner.generation_config = saved
            if state is not None:
                torch.random.set_rng_state(state)
            self.model.train(was_training)
        gen = out[:, plen:].cpu()
        logp = torch.stack(sampler.log_probs, 1).cpu() if sampler and sampler.log_probs else None
        samples = []
        for b in range(len(prompts)):
            row = gen[b].tolist()
            n = row.index(self.eos_token_id) + 1 if self.eos_token_id in row else len(row)
            ids = row[:n]
            text = self.inputs.decode(ids).strip("\n")
            lp = tuple(float(x) for x in logp[b, :n]) if logp is not None else None
            samples.append(Sample(text, tuple(ids), lp))
        return samples

    def log_prob(self, prompts: Sequence[str], screens: Any, actions: Sequence[str],
                 clamp: tuple[float, float] | None = None) -> torch.Tensor:
        """(B,) teacher-forced log-likelihood of each action string and its end-of-sequence
        token. Differentiable (in the trainable parameters)."""
        tok, _, _ = self._score(prompts, screens, actions, clamp=clamp)
        return tok.sum(dim=-1) if len(tok) else torch.zeros(0, device=self.device)

    def token_log_probs_and_values(self, prompts, screens, actions):
        return self._score(prompts, screens, actions, values=True)

    def token_ids_log_probs_and_values(self, prompts, screens, token_ids):
        return self._score(prompts, screens, None, values=True, token_ids=token_ids)

    def action_token_ids(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
        """Each action string's token ids as the policy writes it (eos included)."""
        return [tuple(r) for r in self._action_ids(list(texts), None)] if texts else []

    def _action_ids(self, actions: Sequence[str] | None,
                    token_ids: Sequence[Sequence[int]] | None) -> list[list[int]]:
        if token_ids is not None:
            if any(len(t) == 0 for t in token_ids):
                raise ValueError("every action has at least one token (its eos)")
            return [list(t) for t in token_ids]
        return [ids + [self.eos_token_id]
                for ids in self.inputs.encode_actions(list(actions or ()))]

    def _score(self, prompts: Sequence[str], screens: Any, actions: Sequence[str] | None,
               clamp: tuple[float, float] | None = None, values: bool = False,
               token_ids: Sequence[Sequence[int]] | None = None):
        rows = token_ids if token_ids is not None else actions
        if rows is None or len(prompts) != len(rows):
            raise ValueError(f"{len(prompts)} prompts but "
                             f"{'no' if rows is None else len(rows)} actions")
        n = len(prompts)
        if n == 0:
            empty = torch.zeros(0, 0, device=self.device)
            return empty, (empty if values else None), empty
        screens = list(screens)
        ids = self._action_ids(actions, token_ids)
        t_max = max(len(r) for r in ids)
        parts, vparts, masks = [], [], []
        for a in range(0, n, self.bucket_rows):
            b = min(n, a + self.bucket_rows)
            enc = self._encode(prompts[a:b], screens[a:b])
            al = max(len(r) for r in ids[a:b])
            labels = torch.full((b - a, al), self.pad_token_id, dtype=torch.long)
            mask = torch.zeros((b - a, al), dtype=torch.long)
            for i, r in enumerate(ids[a:b]):
                labels[i, :len(r)] = torch.as_tensor(r)
                mask[i, :len(r)] = 1
            labels, mask = labels.to(self.device), mask.to(self.device)
            full = torch.cat([enc.pop("input_ids"), labels], 1)
            attn = torch.cat([enc.pop("attention_mask"), mask], 1)
            if "mm_token_type_ids" in enc:  # the action's tokens are text
                enc["mm_token_type_ids"] = torch.nn.functional.pad(enc["mm_token_type_ids"],
                                                                   (0, al))
            out = self.model(input_ids=full, attention_mask=attn, **enc,
                             logits_to_keep=al + 1, output_hidden_states=values,
                             use_cache=False)
            logits = out.logits[:, :al].float()  # the logits that predict the action tokens
            tok = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
            if clamp is not None:
                tok = torch.log(tok.exp().clamp(min=clamp[0], max=clamp[1]))
            tok = tok * mask
            parts.append(torch.nn.functional.pad(tok, (0, t_max - al)))
            masks.append(torch.nn.functional.pad(mask, (0, t_max - al)))
            if values:
                hidden = out.hidden_states[-1][:, -(al + 1):-1]
                v = self.value_head(hidden) * mask
                vparts.append(torch.nn.functional.pad(v, (0, t_max - al)))
        return (torch.cat(parts), torch.cat(vparts) if values else None, torch.cat(masks))


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _checkpointing(model, on: bool) -> None:
    if on:
        model.gradient_checkpointing_enable()
        if hasattr(model, "enable_input_require_grads"):  # LoRA: the frozen embeddings
            model.enable_input_require_grads()


def _text_config(config: Any) -> dict[str, Any]:
    d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return d.get("text_config") or d


def _with_lora(model, lora: dict[str, Any]):
    """``model`` with LoRA adapters (peft), only they trainable; rank 0: unchanged, every
    weight trainable."""
    if not lora.get("r"):
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise ImportError("LoRA needs the 'vlm' extra: pip install 'digirl-lite[vlm]'") from e
    unknown = set(lora) - {"r", "alpha", "dropout", "target_modules"}
    if unknown:
        raise ConfigError(f"lora: unknown settings {sorted(unknown)} (r, alpha, dropout, "
                          "target_modules)")
    cfg = LoraConfig(r=int(lora["r"]), lora_alpha=lora["alpha"],
                     lora_dropout=float(lora["dropout"]),
                     target_modules=list(lora["target_modules"]), bias="none")
    try:
        return get_peft_model(model, cfg)
    except ValueError as e:  # e.g. target modules that the model does not have
        raise ConfigError(f"lora.target_modules {lora['target_modules']}: {e}") from None
