"""The paper's model sizes, measured: parameters, peak memory, update and sampling speed.

    python benchmarks/bench_paper_size.py                    # this CPU: 2 threads, ~3 min
    python benchmarks/bench_paper_size.py --bf16             # bf16 autocast on the CPU (slower)
    python benchmarks/bench_paper_size.py --set device=cuda --batch 128 --updates 5
    python benchmarks/bench_paper_size.py --vit              # + one ViT-g forward (~4 GB)

Everything is built from configs with random weights; nothing is downloaded.

* **Policy**: :class:`~digirl_lite.policy.model.AutoUIModel` (T5 + Auto-UI's gated image
  fusion, 1408-d BLIP-2 image vector). Auto-UI-base is fine-tuned from FLAN-Alpaca-base,
  i.e. FLAN-T5-base, whose config is T5 v1.1 base: d_model 768, 12 + 12 layers, 12 heads,
  d_kv 64, d_ff 2048 with a gated-GELU feed-forward (three matrices), vocabulary 32128 and
  an lm_head not tied to the embeddings (``--set t5_shape=flan``, the default; transformers
  5.x ties T5 heads whatever the config says, so the head is untied here by hand).
  ``--set t5_shape=t5-base`` builds the original t5-base instead (d_ff 3072, ReLU, tied
  head): the same parameters per block, 24.7M fewer in all (no separate head).
* **Critics**: RoBERTa-base (``RobertaConfig()`` defaults: 12 layers, 768 wide, vocabulary
  50265, pooler) under digirl_lite's ``StepCritic(768, 1408, hidden=768)`` (two heads,
  3,345,410 parameters each) and ``InstructionCritic(768)``, spec section 5.
* **BLIP-2 ViT-g**: counted on the meta device (no memory): ``Blip2VisionModel`` with
  ``Blip2VisionConfig()`` defaults (1408 wide, 39 layers, 16 heads, 224 px, patch 14).
  It is frozen and its features are cached once per screen, so the policy and critics read
  random (B, 1408) vectors; ``--vit`` also times one forward of it (random weights, fp32).

Token ids are random (no tokenizer: the cost depends on the lengths, not the ids):
prompts ``prompt_tokens`` = 128 long, action strings ``action_tokens`` = 64, tasks for the
instruction critic ``task_tokens`` = 32. These are estimates (no T5 or RoBERTa tokenizer is
available offline to count): a DUAL_POINT action string, digits and punctuation split by
sentencepiece, is some 55-65 T5 tokens, and the prompt ``Previous Actions: <action> Goal:
<task></s>`` some 90-110; 128 and 64 are their padded lengths. A stub tokenizer hands these
ids to the library's own code paths: the actor update is ``policy.updates.text_mle_update``
(Eq. 4.2: teacher-forced log-likelihood, backward, grad-norm cap 0.01, AdamW lr 1e-4),
sampling is ``AutoUIPolicy.act`` (temperature 1.0), encodings go through ``HFTextEncoder``.
With random weights the sampler almost never draws the end token (1 in 32128), so every
sampled action runs to ``max_new_tokens``: the sampling speed is per full-length action.

Measured on the device: parameter counts; peak memory per phase (CPU: ``ru_maxrss``, the
process's high-water mark, plus each phase's own peak above the memory resident when it
started, sampled every 5 ms; CUDA: ``torch.cuda.max_memory_allocated``); seconds per actor
update at ``--batch`` (on the CPU also per sample and extrapolated to the paper's batch 128,
labelled as extrapolation); seconds per critic update (cached embeddings at batch 128, as
digirl_lite trains them; and the released code's form, which re-encodes every text and
trains the instruction critic's RoBERTa, at a small micro-batch, extrapolated); sampled
actions per second at batch 16; the bytes autograd saves for backward per sample (fp32 and
bf16 autocast), which the on-paper GPU estimate scales to batch 4 (the released micro-batch:
batch_size 4 x grad_accum_steps 32 = 128) and to 128 in one pass, to compare with the
paper's 12 GB (spec section 7). Prints a table; writes JSON to
``benchmarks/results/paper_size_<device>[_bf16].json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import psutil
import torch

from digirl_lite.critics import (
    HFTextEncoder,
    InstructionBatch,
    InstructionCritic,
    StepBatch,
    StepCritic,
    instruction_critic_loss,
    step_critic_loss,
    value_loss,
)
from digirl_lite.critics.heads import PAPER_HIDDEN, PAPER_IMAGE_DIM, PAPER_TEXT_DIM
from digirl_lite.policy import AutoUIPolicy
from digirl_lite.policy.model import AutoUIModel
from digirl_lite.policy.updates import text_mle_update

RESULTS = Path(__file__).resolve().parent / "results"
GIB = 2**30

T5_SHAPES: dict[str, dict[str, Any]] = {
    # FLAN-T5-base = T5 v1.1 base: what FLAN-Alpaca-base, and so Auto-UI-base, is built on.
    "flan": {"d_model": 768, "d_kv": 64, "d_ff": 2048, "num_layers": 12,
             "num_decoder_layers": 12, "num_heads": 12, "vocab_size": 32128,
             "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
    # transformers' T5Config defaults = the original t5-base.
    "t5-base": {"d_model": 768, "d_kv": 64, "d_ff": 3072, "num_layers": 12,
                "num_decoder_layers": 12, "num_heads": 12, "vocab_size": 32128,
                "feed_forward_proj": "relu", "tie_word_embeddings": True},
}


@dataclasses.dataclass
class Settings:
    """What ``--set FIELD=VALUE`` changes (values are parsed as JSON, else kept as text)."""

    device: str = "auto"
    """``auto`` (CUDA when present), ``cpu`` or ``cuda``."""
    t5_shape: str = "flan"
    """``flan`` (FLAN-T5-base, Auto-UI-base's shape) or ``t5-base``; see the module docstring."""
    prompt_tokens: int = 128
    """Policy prompt length in tokens (also the step critic's text); see the docstring."""
    action_tokens: int = 64
    """Action string length in tokens (eos included) for the actor update."""
    task_tokens: int = 32
    """Task length in tokens for the instruction critic (released: the first prompt)."""
    max_new_tokens: int = 64
    """Sampled tokens per action when timing inference (released default: 128)."""
    sample_batch: int = 16
    """Actions sampled per batched inference call."""
    critic_batch: int = 128
    """Batch of a digirl_lite critic update on cached embeddings (spec: 128)."""
    released_micro_batch: int = 4
    """Released code's micro-batch (``batch_size`` 4, ``grad_accum_steps`` 32): the actor
    and step critic run 4 rows per forward, the trajectory critic 8 (``2 x`` this)."""
    encode_batch: int = 16
    """Texts per RoBERTa forward when timing the encoder (cost extrapolated to 128)."""
    paper_batch: int = 128
    """The paper's batch (spec section 7): extrapolations and the GPU estimate use it."""
    probe_batch: int = 1
    """Rows of the forwards whose saved-for-backward bytes are counted (at this and twice
    this; the bytes are linear in the rows, so the smallest probe is exact and cheapest)."""
    accum: int = 1
    """Micro-batches per actor update (the library's ``grad_accum``; released code: 32)."""
    threads: int = 2
    """torch CPU threads (0: torch's default)."""
    seed: int = 0
    actor_lr: float = 1e-4
    """Released ``lm_lr``."""
    critic_lr: float = 1e-4
    """Released ``critic_lr``."""
    grad_clip: float = 0.01
    """Released ``max_grad_norm``."""
    paper_gpu_gb: float = 12.0
    """The paper: policy and training fit in 12 GB of GPU memory (spec section 7)."""
    cuda_overhead_gib: float = 0.75
    """CUDA context + allocator slack added to the on-paper estimate (an assumption)."""

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.t5_shape not in T5_SHAPES:
            raise ValueError(f"t5_shape must be one of {sorted(T5_SHAPES)}, got {self.t5_shape!r}")
        for f in ("prompt_tokens", "action_tokens", "task_tokens", "max_new_tokens",
                  "sample_batch", "critic_batch", "released_micro_batch", "encode_batch",
                  "paper_batch", "probe_batch", "accum"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{f} must be positive, got {getattr(self, f)}")


def parse_set(items: Sequence[str]) -> Settings:
    fields = {f.name for f in dataclasses.fields(Settings)}
    kw: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in fields:
            raise SystemExit(f"--set {item!r}: expected FIELD=VALUE with FIELD in {sorted(fields)}")
        try:
            kw[key] = json.loads(raw)
        except json.JSONDecodeError:
            kw[key] = raw
    try:
        return Settings(**kw)
    except (TypeError, ValueError) as e:
        raise SystemExit(f"--set: {e}") from e


# -- token ids without a tokenizer -------------------------------------------------------------
class IdTokenizer:
    """Stands in for a tokenizer: each text is a key into a table of fixed-length id rows.

    Serves both interfaces the library calls: ``AutoUIPolicy``'s ``tok(texts, max_length=)``
    and ``HFTextEncoder``'s ``tok(texts, padding=, truncation=, max_length=, return_tensors=)``.
    Every row has the same length, so nothing is padded (attention mask all ones).
    """

    pad_token_id = 0
    eos_token_id = 1

    def __init__(self, vocab_size: int, seed: int) -> None:
        self.vocab_size = vocab_size
        self.truncation_side = "left"
        self._rows: dict[str, torch.Tensor] = {}
        self._g = torch.Generator().manual_seed(seed)

    def texts(self, prefix: str, n: int, length: int, eos: bool = False) -> list[str]:
        """Register ``n`` texts of ``length`` random ids (ending in eos if asked); their keys."""
        keys = []
        for i in range(n):
            ids = torch.randint(3, self.vocab_size, (length,), generator=self._g)
            if eos:
                ids[-1] = self.eos_token_id
            key = f"{prefix}{len(self._rows)}-{i}"
            self._rows[key] = ids
            keys.append(key)
        return keys

    def __call__(self, texts: Sequence[str], max_length: int | None = None,
                 **_: Any) -> dict[str, torch.Tensor]:
        ids = torch.stack([self._rows[t] for t in texts])  # (B, L)
        if max_length is not None and ids.shape[1] > max_length:  # left truncation
            ids = ids[:, -max_length:]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def batch_decode(self, batch: torch.Tensor) -> list[str]:
        """Ids as text, pads dropped: ``len(s.split())`` is the number of tokens sampled."""
        return [" ".join(str(int(i)) for i in row if int(i) != self.pad_token_id)
                for row in batch]


# -- memory ------------------------------------------------------------------------------------
def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def release_freed_memory() -> None:
    """Hand freed heap back to the OS (glibc keeps it otherwise), so that the next phase's
    RSS starts from what is really in use."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_gib() -> float:
    return psutil.Process().memory_info().rss / GIB


def maxrss_gib() -> float:
    """The process's peak resident set size so far (Linux ``ru_maxrss`` is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


class Phase:
    """Peak memory of one phase: CPU RSS (sampled every 5 ms + ``ru_maxrss``) or CUDA."""

    def __init__(self, name: str, device: torch.device, log: dict[str, dict]) -> None:
        self.name, self.device, self.log = name, device, log

    def __enter__(self) -> Phase:
        gc.collect()
        release_freed_memory()
        self.t0 = time.perf_counter()
        self.rss0 = rss_gib()
        self.peak = self.rss0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.cuda0 = torch.cuda.memory_allocated() / GIB
            torch.cuda.reset_peak_memory_stats()
        return self

    def _sample(self) -> None:
        proc = psutil.Process()
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, proc.memory_info().rss / GIB)

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self._stop.set()
        self._thread.join()
        rss1 = rss_gib()
        self.peak = max(self.peak, rss1)
        row = {"rss_start_gib": round(self.rss0, 3), "rss_end_gib": round(rss1, 3),
               "phase_peak_rss_gib": round(self.peak, 3),
               "phase_peak_delta_gib": round(self.peak - self.rss0, 3),
               "process_maxrss_gib": round(maxrss_gib(), 3),
               "wall_s": round(time.perf_counter() - self.t0, 2)}
        if self.device.type == "cuda":
            row.update(cuda_start_gib=round(self.cuda0, 3),
                       cuda_max_allocated_gib=round(torch.cuda.max_memory_allocated() / GIB, 3),
                       cuda_phase_delta_gib=round(
                           torch.cuda.max_memory_allocated() / GIB - self.cuda0, 3))
        self.log[self.name] = row


def saved_bytes(fn: Callable[[], Any], exclude: set[int]) -> tuple[int, Any]:
    """Bytes autograd saves for backward while ``fn()`` runs (each storage counted once;
    storages in ``exclude``, i.e. the parameters, skipped); and ``fn``'s result."""
    # the storages are kept alive until the count is done, so no address is reused by a
    # later tensor while ``fn`` runs
    seen: dict[int, torch.UntypedStorage] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in exclude:
            seen[s.data_ptr()] = s
        # detached: a tensor that holds its own grad_fn would be a reference cycle through
        # C++ that Python's collector cannot see (the graph, and the model, would leak)
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    total = sum(s.nbytes() for s in seen.values())
    seen.clear()
    return total, out


def saved_per_row(fn: Callable[[int], Any], rows: int, exclude: set[int]) -> dict[str, float]:
    """Saved-for-backward bytes of ``fn(rows)`` and ``fn(2 rows)`` (forwards only): per row
    (the slope) and fixed (the rest; under autocast mostly the bf16 copies of the weights,
    made once per forward)."""
    n = []
    for r in (rows, 2 * rows):
        nbytes, res = saved_bytes(lambda: fn(r), exclude)  # noqa: B023
        del res
        n.append(nbytes)
    per = (n[1] - n[0]) / rows
    return {"per_row": per, "fixed": max(n[0] - per * rows, 0.0)}


def param_storages(*modules: torch.nn.Module) -> set[int]:
    return {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}


def n_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def mib(d: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    return {k: {kk: round(vv / 2**20, 3) for kk, vv in v.items()} for k, v in d.items()}


# -- timing ------------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], iters: int, device: torch.device) -> list[float]:
    times = []
    for _ in range(iters):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def summary(times: list[float]) -> dict[str, float]:
    return {"median_s": round(statistics.median(times), 4), "min_s": round(min(times), 4),
            "n": len(times)}


def autocast(device: torch.device, bf16: bool):
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()


# -- the parts ---------------------------------------------------------------------------------
def build_policy(s: Settings, device: torch.device) -> tuple[AutoUIPolicy, IdTokenizer]:
    from transformers import T5Config

    shape = T5_SHAPES[s.t5_shape]
    config = T5Config(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                      dropout_rate=0.1, **shape)  # dropout 0.1: T5's and Auto-UI's default
    config.img_dim = PAPER_IMAGE_DIM
    torch.manual_seed(s.seed)
    model = AutoUIModel(config)
    if not shape["tie_word_embeddings"] and model.lm_head.weight is model.shared.weight:
        # transformers 5.x's T5Config forces tie_word_embeddings=True (configuration_t5.py:
        # "we tie weights always"), but FLAN-T5-base, and so Auto-UI-base, has its own
        # lm_head (24.7M parameters): give it its own weights, as the checkpoint has
        model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
    tok = IdTokenizer(shape["vocab_size"], s.seed)
    return AutoUIPolicy(model, tok, max_prompt_tokens=512, device=device), tok


def policy_param_split(model: AutoUIModel) -> dict[str, int]:
    fusion = sum(n_params(getattr(model, k)) for k in ("image_dense", "mha_layer", "gate_dense"))
    emb = model.shared.weight.numel()
    head = 0 if model.lm_head.weight is model.shared.weight else model.lm_head.weight.numel()
    total = n_params(model)
    return {"total": total, "t5_embeddings": emb, "lm_head_untied": head,
            "t5_encoder_decoder_blocks": total - fusion - emb - head, "image_fusion": fusion}


def vit_g_params() -> tuple[int, dict[str, Any]]:
    """ViT-g of BLIP-2 counted on the meta device (no memory, no download)."""
    from transformers import Blip2VisionConfig, Blip2VisionModel

    cfg = Blip2VisionConfig()
    with torch.device("meta"):
        vit = Blip2VisionModel(cfg)
    shape = {k: getattr(cfg, k) for k in ("hidden_size", "intermediate_size",
                                          "num_hidden_layers", "num_attention_heads",
                                          "image_size", "patch_size")}
    return n_params(vit), shape


def run_policy(s: Settings, args: argparse.Namespace, device: torch.device, bf16: bool,
               mem: dict[str, dict], out: dict[str, Any]) -> None:
    with Phase("policy_build", device, mem):
        t0 = time.perf_counter()
        policy, tok = build_policy(s, device)
        build_s = time.perf_counter() - t0
    model = policy.model
    out["params"]["policy"] = policy_param_split(model)
    out["policy_build_s"] = round(build_s, 2)
    g = torch.Generator().manual_seed(s.seed + 1)

    def batch(n: int) -> tuple[list[str], torch.Tensor, list[str]]:
        return (tok.texts("p", n, s.prompt_tokens), torch.randn(n, PAPER_IMAGE_DIM, generator=g),
                tok.texts("a", n, s.action_tokens, eos=True))

    def log_prob(rows: int) -> torch.Tensor:
        return policy.log_prob(*batch(rows))

    # bytes autograd saves for backward (forwards only), fp32 and bf16 autocast
    model.train()
    params = param_storages(model)
    act: dict[str, dict[str, float]] = {}
    for name, use_bf16 in (("fp32", False), ("bf16_autocast", True)):
        with autocast(device, use_bf16):
            act[name] = saved_per_row(log_prob, s.probe_batch, params)
    out["policy_saved_for_backward_mib"] = mib(act)
    gc.collect()

    opt = torch.optim.AdamW(model.parameters(), lr=s.actor_lr)
    losses: list[float] = []

    def update() -> None:
        pr, f, a = batch(args.batch)
        with autocast(device, bf16):
            losses.append(text_mle_update(policy, opt, pr, f, a, s.grad_clip, accum=s.accum))

    def optimizer_only() -> None:  # what an update costs whatever the batch
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()

    with Phase("actor_update", device, mem):
        warm = timed(update, 1, device)  # the first step also allocates AdamW's states
        times = timed(update, args.updates, device)
        fixed = statistics.median(timed(optimizer_only, 2, device))
    upd = summary(times)
    # extrapolation: the clip + AdamW step does not grow with the batch, forward + backward do
    per_sample = max(upd["median_s"] - fixed, 0.0) / args.batch
    at_paper = fixed + per_sample * s.paper_batch
    out["actor_update"] = {
        "batch": args.batch, "accum": s.accum, "warmup_s": round(warm[0], 3), **upd,
        "clip_and_adamw_step_s": round(fixed, 3),
        "forward_backward_s_per_sample": round(per_sample, 4),
        "extrapolated_s_at_paper_batch": round(at_paper, 2),
        "extrapolated_s_per_iteration_20_updates": round(at_paper * 20, 1),
        "losses": [round(x, 3) for x in losses],
    }

    # batched inference: sampling at temperature 1.0, a fresh batch of prompts each call
    def sample(n_tokens: int, rows: int = s.sample_batch) -> int:
        pr, f, _ = batch(rows)
        with autocast(device, bf16):
            acts = policy.act(pr, f, temperature=1.0, max_new_tokens=n_tokens,
                              generator_seed=s.seed)
        return sum(len(x.split()) for x in acts)

    with Phase("sampling", device, mem):
        sample(2, rows=2)  # warm-up
        n_tok: list[int] = []
        times = timed(lambda: n_tok.append(sample(s.max_new_tokens)), args.sample_iters, device)
    med = statistics.median(times)
    out["sampling"] = {
        "batch": s.sample_batch, "max_new_tokens": s.max_new_tokens, **summary(times),
        "tokens_sampled_per_call": n_tok,
        "actions_per_s": round(s.sample_batch / med, 2),
        "tokens_per_s": round(statistics.median(n_tok) / med, 1),
    }
    out["_policy_act"] = act
    out["_policy_logits_bytes"] = s.action_tokens * model.config.vocab_size * 4  # fp32, a row
    # the model and its optimizer are freed when this function returns (main collects)


def run_critics(s: Settings, args: argparse.Namespace, device: torch.device, bf16: bool,
                mem: dict[str, dict], out: dict[str, Any]) -> None:
    from transformers import RobertaConfig, RobertaModel

    with Phase("critic_build", device, mem):
        torch.manual_seed(s.seed)
        roberta = RobertaModel(RobertaConfig())  # roberta-base shape, random weights
        tok = IdTokenizer(roberta.config.vocab_size, s.seed + 2)
        encoder = HFTextEncoder.from_modules(roberta, tok, device=device, max_length=512,
                                             batch_size=s.encode_batch)
        step = StepCritic(PAPER_TEXT_DIM, PAPER_IMAGE_DIM, hidden=PAPER_HIDDEN).to(device)
        instr = InstructionCritic(PAPER_TEXT_DIM).to(device)
    out["params"]["critic"] = {
        "roberta_base_encoder": n_params(roberta), "step_critic_heads": n_params(step),
        "instruction_critic_head": n_params(instr),
        "total_digirl_lite": n_params(roberta) + n_params(step) + n_params(instr),
        # the released code builds one RoBERTa per critic (VLMDoubleCritic, TrajectoryCritic)
        "total_released_code": 2 * n_params(roberta) + n_params(step) + n_params(instr),
    }

    # (a) the frozen encoder: cost per new text (digirl_lite encodes each distinct text once)
    with Phase("critic_encode", device, mem):
        encoder.encode(tok.texts("w", 2, s.prompt_tokens))  # warm-up
        times = timed(lambda: encoder.encode(tok.texts("e", s.encode_batch, s.prompt_tokens)),
                      2, device)
    per_text = statistics.median(times) / s.encode_batch
    out["critic_encode"] = {"batch": s.encode_batch, "tokens": s.prompt_tokens,
                            **summary(times), "s_per_text": round(per_text, 4),
                            "extrapolated_s_for_paper_batch": round(per_text * s.paper_batch, 2)}

    # (b) digirl_lite: both critics' update on cached embeddings, batch 128, Adam
    B = s.critic_batch
    text = torch.randn(B, PAPER_TEXT_DIM, device=device)
    img2 = torch.randn(B, 2 * PAPER_IMAGE_DIM, device=device)
    label = torch.randint(0, 2, (B,), device=device).float()
    task = torch.randn(B, PAPER_TEXT_DIM, device=device)
    opt = torch.optim.Adam([*step.parameters(), *instr.parameters()], lr=s.critic_lr)

    def cached_update() -> None:
        opt.zero_grad()
        with autocast(device, bf16):
            loss = (step_critic_loss(step, StepBatch(text, img2, label))
                    + instruction_critic_loss(instr, InstructionBatch(task, label, ())))
        loss.backward()
        opt.step()

    with Phase("critic_update_cached", device, mem):
        timed(cached_update, 3, device)
        times = timed(cached_update, 20, device)
    out["critic_update_cached"] = {"batch": B, **summary(times)}

    # (c) the released code's form at a micro-batch m: the step critic re-encodes s_h and
    # s_{h+1} (2m prompts, encoder frozen); the trajectory critic trains its own RoBERTa on
    # 2m tasks (its batch_size is 8 where the others' is 4)
    m = s.released_micro_batch
    torch.manual_seed(s.seed + 3)
    roberta2 = RobertaModel(RobertaConfig()).to(device)  # TrajectoryCritic's own copy
    traj_head = torch.nn.Linear(PAPER_TEXT_DIM, 2).to(device)
    opt_s = torch.optim.Adam(step.parameters(), lr=s.critic_lr)
    opt_t = torch.optim.Adam([*roberta2.parameters(), *traj_head.parameters()], lr=s.critic_lr)
    lab_m = torch.randint(0, 2, (m,), device=device).float()
    img_m = torch.randn(m, 2 * PAPER_IMAGE_DIM, device=device)

    def released_step_update() -> None:
        opt_s.zero_grad()
        with autocast(device, bf16):
            t = encoder.encode(tok.texts("s", 2 * m, s.prompt_tokens)).to(device)
            b = StepBatch(t[:m], img_m, lab_m, t[m:], img_m)
            loss = step_critic_loss(step, b, next_states=True)
        loss.backward()
        opt_s.step()

    def traj_forward(rows: int) -> torch.Tensor:
        enc = tok(tok.texts("t", rows, s.task_tokens))
        enc = {k: v.to(device) for k, v in enc.items()}
        lab = torch.randint(0, 2, (rows,), device=device).float()
        return value_loss(traj_head(roberta2(**enc).pooler_output), lab)

    def released_traj_update() -> None:
        opt_t.zero_grad()
        with autocast(device, bf16):
            loss = traj_forward(2 * m)
        loss.backward()
        opt_t.step()

    with Phase("critic_update_released", device, mem):
        released_step_update()
        released_traj_update()
        t_step = timed(released_step_update, 2, device)
        t_traj = timed(released_traj_update, 2, device)
        fixed_traj = statistics.median(timed(opt_t.step, 2, device))  # Adam over RoBERTa
    res: dict[str, Any] = {}
    # released rows per update: step critic 4 x 32, trajectory critic 8 x 32
    for name, times, rows, per_update, fixed in (
            ("step_critic", t_step, m, s.paper_batch, 0.0),
            ("trajectory_critic", t_traj, 2 * m, 2 * s.paper_batch, fixed_traj)):
        per = max(statistics.median(times) - fixed, 0.0) / rows
        res[name] = {"micro_batch": rows, **summary(times), "adam_step_s": round(fixed, 3),
                     "s_per_row": round(per, 4), "rows_per_update": per_update,
                     "extrapolated_s_per_update": round(fixed + per * per_update, 1)}
    out["critic_update_released"] = res

    # saved for backward: the trajectory critic through RoBERTa (per task), heads at 128
    rp = param_storages(roberta2, traj_head)
    cact: dict[str, Any] = {}
    for name, use_bf16 in (("fp32", False), ("bf16_autocast", True)):
        with autocast(device, use_bf16):
            cact[f"roberta_trained_{name}"] = saved_per_row(traj_forward, s.probe_batch, rp)
    nb, loss = saved_bytes(
        lambda: step_critic_loss(step, StepBatch(text, img2, label)), param_storages(step))
    del loss
    cact["step_heads_fp32"] = {"per_row": nb / B, "fixed": 0.0}
    out["_critic_act"] = cact
    out["critic_saved_for_backward_mib"] = mib(cact)


def run_vit(s: Settings, args: argparse.Namespace, device: torch.device, bf16: bool,
            mem: dict[str, dict], out: dict[str, Any]) -> None:
    from transformers import Blip2VisionConfig, Blip2VisionModel

    with Phase("vit_g_forward", device, mem):
        t0 = time.perf_counter()
        torch.manual_seed(s.seed)
        vit = Blip2VisionModel(Blip2VisionConfig()).to(device).eval()
        build_s = time.perf_counter() - t0
        cfg = vit.config
        px = torch.randn(1, 3, cfg.image_size, cfg.image_size, device=device)
        with torch.no_grad(), autocast(device, bf16):
            vit(pixel_values=px)  # warm-up
            feats: list[torch.Tensor] = []
            times = timed(lambda: feats.append(vit(pixel_values=px).pooler_output), 2, device)
    out["vit_g_forward"] = {"batch": 1, "build_s": round(build_s, 1), **summary(times),
                            "pooled_shape": list(feats[-1].shape)}


# -- the estimate ------------------------------------------------------------------------------
def gpu_estimate(s: Settings, out: dict[str, Any]) -> dict[str, Any]:
    """GiB on one GPU, on paper: weights, gradients and optimizer states from the parameter
    counts; activations from the saved-for-backward bytes measured above."""
    p_pol = out["params"]["policy"]["total"]
    pc = out["params"]["critic"]
    p_rob = pc["roberta_base_encoder"]
    p_heads = pc["step_critic_heads"] + pc["instruction_critic_head"]
    act, cact = out["_policy_act"], out["_critic_act"]
    logits = out["_policy_logits_bytes"]
    m, bp = s.released_micro_batch, s.paper_batch

    def gib(x: float) -> float:
        return round(x / GIB, 3)

    def saved(a: dict[str, float], rows: int) -> float:
        return a["fixed"] + a["per_row"] * rows

    # a model loaded in bf16 saves every activation in bf16 and needs no weight copies:
    # about half of fp32's bytes per row (an approximation: dropout masks stay 1 byte)
    act = {**act, "bf16_model": {"per_row": act["fp32"]["per_row"] / 2, "fixed": 0.0}}

    def policy(rows: int, mode: str, state_bytes: int) -> dict[str, float]:
        return {
            # fp32: weights 4 + Adam exp_avg 4 + exp_avg_sq 4 bytes per parameter, and
            # gradients 4; bf16 autocast keeps all of them in fp32 too; a model loaded in
            # bf16 (released use_bfloat16) has them all in bf16: half
            "weights_adam": gib(p_pol * state_bytes * 3 / 4),
            "gradients": gib(p_pol * state_bytes / 4),
            "activations": gib(saved(act[mode], rows)),
            # the fp32 gradients of the logits and of their log-softmax (an assumption)
            "backward_workspace": gib(2 * logits * rows),
        }

    released_critics = {  # critics stay fp32 in the released code (use_bfloat16: policy only)
        "two_roberta_weights": gib(2 * p_rob * 4),
        "trajectory_roberta_grads_adam": gib(p_rob * 12),
        "trajectory_activations": gib(saved(cact["roberta_trained_fp32"], 2 * m)),
        "heads_weights_grads_adam": gib(p_heads * 16),
    }
    lite_critics = {  # one frozen encoder (embeddings cached), only the heads train
        "roberta_weights": gib(p_rob * 4),
        "heads_weights_grads_adam": gib(p_heads * 16),
        "head_activations": gib(saved(cact["step_heads_fp32"], bp)),
    }
    scen: dict[str, dict[str, Any]] = {
        "released_fp32_microbatch": {"rows": m, "policy": policy(m, "fp32", 16),
                                     "critics": released_critics},
        "released_bf16_model_microbatch": {"rows": m, "policy": policy(m, "bf16_model", 8),
                                           "critics": released_critics},
        "lite_fp32_batch128_one_pass": {"rows": bp, "policy": policy(bp, "fp32", 16),
                                        "critics": lite_critics},
        "lite_bf16_autocast_batch128_one_pass": {
            "rows": bp, "policy": policy(bp, "bf16_autocast", 16), "critics": lite_critics},
    }
    budget = s.paper_gpu_gb * 1e9
    for v in scen.values():
        v["cuda_overhead"] = s.cuda_overhead_gib
        v["total_gib"] = round(sum(v["policy"].values()) + sum(v["critics"].values())
                               + s.cuda_overhead_gib, 2)
    # the largest actor micro-batch that fits the paper's 12 GB, digirl_lite's critics
    fits = {}
    for mode in ("fp32", "bf16_autocast"):
        rest = (p_pol * 16 + act[mode]["fixed"] + s.cuda_overhead_gib * GIB
                + sum(lite_critics.values()) * GIB)
        fits[mode] = int((budget - rest) // (act[mode]["per_row"] + 2 * logits))
    min_accum = {k: -(-bp // v) if v > 0 else None for k, v in fits.items()}
    # the same arithmetic against this run: the actor phase's own peak holds the gradients
    # and AdamW states (12 B per parameter: the weights were resident before) and one
    # update's activations at --batch
    b = -(-out["actor_update"]["batch"] // out["actor_update"]["accum"])  # rows per pass
    mode = "bf16_autocast" if out["bf16"] else "fp32"
    measured = out["memory"]["actor_update"]
    check = {"rows_per_pass": b,
             "predicted_gib": gib(p_pol * 12 + saved(act[mode], b) + 2 * logits * b),
             "predicted_without_gradients_gib": gib(p_pol * 8 + saved(act[mode], b)
                                                    + 2 * logits * b),
             "measured_rss_delta_gib": measured["phase_peak_delta_gib"]}
    if "cuda_phase_delta_gib" in measured:
        check["measured_cuda_delta_gib"] = measured["cuda_phase_delta_gib"]
    return {
        "unit": "GiB",
        "paper_gb": s.paper_gpu_gb,
        "paper_gib": round(budget / GIB, 2),
        "scenarios": scen,
        "largest_actor_batch_in_paper_gb": fits,
        "smallest_accum_for_batch128_in_paper_gb": min_accum,
        "blip2_vit_g_fp16_if_on_gpu_gib": gib(out["params"]["blip2_vit_g_on_paper"] * 2),
        "check_actor_phase": check,
        "notes": [
            "BLIP-2 ViT-g runs on the CPU in the released code and its features are cached "
            "per screen: not in the totals (add the fp16 line to host it on the GPU).",
            f"released: the actor and the step critic run micro-batches of {m}, the "
            f"trajectory critic {2 * m}, accumulated over 32 to 128 / 256 rows; the step "
            "critic's RoBERTa runs under no_grad, the trajectory critic's RoBERTa is trained "
            "(digirl/models/critic.py forces detach_model False there).",
            "activations: bytes autograd saved for backward, measured on the CPU at "
            f"{s.probe_batch} and {2 * s.probe_batch} rows (per row = the slope); backward "
            "workspace: two fp32 logits-sized buffers per row; cuda_overhead: an assumption.",
            "totals add gradients and activations, an upper bound: zero_grad sets the "
            "gradients to None, so they grow during backward while activations are freed.",
        ],
    }


# -- report ------------------------------------------------------------------------------------
def fmt_params(n: int) -> str:
    return f"{n / 1e6:,.1f}M"


def table(out: dict[str, Any]) -> str:
    st = out["settings"]
    p, pc = out["params"]["policy"], out["params"]["critic"]
    au, sm = out["actor_update"], out["sampling"]
    ce, cc, cr = out["critic_encode"], out["critic_update_cached"], out["critic_update_released"]
    sc, tc = cr["step_critic"], cr["trajectory_critic"]
    sa = out["policy_saved_for_backward_mib"]
    est = out["gpu_estimate_on_paper"]
    rows: list[tuple[str, str]] = [
        ("device", f"{out['device']}, {out['threads']} threads, bf16 autocast {out['bf16']}, "
                   f"load avg {out['load_avg_start'][0]} -> {out['load_avg_end'][0]}"),
        ("shapes", f"T5 {st['t5_shape']}; tokens: prompt {st['prompt_tokens']}, action "
                   f"{st['action_tokens']}, task {st['task_tokens']}; image 1408 floats"),
        ("-- parameters", ""),
        ("policy (T5 + fusion)", f"{fmt_params(p['total'])} (blocks "
         f"{fmt_params(p['t5_encoder_decoder_blocks'])}, embeddings "
         f"{fmt_params(p['t5_embeddings'])}, lm_head {fmt_params(p['lm_head_untied'])}, "
         f"fusion {fmt_params(p['image_fusion'])})"),
        ("critic encoder (RoBERTa-base)", f"{fmt_params(pc['roberta_base_encoder'])} "
         "(released code: two copies)"),
        ("critic heads", f"step {pc['step_critic_heads']:,}, instruction "
                         f"{pc['instruction_critic_head']:,}"),
        ("BLIP-2 ViT-g (on paper)", fmt_params(out["params"]["blip2_vit_g_on_paper"])),
        ("-- time", ""),
        ("actor update (Eq. 4.2)", f"{au['median_s']:.2f} s at batch {au['batch']} "
         f"(min {au['min_s']:.2f}, n {au['n']}); clip + AdamW step "
         f"{au['clip_and_adamw_step_s']:.2f} s, fwd+bwd {au['forward_backward_s_per_sample']:.3f}"
         " s/sample"),
        ("  batch 128 (extrapolated)", f"{au['extrapolated_s_at_paper_batch']:.1f} s per update,"
         f" {au['extrapolated_s_per_iteration_20_updates']:.0f} s per 20 updates"),
        ("sampling (temperature 1)", f"{sm['actions_per_s']:.2f} actions/s, "
         f"{sm['tokens_per_s']:.0f} tokens/s (batch {sm['batch']}, {sm['max_new_tokens']} new "
         f"tokens, {sm['median_s']:.2f} s per call)"),
        ("critic encode (frozen RoBERTa)", f"{ce['s_per_text']:.3f} s/text at batch "
         f"{ce['batch']}; 128 texts (extrapolated) {ce['extrapolated_s_for_paper_batch']:.1f} s"),
        ("critic update, cached (lite)", f"{cc['median_s'] * 1e3:.1f} ms at batch {cc['batch']}"
         " (both critics' heads)"),
        ("critic update, released form", f"step {sc['extrapolated_s_per_update']} s / "
         f"{sc['rows_per_update']} rows, trajectory {tc['extrapolated_s_per_update']} s / "
         f"{tc['rows_per_update']} rows (extrapolated from {sc['micro_batch']} and "
         f"{tc['micro_batch']} rows)"),
    ]
    if "vit_g_forward" in out:
        v = out["vit_g_forward"]
        rows.append(("ViT-g forward (1 image)", f"{v['median_s']:.2f} s (build {v['build_s']} s)"))
    rows.append(("-- memory", "GiB: peak RSS in the phase (+ over its start), ru_maxrss"))
    for name, r in out["memory"].items():
        txt = (f"{r['phase_peak_rss_gib']:.2f} (+{r['phase_peak_delta_gib']:.2f}), "
               f"{r['process_maxrss_gib']:.2f}")
        if "cuda_max_allocated_gib" in r:
            txt += (f"; CUDA max {r['cuda_max_allocated_gib']:.2f} "
                    f"(+{r['cuda_phase_delta_gib']:.2f})")
        rows.append((f"  {name}", txt))
    rows.append(("saved for backward (policy)", "MiB per row + fixed: fp32 "
                 f"{sa['fp32']['per_row']:.1f} + {sa['fp32']['fixed']:.0f}, bf16 autocast "
                 f"{sa['bf16_autocast']['per_row']:.1f} + {sa['bf16_autocast']['fixed']:.0f}"))
    rows.append(("-- GPU on paper", f"GiB (paper: {est['paper_gb']:.0f} GB = "
                                    f"{est['paper_gib']:.2f} GiB)"))
    for name, v in est["scenarios"].items():
        pol = v["policy"]
        rows.append((f"  {name}", f"{v['total_gib']:.2f} = policy {pol['weights_adam']:.2f}"
                     f" weights+Adam + {pol['gradients']:.2f} grads + {pol['activations']:.2f}"
                     f" act + {pol['backward_workspace']:.2f} bwd; critics "
                     f"{sum(v['critics'].values()):.2f}; overhead {v['cuda_overhead']:.2f}"))
    fits = est["largest_actor_batch_in_paper_gb"]
    acc = est["smallest_accum_for_batch128_in_paper_gb"]
    rows.append(("  largest batch in 12 GB", f"fp32 {fits['fp32']}, bf16 autocast "
                 f"{fits['bf16_autocast']} rows per pass (lite critics): batch 128 needs "
                 f"grad_accum >= {acc['fp32']} / {acc['bf16_autocast']}"))
    ck = est["check_actor_phase"]
    rows.append(("  check at --batch", f"actor phase predicted +{ck['predicted_gib']:.2f} "
                 f"(+{ck['predicted_without_gradients_gib']:.2f} without gradients), "
                 f"measured RSS +{ck['measured_rss_delta_gib']:.2f}"
                 + (f", CUDA +{ck['measured_cuda_delta_gib']:.2f}"
                    if "measured_cuda_delta_gib" in ck else "")))
    rows.append(("  + BLIP-2 ViT-g fp16 on GPU", f"{est['blip2_vit_g_fp16_if_on_gpu_gib']:.2f}"))
    w = max(len(k) for k, _ in rows)
    return "\n".join(k if k.startswith("--") and not v else f"{k:<{w}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="override Settings fields, e.g. --set device=cuda prompt_tokens=256")
    ap.add_argument("--updates", type=int, default=None,
                    help="timed actor updates after one warm-up (default: 2 on the CPU, 5 on CUDA)")
    ap.add_argument("--batch", type=int, default=None,
                    help="actor update batch (default: 8 on the CPU, 128 on CUDA)")
    ap.add_argument("--sample-iters", type=int, default=2, help="timed sampling calls")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="bf16 autocast (default: on for CUDA, off for the CPU)")
    ap.add_argument("--vit", action="store_true",
                    help="also build and time one ViT-g forward (fp32: ~4 GB of memory)")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    args = ap.parse_args(argv)
    s = parse_set(args.set)

    if s.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--set device=cuda but torch sees no CUDA device")
    device = torch.device("cuda" if s.device == "cuda" or (
        s.device == "auto" and torch.cuda.is_available()) else "cpu")
    cuda = device.type == "cuda"
    bf16 = cuda if args.bf16 is None else args.bf16
    args.updates = args.updates or (5 if cuda else 2)
    args.batch = args.batch or (128 if cuda else 8)
    if s.threads:
        torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)

    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if cuda else f"cpu ({cpu_name()})",
        "bf16": bf16, "threads": torch.get_num_threads(), "settings": dataclasses.asdict(s),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "load_avg_start": [round(x, 2) for x in os.getloadavg()],
        "rss_at_start_gib": round(rss_gib(), 3), "params": {},
    }
    import transformers

    out["versions"]["transformers"] = transformers.__version__
    if not cuda and out["load_avg_start"][0] > 0.75 * (os.cpu_count() or 1):
        # measured here: at load ~2 on 2 CPUs, 2 threads were still faster than 1 (19.7 vs
        # 31.0 s per update); at load ~5, 1 thread was 2-5x faster (threads wait on each other)
        print(f"note: load average {out['load_avg_start'][0]} on {os.cpu_count()} CPUs: "
              "other processes share these cores, so the times come out longer; under "
              "heavy load --set threads=1 can be faster", file=sys.stderr)
    mem: dict[str, dict] = {}
    t0 = time.perf_counter()
    out["params"]["blip2_vit_g_on_paper"], out["params"]["blip2_vit_g_config"] = vit_g_params()
    phases = [run_policy, run_critics] + ([run_vit] if args.vit else [])
    for phase in phases:
        phase(s, args, device, bf16, mem, out)
        gc.collect()  # what the phase built is gone before the next one starts
        if cuda:
            torch.cuda.empty_cache()
        release_freed_memory()
    out["memory"] = mem
    out["process_maxrss_gib"] = round(maxrss_gib(), 3)
    if cuda:
        out["cuda_max_allocated_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 3)
    out["gpu_estimate_on_paper"] = gpu_estimate(s, out)
    for k in [k for k in out if k.startswith("_")]:
        del out[k]
    out["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    out["total_s"] = round(time.perf_counter() - t0, 1)
    text = table(out)
    out["table"] = text.splitlines()
    print(text)
    suffix = "_bf16" if bf16 and not cuda else ""
    path = args.out or RESULTS / f"paper_size_{device.type}{suffix}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
