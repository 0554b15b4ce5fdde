"""The paper's image features: BLIP-2's frozen vision tower, pooled (spec/DIGIRL.md section 3).

The released code runs ``Blip2Model.get_image_features(**processor(images=...))
.pooler_output`` of ``Salesforce/blip2-opt-2.7b``: the ViT-g vision tower only (the Q-Former
and OPT are never used for features), whose ``pooler_output`` is the post-LayerNorm [CLS]
token (LayerNorm'ed twice: transformers applies ``post_layernorm`` to the sequence and again
to the [CLS] token), 1408 floats per screenshot. :class:`Blip2Features` computes exactly that
from a local copy of the checkpoint, loading only the vision weights (~1B of 3.9B parameters).
Beware: in transformers 5, ``Blip2ForConditionalGeneration.get_image_features(...)
.pooler_output`` is something else (Q-Former queries projected to the language model,
(B, 32, 2560)); only ``Blip2Model``'s is the vision tower's.

Why the weights are loaded by hand: ``Blip2VisionModel.from_pretrained(<full BLIP-2 dir>)``
reads the vision sub-config correctly but does not map the checkpoint's ``vision_model.``
prefix (transformers 5.24): every vision weight is reported MISSING and left randomly
initialised, with only a log warning. So the tower is built from ``config.vision_config``
and its tensors are read from the safetensors (or ``pytorch_model*.bin``) files, only the
``vision_model.*`` keys; missing keys are an error, unexpected ones a warning.

Preprocessing is the checkpoint's own ``preprocessor_config.json`` (resize to its size with
bicubic resampling, rescale by 1/255, normalise with its mean and std) run by the PIL/numpy
image processor (``BlipImageProcessorPil`` in transformers 5, the class that was
``BlipImageProcessor`` in 4.x), never the torchvision-based one, so features match the
reference code's pixels.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from PIL import Image

__all__ = ["Blip2Features", "VISION_PREFIX", "load_vision_state_dict", "vision_prefix"]

VISION_PREFIX = "vision_model."
"""Where the vision tower's weights live in a Blip2Model / Blip2ForConditionalGeneration
checkpoint."""


def _weight_files(local_dir: Path, prefix: str) -> list[Path]:
    """The checkpoint's weight shards: safetensors if any, else PyTorch .bin files."""
    for index_name, pattern in (("model.safetensors.index.json", "*.safetensors"),
                                ("pytorch_model.bin.index.json", "pytorch_model*.bin")):
        index = local_dir / index_name
        if index.is_file():
            # Read only the shards that hold vision weights (the OPT shards are ~10 GB).
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            return [local_dir / s for s in sorted(
                {f for k, f in weight_map.items() if k.startswith(prefix)})]
        files = sorted(local_dir.glob(pattern))
        if files:
            return files
    return []


def vision_prefix(local_dir: str | Path) -> str:
    """Key prefix of the vision weights, from ``config.json``'s ``model_type``.

    ``"vision_model."`` in a full BLIP-2 checkpoint (``blip-2``: Blip2Model,
    Blip2ForConditionalGeneration), ``""`` in a stand-alone ``Blip2VisionModel`` one.
    """
    path = Path(local_dir) / "config.json"
    model_type = json.loads(path.read_text()).get("model_type")
    if model_type == "blip-2":
        return VISION_PREFIX
    if model_type == "blip_2_vision_model":
        return ""
    raise ValueError(f"{path}: model_type {model_type!r} is not a BLIP-2 checkpoint "
                     f"('blip-2' or 'blip_2_vision_model')")


def load_vision_state_dict(
    local_dir: str | Path, prefix: str | None = None
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The vision tower's tensors of a BLIP-2 checkpoint, on the CPU, keys without ``prefix``.

    Args:
        local_dir: the checkpoint directory.
        prefix: key prefix of the vision weights (default: :func:`vision_prefix`). Other
            keys (the Q-Former, the language model) are never read.

    Returns:
        (state dict, the weight files read).

    Raises:
        FileNotFoundError: no weight files in ``local_dir``.
        ValueError: the files hold no vision weights.
    """
    import torch

    local_dir = Path(local_dir)
    if prefix is None:
        prefix = vision_prefix(local_dir)
    files = _weight_files(local_dir, prefix)
    if not files:
        raise FileNotFoundError(
            f"{local_dir} has no weight files (*.safetensors or pytorch_model*.bin) holding "
            f"the vision tower: is it a complete copy of a BLIP-2 checkpoint such as "
            f"Salesforce/blip2-opt-2.7b?"
        )
    state: dict[str, torch.Tensor] = {}
    for f in files:
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(f), framework="pt", device="cpu") as st:
                for k in st.keys():
                    if k.startswith(prefix):
                        state[k[len(prefix):]] = st.get_tensor(k)
        else:
            sd = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
            state.update((k[len(prefix):], v) for k, v in sd.items() if k.startswith(prefix))
    if not state:
        raise ValueError(
            f"no vision weights in {local_dir} (read {', '.join(f.name for f in files)}): "
            f"no key starts with {prefix!r}"
        )
    return state, [str(f) for f in files]


class Blip2Features:
    """Frozen BLIP-2 vision tower -> pooled features, one vector per image.

    Args:
        local_dir: a local BLIP-2 checkpoint directory (``config.json``, weight files and
            ``preprocessor_config.json``), e.g. a copy of ``Salesforce/blip2-opt-2.7b``.
            Nothing is downloaded.
        device: ``"cuda"`` when available, else ``"cpu"``.
        dtype: float16 on CUDA, float32 on CPU (the reference code runs float32 on CPU).
        batch_size: images per forward pass.

    Attributes:
        dim: feature length (``vision_config.hidden_size``; 1408 for ViT-g).
        model: the frozen ``Blip2VisionModel`` (eval mode, ``requires_grad`` False).
        processor: the PIL/numpy image processor of the checkpoint.
        unexpected_keys: vision keys in the checkpoint that the tower does not have.
    """

    def __init__(
        self,
        local_dir: str | Path,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        batch_size: int = 16,
    ) -> None:
        import torch
        from transformers import Blip2VisionConfig, Blip2VisionModel

        local_dir = Path(local_dir)
        if not local_dir.is_dir():
            raise FileNotFoundError(
                f"BLIP-2 checkpoint directory {local_dir} does not exist (copy e.g. "
                f"Salesforce/blip2-opt-2.7b there; nothing is downloaded)"
            )
        if not (local_dir / "config.json").is_file():
            raise FileNotFoundError(f"{local_dir} has no config.json: not a BLIP-2 checkpoint")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.local_dir = local_dir
        self.batch_size = batch_size
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = dtype or (torch.float16 if self.device.type == "cuda" else torch.float32)

        # Reads config.vision_config of a full BLIP-2 config, or a vision config as is.
        config = Blip2VisionConfig.from_pretrained(local_dir)
        state, self.weight_files = load_vision_state_dict(local_dir)
        with torch.device("meta"):  # no random init of ~1B parameters that are overwritten
            model = Blip2VisionModel(config)
        expected = set(model.state_dict())
        missing = sorted(expected - set(state))
        unexpected = sorted(set(state) - expected)
        if missing:
            raise ValueError(
                f"the checkpoint in {local_dir} lacks {len(missing)} of the vision tower's "
                f"{len(expected)} tensors, e.g. {missing[:5]}"
            )
        if unexpected:
            warnings.warn(
                f"{len(unexpected)} vision tensors in {local_dir} are not used by "
                f"Blip2VisionModel, e.g. {unexpected[:5]}", stacklevel=2,
            )
        self.unexpected_keys = unexpected
        state = {k: state[k].to(self.device, self.dtype) for k in expected}
        model.load_state_dict(state, strict=True, assign=True)
        model.eval().requires_grad_(False)
        self.model = model
        self.dim = int(config.hidden_size)
        self.image_size = int(config.image_size)
        self.processor = self._load_processor(local_dir, self.image_size)

    @staticmethod
    def _load_processor(local_dir: Path, image_size: int) -> Any:
        from transformers import BlipImageProcessorPil

        if (local_dir / "preprocessor_config.json").is_file():
            proc = BlipImageProcessorPil.from_pretrained(local_dir)
        else:
            warnings.warn(
                f"{local_dir} has no preprocessor_config.json: using BLIP's defaults (bicubic "
                f"resize to {image_size}, rescale 1/255, CLIP mean/std), which are what "
                f"Salesforce/blip2-opt-2.7b's config says", stacklevel=3,
            )
            proc = BlipImageProcessorPil(size={"height": image_size, "width": image_size})
        size = proc.size
        if (size.get("height"), size.get("width")) != (image_size, image_size):
            warnings.warn(
                f"the image processor resizes to {dict(size)} but the vision tower expects "
                f"{image_size} x {image_size}", stacklevel=3,
            )
        return proc

    def pixel_values(self, images: Sequence[Image.Image]) -> np.ndarray:
        """Preprocessed images, (N, 3, H, W) float32, as the reference's processor makes them."""
        return self.processor(images=list(images), return_tensors="np")["pixel_values"]

    def encode(self, images: Sequence[Image.Image] | Image.Image) -> np.ndarray:
        """Pooled features of ``images``: (N, dim) float32 on the CPU."""
        import torch

        if hasattr(images, "size") and hasattr(images, "mode"):  # one PIL image
            images = [images]
        images = list(images)
        out = np.zeros((len(images), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for i in range(0, len(images), self.batch_size):
                chunk = images[i:i + self.batch_size]
                px = torch.from_numpy(self.pixel_values(chunk)).to(self.device, self.dtype)
                pooled = self.model(pixel_values=px).pooler_output  # (B, dim)
                out[i:i + len(chunk)] = pooled.float().cpu().numpy()
        return out

    __call__ = encode

    def __repr__(self) -> str:
        return (f"Blip2Features({str(self.local_dir)!r}, device={str(self.device)!r}, "
                f"dtype={self.dtype}, dim={self.dim})")
