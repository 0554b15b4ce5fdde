"""What a real VLM policy needs (issue 18, item 6): parameters, and GPU memory for one LoRA
actor update, on paper, or measured where a GPU is present.

    python benchmarks/bench_vlm_size.py                      # on paper: Qwen2-VL-2B and -7B
    python benchmarks/bench_vlm_size.py --measure --batch 8  # a GPU: random weights, real size

Parameters are counted exactly on the meta device (no memory) from transformers'
``Qwen2VLConfig`` with the released checkpoints' sizes (Qwen2-VL-2B-Instruct: a 32-block ViT
1280 wide, a 28-layer decoder 1536 wide, 8960 MLP, 12 heads, 2 key-value heads, vocabulary
151,936, tied head; -7B: 3584 wide, 18,944 MLP, 28 heads, 4 key-value heads, 152,064, untied),
and the LoRA adapters by rank and target modules as ``recipes/configs/qwen_vl_lora.json``
sets them.

Memory on paper, one actor update of ``--batch`` rows (``VLMPolicy.log_prob``: one forward
over prompt + action, the action's logits only):

* weights in bf16 (2 bytes each); the adapters in fp32 with their gradients and AdamW's two
  moments (16 bytes each);
* the sequence: the image tokens the Qwen2-VL image processor makes of a ``--image`` W x H
  screenshot (rounded to 28-pixel multiples, 2 x 2 patches merged), plus ``--text-tokens``
  (system prompt, goal and previous actions: ~40 + ~100 with Qwen's tokenizer), plus the
  action's ``--action-tokens`` (a tap is ~56 Qwen tokens, digits one by one);
* activations saved for the backward pass, per decoder layer and token, in bf16: the inputs
  of both norms, of q/k/v and o projections, q, k, v, the attention output, the MLP's gate,
  up, activation and product (7 h + 2 kv + 4 i values; attention by SDPA/flash, no s^2
  term); the frozen vision tower saves nothing (no trainable weight before it). With
  gradient checkpointing only each layer's input (h values) plus one layer's worth;
* the action's logits in fp32 and their log-softmax (2 x 4 bytes x T x V).

``--measure`` (CUDA only): builds the model at that size with random bf16 weights on the
GPU, LoRA as configured, and runs ``text_mle_update`` on random screenshots and prompts;
reports ``torch.cuda.max_memory_allocated``. Writes ``benchmarks/results/vlm_size.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SIZES = {
    "2b": {"text_config": {"vocab_size": 151936, "hidden_size": 1536,
                           "intermediate_size": 8960, "num_hidden_layers": 28,
                           "num_attention_heads": 12, "num_key_value_heads": 2},
           "vision_config": {"depth": 32, "embed_dim": 1280, "hidden_size": 1536,
                             "num_heads": 16, "mlp_ratio": 4},
           "tie_word_embeddings": True},
    "7b": {"text_config": {"vocab_size": 152064, "hidden_size": 3584,
                           "intermediate_size": 18944, "num_hidden_layers": 28,
                           "num_attention_heads": 28, "num_key_value_heads": 4},
           "vision_config": {"depth": 32, "embed_dim": 1280, "hidden_size": 3584,
                             "num_heads": 16, "mlp_ratio": 4},
           "tie_word_embeddings": False},
}
LORA = {"r": 8, "alpha": 16, "dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
GIB = 1024 ** 3


def image_tokens(width: int, height: int, patch: int = 14, merge: int = 2) -> int:
    """Image tokens of a W x H screenshot: each side rounded to a multiple of 28 (Qwen2-VL's
    ``smart_resize``, within its default pixel bounds), 14-pixel patches, 2 x 2 merged."""
    f = patch * merge
    w, h = max(f, round(width / f) * f), max(f, round(height / f) * f)
    return (w // patch) * (h // patch) // (merge * merge)


def build(size: str, device: str = "meta", token_ids: dict[str, int] | None = None):
    """The model at ``size`` on ``device`` (random weights; ``token_ids``: the special
    tokens' ids of the tokenizer it will be fed)."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    s = SIZES[size]
    config = Qwen2VLConfig(text_config=dict(s["text_config"]),
                           vision_config=dict(s["vision_config"]),
                           tie_word_embeddings=s["tie_word_embeddings"], **(token_ids or {}))
    with torch.device(device):
        return Qwen2VLForConditionalGeneration(config), config


def lora_parameters(model, lora: dict) -> int:
    """r x (in + out) for every Linear whose name ends with a target module."""
    import torch

    n = 0
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name.split(".")[-1] in lora["target_modules"] \
                and ".visual." not in f".{name}.":
            n += lora["r"] * (m.in_features + m.out_features)
    return n


def on_paper(size: str, batch: int, image: tuple[int, int], text_tokens: int,
             action_tokens: int, lora: dict) -> dict:
    model, config = build(size)
    tc = config.text_config
    params = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    n_lora = lora_parameters(model, lora)
    h, i, L = tc.hidden_size, tc.intermediate_size, tc.num_hidden_layers
    kv = tc.num_key_value_heads * (h // tc.num_attention_heads)
    seq = image_tokens(*image) + text_tokens + action_tokens
    per_token_layer = 2 * (7 * h + 2 * kv + 4 * i)  # bytes, bf16
    act = batch * seq * L * per_token_layer
    act_ckpt = batch * seq * (L * 2 * h + per_token_layer)
    logits = batch * action_tokens * tc.vocab_size * 4 * 2
    weights = 2 * params
    adapters = 16 * n_lora
    return {
        "model": f"Qwen2-VL-{size.upper()} (random weights of the real shapes)",
        "parameters": params, "vision_parameters": vision, "lora_parameters": n_lora,
        "lora": lora, "batch": batch, "image": list(image),
        "image_tokens": image_tokens(*image), "sequence_tokens": seq,
        "gib": {"weights_bf16": weights / GIB, "adapters_and_adam": adapters / GIB,
                "activations": act / GIB, "activations_checkpointed": act_ckpt / GIB,
                "action_logits_fp32": logits / GIB,
                "total": (weights + adapters + act + logits) / GIB,
                "total_checkpointed": (weights + adapters + act_ckpt + logits) / GIB},
    }


def measure(size: str, batch: int, image: tuple[int, int], lora: dict) -> dict:
    """One LoRA update on the GPU at real size (random bf16 weights); peak memory."""
    import torch
    from PIL import Image

    if not torch.cuda.is_available():
        raise SystemExit("--measure needs a CUDA device")
    # the inputs of a real checkpoint without one: the tiny VLM's tokenizer and processor
    # (the model is told their special tokens' ids)
    import tempfile

    from digirl_lite.envs.sim.demos import sim_corpus
    from digirl_lite.policy.tiny_vlm import make_tiny_vlm
    from digirl_lite.policy.updates import text_mle_update
    from digirl_lite.policy.vlm import VLMPolicy, _Inputs, _with_lora

    with tempfile.TemporaryDirectory() as tmp:
        d = make_tiny_vlm(Path(tmp) / "tiny", corpus=sim_corpus(seed=0, n_demos=20))
        inputs = _Inputs(d, "qwen2_vl")
    ids = {f"{k}_token_id": inputs.tokenizer.convert_tokens_to_ids(t) for k, t in
           (("image", "<|image_pad|>"), ("video", "<|video_pad|>"),
            ("vision_start", "<|vision_start|>"), ("vision_end", "<|vision_end|>"))}
    model, _ = build(size, device="cuda", token_ids=ids)
    model = _with_lora(model.to(torch.bfloat16), lora)
    model.gradient_checkpointing_enable()
    model.enable_input_require_grads()
    policy = VLMPolicy(model, inputs, base="random", lora=lora, image_size=image,
                       device="cuda")
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    shots = [Image.new("RGB", image, "white")] * batch
    prompts = ["Previous Actions: Goal: Go to newegg.com, search for 'macbook air'"] * batch
    actions = ['Action Decision: "action_type": "DUAL_POINT", "touch_point": "[0.1234, '
               '0.5678]", "lift_point": "[0.1234, 0.5678]", "typed_text": ""'] * batch
    torch.cuda.reset_peak_memory_stats()
    text_mle_update(policy, opt, prompts, shots, actions, 0.01)
    return {"peak_gib": torch.cuda.max_memory_allocated() / GIB,
            "device": torch.cuda.get_device_name()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="*", default=["2b", "7b"], choices=sorted(SIZES))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--image", type=int, nargs=2, default=[270, 570], metavar=("W", "H"))
    ap.add_argument("--text-tokens", type=int, default=140)
    ap.add_argument("--action-tokens", type=int, default=64)
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--json", default="benchmarks/results/vlm_size.json")
    args = ap.parse_args(argv)
    out = {}
    for size in args.sizes:
        r = on_paper(size, args.batch, tuple(args.image), args.text_tokens,
                     args.action_tokens, LORA)
        if args.measure:
            r["measured"] = measure(size, args.batch, tuple(args.image), LORA)
        out[size] = r
        g = r["gib"]
        print(f"{r['model']}: {r['parameters'] / 1e9:.2f} B parameters "
              f"({r['vision_parameters'] / 1e6:.0f} M vision), LoRA r={LORA['r']}: "
              f"{r['lora_parameters'] / 1e6:.2f} M trainable; {r['sequence_tokens']} tokens "
              f"per row ({r['image_tokens']} image)")
        print(f"  GiB at batch {args.batch}: weights {g['weights_bf16']:.2f}, adapters+Adam "
              f"{g['adapters_and_adam']:.3f}, activations {g['activations']:.2f} "
              f"(checkpointed {g['activations_checkpointed']:.2f}), logits "
              f"{g['action_logits_fp32']:.2f}; total {g['total']:.1f} "
              f"(checkpointed {g['total_checkpointed']:.1f})"
              + (f"; measured peak {r['measured']['peak_gib']:.1f}" if args.measure else ""))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
