"""A frozen pretrained encoder's reading of the goal, token by token, for the Auto-UI policy
(issue 32, item 5; config ``goal_features``).

The simulator preset's T5 learns its English from the simulator's instructions alone. On
requests phrased unlike them ("At ebay.com, look up a crucial mx500 ssd") it finds the shop
but cuts the product at the wrong words, and its own likelihood ranks the wrong spans first.
``benchmarks/span_generalization.py`` isolates that skill: finding the product in a held-out
phrasing is language knowledge, which a pretrained encoder has and a from-scratch one does
not. Real Auto-UI brings it from FLAN-T5's pre-training; this machine cannot download that,
but it has all-MiniLM-L6-v2 (the critics' text encoder, shipped by a PyPI package).

:class:`GoalFeatures` runs the frozen MiniLM once per distinct goal (the task text after the
prompt's ``Goal:``) and gives each of the policy's prompt tokens the mean of the MiniLM
token states whose characters it overlaps (zero outside the goal, and for tokens such as a
lone space that overlap none). :class:`~digirl_lite.policy.model.AutoUIModel` adds them,
through one trained linear map (``lang_dense``), to its token embeddings before its encoder:
the policy keeps its tokenizer, decoder, grammar and copy mask, and reads at every goal token
what the pretrained model knows of it. The encoder is never trained (no gradient reaches it),
so its states are cached by goal text: a goal repeats at every step of an episode.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from digirl_lite.prompts import task_from_prompt

__all__ = ["GOAL_ENCODERS", "GoalFeatures", "goal_span", "goal_words",
           "pretrained_token_table"]

GOAL_ENCODERS = ("minilm",)
"""The encoders ``goal_features`` may name ("none": no features)."""


def goal_span(prompt: str) -> tuple[int, str] | None:
    """Where the goal starts in ``prompt`` (character offset) and its text, or None for a
    prompt without a ``Goal:``."""
    task = task_from_prompt(prompt)
    if not task:
        return None
    at = prompt.find(task, prompt.rfind("Goal:"))
    return (at, task) if at >= 0 else None


_WORD = re.compile(r"[A-Za-z0-9]+")


def goal_words(text: str) -> list[tuple[int, int, str]]:
    """The words of ``text`` (runs of letters and digits) as (start, end, lower case): what
    :attr:`GoalFeatures.known_words` holds and is checked against."""
    return [(m.start(), m.end(), m.group(0).lower()) for m in _WORD.finditer(text)]


class GoalFeatures:
    """Per-token features of each prompt's goal from a frozen text encoder.

    Args:
        name: one of :data:`GOAL_ENCODERS`.
        encoder: the encoder to use instead of building ``name``'s (anything with ``dim`` and
            :meth:`~digirl_lite.critics.text.HFTextEncoder.token_states`).
        cache_size: goals whose states are kept (least recently used dropped first; about
            30 KB each: a run's tasks are a few hundred, the starting policy's copy drills
            each a new one).
        known_words: the words (:func:`goal_words`) of the text the policy trained on, or
            None. Given, :meth:`encode` flags every token of a goal word outside them, and
            the model reads those tokens through the features alone (config
            ``goal_unseen_words`` "features").
    """

    def __init__(self, name: str = "minilm", encoder: Any = None, cache_size: int = 4096,
                 known_words: Any = None) -> None:
        if name not in GOAL_ENCODERS:
            raise ValueError(f"goal_features must be one of {', '.join(GOAL_ENCODERS)} (or "
                             f"'none'), got {name!r}")
        if encoder is None:
            from digirl_lite.critics.text import MiniLMEncoder

            encoder = MiniLMEncoder(device="cpu")
        self.name = name
        self.encoder = encoder
        self.dim = int(encoder.dim)
        self.cache_size = int(cache_size)
        self.known_words = frozenset(known_words) if known_words is not None else None
        self._cache: OrderedDict[str, tuple[np.ndarray, torch.Tensor]] = OrderedDict()
        self._lock = threading.Lock()  # a behaviour copy shares it with the learner's policy

    def _states(self, goals: Sequence[str]) -> list[tuple[np.ndarray, torch.Tensor]]:
        with self._lock:
            return self._states_locked(goals)

    def _states_locked(self, goals: Sequence[str]) -> list[tuple[np.ndarray, torch.Tensor]]:
        todo = list(dict.fromkeys(g for g in goals if g not in self._cache))
        if todo:
            for g, (spans, states) in zip(todo, self.encoder.token_states(todo)):
                self._cache[g] = (np.asarray(spans, dtype=np.int64).reshape(-1, 2), states)
        out = []
        for g in goals:
            self._cache.move_to_end(g)
            out.append(self._cache[g])
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return out

    def align(self, prompt: str, spans: Sequence[tuple[int, int]],
              goal: tuple[np.ndarray, torch.Tensor] | None, start: int) -> torch.Tensor:
        """(len(spans), dim): for each token span of ``prompt``, the mean of the goal's
        encoder states whose characters (shifted by ``start``) it overlaps; zero where none."""
        out = torch.zeros(len(spans), self.dim)
        if goal is None or not len(spans) or not len(goal[0]):
            return out
        wp, states = goal
        s = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
        a, b = s[:, :1], s[:, 1:]
        wa, wb = wp[None, :, 0] + start, wp[None, :, 1] + start
        over = ((wa < b) & (wb > a) & (b > a)).astype(np.float32)  # (tokens, pieces)
        n = over.sum(1, keepdims=True)
        w = torch.from_numpy(np.divide(over, n, out=np.zeros_like(over), where=n > 0))
        return w @ states

    def unseen(self, spans: Sequence[tuple[int, int]], goal: str, start: int) -> torch.Tensor:
        """(len(spans),) 1.0 where a token span overlaps a word of ``goal`` (at ``start`` in
        the prompt) that :attr:`known_words` lacks, else 0.0."""
        out = torch.zeros(len(spans))
        new = [(a + start, b + start) for a, b, w in goal_words(goal)
               if w not in self.known_words]
        if not new or not len(spans):
            return out
        s = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
        w = np.asarray(new, dtype=np.int64)
        over = (w[None, :, 0] < s[:, 1:]) & (w[None, :, 1] > s[:, :1]) & (s[:, 1:] > s[:, :1])
        return torch.from_numpy(over.any(1).astype(np.float32))

    def encode(self, tokenizer: Any, prompts: Sequence[str], max_length: int | None
               ) -> dict[str, torch.Tensor]:
        """What the tokenizer's ``__call__`` gives (right-padded ``input_ids`` and
        ``attention_mask``) plus ``lang``: (B, T, dim) goal features on the same tokens;
        with :attr:`known_words`, (B, T, dim + 1): the last channel :meth:`unseen`'s flags."""
        if not hasattr(tokenizer, "encode_spans"):
            raise TypeError(f"goal_features needs a tokenizer that gives each token's "
                            f"characters (the simulator preset's SPTokenizer); "
                            f"{type(tokenizer).__name__} does not")
        enc = tokenizer(list(prompts), max_length=max_length, spans=True)
        where = [goal_span(p) for p in prompts]
        it = iter(self._states([w[1] for w in where if w is not None]))
        flags = self.known_words is not None
        lang = torch.zeros((*enc["input_ids"].shape, self.dim + flags))
        for i, (spans, w) in enumerate(zip(enc.pop("spans"), where)):
            if w is not None:
                lang[i, :len(spans), :self.dim] = self.align(prompts[i], spans, next(it), w[0])
                if flags:
                    lang[i, :len(spans), self.dim] = self.unseen(spans, w[1], w[0])
        return {**enc, "lang": lang}

    def to(self, device: str | torch.device) -> GoalFeatures:
        """Run the encoder on ``device`` (the policy's: :meth:`AutoUIPolicy.to` calls it); the
        features it gives and caches stay float32 on the CPU. On a GPU the encoder had run
        on the CPU: the SFT's copy drills (a new goal each) took 0.33 s an update against
        0.08 s without features (``benchmarks/gpu_generalization.sh``, an H200 shared by 4
        runs)."""
        device = torch.device(device)
        with self._lock:
            self.encoder.model.to(device)
            self.encoder.device = device
        return self

    def __repr__(self) -> str:
        return f"GoalFeatures({self.name!r}, dim={self.dim}, cached={len(self._cache)})"


def pretrained_token_table(tokenizer: Any, d: int, encoder: Any = None, seed: int = 0
                           ) -> torch.Tensor:
    """(vocab, d) token embeddings for the policy's sentencepiece vocabulary from a pretrained
    encoder's input embeddings (config ``token_embeddings`` "minilm"; issue 32, item 5).

    A from-scratch policy learns one embedding per token from its training data: words it
    never saw ("up", "me", "from" in a held-out phrasing) keep their random draw, and look to
    it like the made-up words of a product, which it types. Here each piece gets the mean of
    MiniLM's input embeddings of its word pieces (a continuation piece, MiniLM's ``##`` form
    where it has one), so an unseen word sits beside the words like it. Projected on the
    table's ``d - 10`` principal axes, then two flags (the piece starts a word; it holds a
    capital: MiniLM is uncased) and 8 fixed random coordinates (every piece distinct, for
    copying), each column scaled to T5's init (std 1). The model freezes the table
    (``AutoUIModel``'s ``frozen_token_embeddings``): trained, the seen words would move and
    the unseen would not (``benchmarks/span_generalization.py --kinds frozen_emb``).
    """
    if d <= 10:
        raise ValueError(f"d_model {d} leaves no room for the pretrained axes (> 10 needed)")
    if encoder is None:
        from digirl_lite.critics.text import MiniLMEncoder

        encoder = MiniLMEncoder(device="cpu")
    tok, emb = encoder.tokenizer, encoder.model.get_input_embeddings().weight.detach().float()
    unk = tok.unk_token_id
    vocab = tokenizer.vocab_size
    rows = torch.zeros(vocab, emb.shape[1])
    flags = torch.zeros(vocab, 2)
    for i in range(vocab):
        piece = tokenizer.sp.IdToPiece(i)
        start = piece.startswith("\u2581")
        text = piece.lstrip("\u2581")
        ids = tok(text, add_special_tokens=False)["input_ids"] if text else []
        if ids and not start:  # a continuation: its first word piece in MiniLM's ## form
            cont = tok.convert_tokens_to_ids("##" + tok.convert_ids_to_tokens(ids[0]))
            if cont is not None and cont != unk:
                ids[0] = cont
        rows[i] = emb[ids].mean(0) if ids else emb[unk]
        flags[i] = torch.tensor([float(start), float(text != text.lower())])
    x = rows - rows.mean(0)
    _, _, v = torch.linalg.svd(x, full_matrices=False)
    proj = x @ v[:d - 10].T
    rand = torch.randn(vocab, 8, generator=torch.Generator().manual_seed(seed))
    table = torch.cat([proj, flags, rand], dim=1)
    return (table - table.mean(0)) / table.std(0).clamp(min=1e-6)
