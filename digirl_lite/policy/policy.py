"""``AutoUIPolicy``: the AutoUI model with its tokenizer, as the trainer and fleets use it."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from digirl_lite.policy.base import POLICY_FILE as _POLICY_FILE
from digirl_lite.policy.base import Masks, Sample
from digirl_lite.policy.decoding import decode
from digirl_lite.policy.model import AutoUIModel
from digirl_lite.policy.tokenizer import SIM_TOKENIZER_FILE, HFTokenizer, SPTokenizer
from digirl_lite.policy.value_head import VALUE_BIAS, ValueHead

__all__ = ["AutoUIPolicy", "SIM_PRESET", "REFERENCE_CLAMP", "TOKEN_EMBEDDINGS", "ValueHead",
           "VALUE_BIAS", "Sample"]

log = logging.getLogger(__name__)

TOKEN_EMBEDDINGS = ("trained", "minilm")
"""What ``token_embeddings`` may name: T5's own (drawn and trained), or a frozen table from
MiniLM's input embeddings."""

REFERENCE_CLAMP = (0.001, 0.99)
"""The released code clamps per-token probabilities to this range before the log (a quirk,
offered only to reproduce it: ``log_prob(..., clamp=REFERENCE_CLAMP)``)."""

SIM_PRESET: dict[str, Any] = {
    # Sized to learn the simulator's tasks on 2 CPUs (shared/notes/MEASURED.md: 1.05M
    # parameters, ~0.33 s per update of 64 steps).
    "d_model": 128, "d_kv": 32, "d_ff": 512, "num_layers": 2, "num_decoder_layers": 2,
    "num_heads": 4, "dropout_rate": 0.0, "img_dim": 512,
    # The image vector enters the fusion scaled by 0.05. At scale 1 the tiny model, at the
    # preset's learning rate, grew the image path until its attention output (norm ~1,100)
    # drowned the text states (norm ~14): the SFT policy ignored its goal and typed the same
    # domain for every task (0/30 held-out domains after 400 updates, vs 30/30 at 0.05 and
    # 30/30 with no image at all). Smaller inputs also give the image path smaller gradients.
    "img_scale": 0.05,
}

_VALUE_FILE = "value_head.safetensors"

def _as_tensor(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.float()
    return torch.as_tensor(x, dtype=torch.float32)


class AutoUIPolicy:
    """Batched sampling and exact log-likelihoods of action strings.

    Args:
        model: an :class:`~digirl_lite.policy.model.AutoUIModel`.
        tokenizer: :class:`~digirl_lite.policy.tokenizer.SPTokenizer` (simulator preset) or
            :class:`~digirl_lite.policy.tokenizer.HFTokenizer` (a real checkpoint's).
        max_prompt_tokens: prompts are cut from the left beyond this (the goal is kept).
        device: where the model runs.
        value_head: per-token values for Darwin's learner (a fresh :class:`ValueHead` by
            default; ``value_head_fresh`` says whether it was trained or loaded).
        goal_features: the frozen encoder's goal features for a model that reads them
            (``model.config.lang_dim`` > 0; built from ``config.goal_encoder`` when not
            given): :mod:`digirl_lite.policy.goal_features`.
    """

    screen_input = "features"
    """It reads a frozen encoder's image features (:class:`~digirl_lite.policy.base.Policy`)."""

    bucket_rows: int = 32
    """:meth:`log_prob` scores rows in length-sorted buckets of this many (measured on the
    simulator's actor update, batch 128: see benchmarks/bench_actor.py)."""

    def __init__(self, model: AutoUIModel, tokenizer, max_prompt_tokens: int = 512,
                 device: str | torch.device = "cpu", value_head: ValueHead | None = None,
                 goal_features: Any = None) -> None:
        self.model = model.to(device)
        if model.frozen_token_embeddings:  # loading makes new parameters: freeze them here too
            model.shared.weight.requires_grad_(False)
        if model.lang_dim and goal_features is None:
            from digirl_lite.policy.goal_features import GoalFeatures

            goal_features = GoalFeatures(getattr(model.config, "goal_encoder", "minilm"))
        if goal_features is not None and goal_features.dim != model.lang_dim:
            raise ValueError(f"goal features of {goal_features.dim} floats for a model that "
                             f"reads {model.lang_dim}")
        self.goal_features = goal_features if model.lang_dim else None
        if self.goal_features is not None:
            self.goal_features.to(device)
            known = getattr(model.config, "goal_known_words", None)
            if known is not None:  # saved with the model: every load reads goals the same way
                self.goal_features.known_words = frozenset(known)
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.device = torch.device(device)
        self.value_head_fresh = value_head is None
        self.value_head = (value_head or ValueHead(model.config.d_model)).to(device)

    @property
    def img_dim(self) -> int:
        return self.model.img_dim

    def to(self, device: str | torch.device) -> AutoUIPolicy:
        """Move the model (in place) to ``device``; returns the policy."""
        self.device = torch.device(device)
        self.model.to(self.device)
        self.value_head.to(self.device)
        if self.goal_features is not None:
            self.goal_features.to(self.device)
        return self

    @property
    def known_goal_words(self) -> frozenset[str] | None:
        """The words a goal word must be among to keep its own embeddings (config
        ``goal_unseen_words`` "features"); None: every word keeps them."""
        return self.goal_features.known_words if self.goal_features is not None else None

    def read_unseen_words_through_features(self, words: Any) -> None:
        """From now on a goal word outside ``words`` (the words of the text it trained on:
        :func:`~digirl_lite.policy.goal_features.goal_words`) is read through the goal
        features alone, its tokens' own embeddings dropped (config ``goal_unseen_words``
        "features"); kept in the model's config, so a saved policy reads goals the same
        way."""
        if self.goal_features is None:
            raise ValueError("read_unseen_words_through_features: this policy reads no goal "
                             "features (goal_features 'none')")
        known = sorted({str(w).lower() for w in words})
        self.model.config.goal_known_words = known
        self.goal_features.known_words = frozenset(known)

    def parameters(self):
        """The model's parameters (the actor's); the value head's are
        ``value_head.parameters()``."""
        return self.model.parameters()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def action_token_ids(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
        """Each action string's token ids as the policy writes it (eos included)."""
        if not texts:
            return []
        enc = self.tokenizer(list(texts), max_length=None)
        return [tuple(int(x) for x, m in zip(row, mask) if m)
                for row, mask in zip(enc["input_ids"].tolist(),
                                     enc["attention_mask"].tolist())]

    # -- inference ----------------------------------------------------------------------
    def _encode_prompts(self, prompts: Sequence[str]) -> dict[str, torch.Tensor]:
        """``input_ids``, ``attention_mask`` and, for a model that reads goal features,
        ``lang`` (on the policy's device)."""
        if self.goal_features is None:
            enc = self.tokenizer(list(prompts), max_length=self.max_prompt_tokens)
        else:
            enc = self.goal_features.encode(self.tokenizer, list(prompts),
                                            self.max_prompt_tokens)
        return {k: v.to(self.device) for k, v in enc.items()}

    @torch.no_grad()
    def act(self, prompts: Sequence[str], image_features: Any, temperature: float = 1.0,
            max_new_tokens: int = 128, generator_seed: int | None = None,
            constrained: bool = False, copy_text: bool = False) -> list[str]:
        """Sample one action string per prompt (temperature 0: greedy); :meth:`sample` for
        the token ids and their log-probabilities too.

        Args:
            prompts: B policy prompts.
            image_features: (B, d) or (B, 2d) (two frames: the last one is used).
            temperature: sampling temperature (1.0 in the paper).
            max_new_tokens: cap on the action's length (128 in the paper).
            generator_seed: seeds the sampling (torch's global generator otherwise).
            constrained: sample only strings that parse to a valid action, ending within
                ``max_new_tokens`` (:mod:`digirl_lite.policy.grammar`: the model's
                distribution renormalised over the allowed tokens at each step).
            copy_text: a TYPE action's text is a span of the prompt's ``Goal:``
                (:mod:`digirl_lite.policy.copying`); a span chooser instead of True (a
                :class:`~digirl_lite.policy.span_extractor.SpanExtractor`): one of its
                spans.
        """
        return [s.text for s in self.sample(prompts, image_features, temperature,
                                            max_new_tokens, generator_seed, constrained,
                                            copy_text=copy_text)]

    @torch.no_grad()
    def sample(self, prompts: Sequence[str], image_features: Any, temperature: float = 1.0,
               max_new_tokens: int = 128, generator_seed: int | None = None,
               constrained: bool = False, row_seeds: Sequence[int] | None = None,
               copy_text: bool = False,
               typed: Sequence[Sequence[str]] | None = None) -> list[Sample]:
        """:meth:`act`'s draws with what the learner of an on-policy method needs: each
        action's token ids and their log-probabilities as sampled (:class:`Sample`).
        ``row_seeds``: one seed per prompt, each row drawn from its own generator (what a
        row samples then does not depend on the batch it is in). ``typed`` (with
        ``copy_text``): one per prompt, the texts its episode typed already, not copied
        again while another span is left (:mod:`digirl_lite.policy.copying`)."""
        if len(prompts) == 0:
            return []
        was_training = self.model.training
        self.model.eval()
        enc = self._encode_prompts(prompts)
        img = _as_tensor(image_features).to(self.device)
        if img.shape[0] != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {img.shape[0]} image rows")
        processors = self.mask_processors(prompts, max_new_tokens, constrained, copy_text,
                                          typed)
        sampler = None
        if temperature > 0:  # sampled (digirl_lite.policy.sampling), the greedy loop picks it
            from digirl_lite.policy.sampling import CategoricalSampler

            if row_seeds is not None and len(row_seeds) != len(prompts):
                raise ValueError(f"{len(row_seeds)} row seeds for {len(prompts)} prompts")
            sampler = CategoricalSampler(temperature,
                                         list(row_seeds) if row_seeds is not None else None)
            processors.append(sampler)
        state = None
        if generator_seed is not None:
            state = torch.random.get_rng_state()
            torch.manual_seed(generator_seed)
        try:
            # the greedy loop over the processed scores: the sampler makes it sampling
            out = decode(self.model, enc["input_ids"], enc["attention_mask"], img,
                         max_new_tokens, self.tokenizer.eos_token_id,
                         self.tokenizer.pad_token_id, processors, lang=enc.get("lang"))
        finally:
            if state is not None:
                torch.random.set_rng_state(state)
            self.model.train(was_training)
        gen = out[:, 1:].cpu()  # (B, steps): the decoder start token dropped
        texts = [s.strip("\n") for s in self.tokenizer.batch_decode(gen)]
        logp = torch.stack(sampler.log_probs, 1).cpu() if sampler and sampler.log_probs else None
        eos = self.tokenizer.eos_token_id
        samples = []
        for b, text in enumerate(texts):
            row = gen[b].tolist()
            n = row.index(eos) + 1 if eos in row else len(row)  # eos included
            lp = tuple(float(x) for x in logp[b, :n]) if logp is not None else None
            samples.append(Sample(text, tuple(row[:n]), lp))
        return samples

    def mask_processors(self, prompts: Sequence[str], max_new_tokens: int,
                        constrained: bool = False, copy_text: Any = False,
                        typed: Sequence[Sequence[str]] | None = None) -> list[Any]:
        """The processors :meth:`sample` puts on the next-token scores before it draws (the
        grammar, then the copy mask), fresh for one call over ``prompts``; the scoring of
        recorded tokens under :class:`~digirl_lite.policy.base.Masks` puts the same ones."""
        processors: list[Any] = []
        if constrained:
            from digirl_lite.policy.grammar import action_logits_processor

            processors.append(action_logits_processor(self.tokenizer, max_new_tokens))
        if copy_text:  # after the grammar: it never empties a row the grammar left open
            from digirl_lite.policy.copying import copy_logits_processor

            processors.append(copy_logits_processor(
                self.tokenizer, prompts, spans=None if copy_text is True else copy_text,
                typed=typed))
        return processors

    def log_prob(self, prompts: Sequence[str], image_features: Any, actions: Sequence[str],
                 clamp: tuple[float, float] | None = None) -> torch.Tensor:
        """Exact log-likelihood of each action string: the sum of its tokens' log-probs under
        teacher forcing (eos included, pads masked). Differentiable.

        Args:
            clamp: clamp per-token probabilities to this range before the log (the released
                code's quirk: ``REFERENCE_CLAMP``); None (default) for the exact value.

        Returns:
            (B,) tensor.
        """
        tok, _, mask = self._score(prompts, image_features, actions, clamp=clamp)
        return tok.sum(dim=-1) if len(tok) else torch.zeros(0, device=self.device)

    def token_log_probs_and_values(self, prompts: Sequence[str], image_features: Any,
                                   actions: Sequence[str]
                                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per action token: teacher-forced log-probabilities and the value head's values
        (from the decoder state that writes the token), with the mask of real tokens (eos
        included). Differentiable in both the model and the value head.

        Returns:
            (log_probs, values, mask), each (B, T), T the longest action's tokens; 0 at pads.
        """
        return self._score(prompts, image_features, actions, values=True)

    def token_ids_log_probs_and_values(self, prompts: Sequence[str], image_features: Any,
                                       token_ids: Sequence[Sequence[int]],
                                       masks: Masks | None = None,
                                       typed: Sequence[Sequence[str]] | None = None
                                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`token_log_probs_and_values` of the given token ids (what :meth:`sample`
        wrote), not of a re-tokenised string: an importance ratio must score the very tokens
        that were sampled. ``masks``: the masks the sampling put on the scores, put again
        at every token (the log-probabilities are then those :meth:`sample` recorded);
        ``typed`` (with ``masks.copy_once``): each row's texts typed before it."""
        return self._score(prompts, image_features, None, values=True, token_ids=token_ids,
                           masks=masks, typed=typed)

    @torch.no_grad()
    def token_entropies(self, prompts: Sequence[str], image_features: Any,
                        token_ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """The entropy (nats) of the policy's next-token distribution at each of the given
        action tokens (teacher-forced on them), one array per row: how spread the policy
        is where it acted (issue 28's reading of an on-policy update's health)."""
        if len(prompts) != len(token_ids):
            raise ValueError(f"{len(prompts)} prompts but {len(token_ids)} token rows")
        out: list[np.ndarray] = []
        for a in range(0, len(prompts), self.bucket_rows):
            p, t = list(prompts[a:a + self.bucket_rows]), list(token_ids[a:a + self.bucket_rows])
            enc = self._encode_prompts(p)
            labels, mask = self._labels(None, t)
            img = _as_tensor(image_features[a:a + self.bucket_rows]).to(self.device)
            _, hidden = self.model.action_token_outputs(enc["input_ids"], enc["attention_mask"],
                                                         img, labels, mask, enc.get("lang"))
            logp = torch.log_softmax(self.model.head_logits(hidden).float(), dim=-1)
            ent = -(logp.exp() * logp).sum(-1)
            out += [ent[i, :len(r)].cpu().numpy() for i, r in enumerate(t)]
        return out

    def _labels(self, actions: Sequence[str] | None,
                token_ids: Sequence[Sequence[int]] | None) -> tuple[torch.Tensor, torch.Tensor]:
        if token_ids is None:
            act = self.tokenizer(list(actions or ()), max_length=None)
            return act["input_ids"].to(self.device), act["attention_mask"].to(self.device)
        if any(len(t) == 0 for t in token_ids):
            raise ValueError("every action has at least one token (its eos)")
        width = max(len(t) for t in token_ids)
        labels = torch.full((len(token_ids), width), self.tokenizer.pad_token_id,
                            dtype=torch.long)
        mask = torch.zeros((len(token_ids), width), dtype=torch.long)
        for i, t in enumerate(token_ids):
            labels[i, :len(t)] = torch.as_tensor(list(t), dtype=torch.long)
            mask[i, :len(t)] = 1
        return labels.to(self.device), mask.to(self.device)

    def _score(self, prompts: Sequence[str], image_features: Any,
               actions: Sequence[str] | None, clamp: tuple[float, float] | None = None,
               values: bool = False, token_ids: Sequence[Sequence[int]] | None = None,
               masks: Masks | None = None, typed: Sequence[Sequence[str]] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        rows = token_ids if token_ids is not None else actions
        masked = masks is not None and masks.active
        if masked and masks.copy_once and masks.copy_text and (typed is None
                                                                or len(typed) != len(prompts)):
            raise ValueError("masks.copy_once: the scoring needs each row's texts typed "
                             "before it (typed, one per prompt)")
        if rows is None or len(prompts) != len(rows):
            raise ValueError(f"{len(prompts)} prompts but "
                             f"{'no' if rows is None else len(rows)} actions")
        n = len(prompts)
        if n == 0:
            empty = torch.zeros(0, 0, device=self.device)
            return empty, (empty if values else None), empty
        enc = self._encode_prompts(prompts)
        ids, amask, lang = enc["input_ids"], enc["attention_mask"], enc.get("lang")
        labels, mask = self._labels(actions, token_ids)
        img = _as_tensor(image_features).to(self.device)
        # rows sorted by length and scored in buckets, each cut to its own longest prompt and
        # action: a batch padded to its longest row was ~40% pads (an exact saving)
        plen, alen = amask.sum(-1), mask.sum(-1)
        order = torch.argsort(plen * (labels.shape[1] + 1) + alen, stable=True)
        t_max = int(alen.max())
        parts, vparts = [], []
        for rows in order.split(self.bucket_rows):
            pl, al = int(plen[rows].max()), int(alen[rows].max())
            tok, hidden = self.model.action_token_outputs(
                ids[rows, :pl], amask[rows, :pl], img[rows], labels[rows, :al], mask[rows, :al],
                lang[rows, :pl] if lang is not None else None)
            if masked:
                idx = rows.tolist()
                tok = self._masked_log_probs(
                    hidden, labels[rows, :al], mask[rows, :al], [prompts[i] for i in idx],
                    masks, [typed[i] for i in idx] if masks.copy_once and typed else None)
            if clamp is not None:
                tok = torch.log(tok.exp().clamp(min=clamp[0], max=clamp[1])) * mask[rows, :al]
            parts.append(torch.nn.functional.pad(tok, (0, t_max - al)))
            if values:
                v = self.value_head(hidden) * mask[rows, :al]
                vparts.append(torch.nn.functional.pad(v, (0, t_max - al)))
        back = torch.argsort(order)
        out_mask = mask[:, :t_max]
        return (torch.cat(parts)[back], torch.cat(vparts)[back] if values else None,
                out_mask)

    def _masked_log_probs(self, hidden: torch.Tensor, labels: torch.Tensor,
                          label_mask: torch.Tensor, prompts: list[str], masks: Masks,
                          typed: list[Sequence[str]] | None) -> torch.Tensor:
        """(B, T) each label's log-probability under the scores :meth:`sample` drew from:
        the head's scores at every position through :meth:`mask_processors` (fed the
        decoder start token and the labels before it, as :func:`~digirl_lite.policy.
        decoding.decode` feeds them), then the log-softmax (temperature 1). 0 at pads."""
        logits = self.model.head_logits(hidden).float()  # (B, T, V)
        procs = self.mask_processors(prompts, masks.max_new_tokens, masks.constrained,
                                     masks.copy_text, typed)
        start = torch.full((labels.shape[0], 1), self.model.config.decoder_start_token_id,
                           dtype=labels.dtype, device=labels.device)
        ids = torch.cat([start, labels], dim=1)
        cols = []
        for t in range(labels.shape[1]):
            scores = logits[:, t].clone()
            for p in procs:
                scores = p(ids[:, :t + 1], scores)
            sel = label_mask[:, t].bool()
            lp = torch.log_softmax(scores[sel], dim=-1).gather(1, labels[sel, t:t + 1])[:, 0]
            cols.append(torch.zeros(len(sel), dtype=lp.dtype, device=lp.device)
                        .masked_scatter(sel, lp))
        return torch.stack(cols, dim=1)

    # -- persistence ----------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Weights (safetensors), config and tokenizer into ``directory``."""
        from transformers.utils import logging as hf_logging

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        was = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            self.model.save_pretrained(str(d), safe_serialization=True)
        finally:
            if was:
                hf_logging.enable_progress_bar()
        untied = _has_own_head(self.model)
        if untied:  # transformers 5 ties T5's head on load: keep both matrices apart
            from safetensors.torch import save_file

            save_file({"shared.weight": self.model.shared.weight.detach().contiguous(),
                       "lm_head.weight": self.model.lm_head.weight.detach().contiguous()},
                      str(d / _UNTIED_FILE))
        self.tokenizer.save(d)
        kind = "sentencepiece" if isinstance(self.tokenizer, SPTokenizer) else "hf"
        from safetensors.torch import save_file

        save_file({f"value_head.{k}": v.detach().contiguous()
                   for k, v in self.value_head.state_dict().items()}, str(d / _VALUE_FILE))
        (d / _POLICY_FILE).write_text(json.dumps({
            "kind": "autoui", "tokenizer": kind, "max_prompt_tokens": self.max_prompt_tokens,
            "untied_lm_head": untied, "value_head": True}))
        return d

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> AutoUIPolicy:
        """Load what :meth:`save` wrote (never unpickles). A directory saved without a value
        head (before it existed, or the shipped starting policies) gets a fresh one
        (``value_head_fresh``), and the log says so."""
        d = Path(directory)
        meta_path = d / _POLICY_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(f"{d} is not a saved AutoUIPolicy (no {_POLICY_FILE}); "
                                    "for an Auto-UI checkpoint use AutoUIPolicy.from_pretrained")
        meta = json.loads(meta_path.read_text())
        from transformers.utils import logging as hf_logging

        was = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            model = AutoUIModel.from_pretrained(str(d))
        finally:
            if was:
                hf_logging.enable_progress_bar()
        if meta.get("untied_lm_head"):
            from safetensors.torch import load_file

            both = load_file(str(d / _UNTIED_FILE))
            with torch.no_grad():
                model.shared.weight.copy_(both["shared.weight"])
            _untie_head(model, both["lm_head.weight"])
        model.eval()
        if meta["tokenizer"] == "sentencepiece":
            tok = SPTokenizer(d / SIM_TOKENIZER_FILE)
        else:
            from transformers import AutoTokenizer

            tok = HFTokenizer(AutoTokenizer.from_pretrained(str(d)))
        head = None
        if meta.get("value_head") and (d / _VALUE_FILE).is_file():
            from safetensors.torch import load_file

            head = ValueHead(model.config.d_model)
            head.load_state_dict({k.removeprefix("value_head."): v
                                  for k, v in load_file(str(d / _VALUE_FILE)).items()})
        else:
            log.info("%s has no value head: a fresh one (output bias %.1f)", d, VALUE_BIAS)
        return cls(model, tok, meta.get("max_prompt_tokens", 512), device, value_head=head)

    @classmethod
    def from_pretrained(cls, local_dir: str | Path, img_dim: int = 1408, device: str = "cpu",
                        strict: bool = True) -> AutoUIPolicy:
        """A real Auto-UI checkpoint directory (config.json, weights, tokenizer files).

        Weights are matched by name; anything missing (other than the embeddings tied to
        ``shared``) or unexpected is listed in the error (or, with ``strict=False``, in
        ``policy.load_report``).
        """
        from transformers import AutoTokenizer, T5Config

        d = Path(local_dir)
        if not (d / "config.json").is_file():
            raise FileNotFoundError(f"{d} has no config.json: not a model directory")
        config = T5Config.from_pretrained(str(d))
        config.img_dim = int(getattr(config, "img_dim", img_dim))
        if config.decoder_start_token_id is None:
            config.decoder_start_token_id = config.pad_token_id or 0
        model = AutoUIModel(config)
        state = _read_state_dict(d)
        tied = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"}
        if config.tie_word_embeddings:
            tied.add("lm_head.weight")
        own = model.state_dict()
        missing = sorted(k for k in own if k not in state and k not in tied)
        unexpected = sorted(k for k in state if k not in own)
        report = {"missing": missing, "unexpected": unexpected}
        if strict and (missing or unexpected):
            raise ValueError(
                f"{d} does not match the Auto-UI layout: missing {len(missing)} "
                f"{missing[:8]}{' ...' if len(missing) > 8 else ''}; unexpected "
                f"{len(unexpected)} {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
        head = state.get("lm_head.weight")
        model.load_state_dict({k: v for k, v in state.items()
                               if k in own and k != "lm_head.weight"}, strict=False)
        model.tie_weights()
        if head is not None and not torch.equal(head, state.get("shared.weight", head)):
            # a checkpoint with its own output head (FLAN-T5, hence Auto-UI-base): transformers
            # 5 ties T5's head to the embeddings whatever the config says, which would
            # overwrite one matrix with the other
            _untie_head(model, head)
        model.eval()
        policy = cls(model, HFTokenizer(AutoTokenizer.from_pretrained(str(d))), device=device)
        policy.load_report = report
        log.info("%s: an Auto-UI checkpoint has no value head: a fresh one (output bias %.1f)",
                 d, VALUE_BIAS)
        return policy

    @classmethod
    def sim_preset(cls, seed: int = 0, tokenizer_dir: str | Path | None = None,
                   goal_features: str | None = None, goal_token_dropout: float = 0.0,
                   token_embeddings: str = "trained", **overrides: Any) -> AutoUIPolicy:
        """The tiny simulator model (fresh weights, seeded) with the shipped tokenizer;
        ``goal_features`` (an encoder of :data:`~digirl_lite.policy.goal_features.
        GOAL_ENCODERS`, None or "none": no features) gives it the frozen encoder's reading
        of the goal; ``goal_token_dropout`` the chance, in training, that a goal token's own
        embedding is dropped (so the model learns to read the goal through the features);
        ``token_embeddings`` "minilm": the token embeddings (and the tied head) are a frozen
        table from MiniLM's input embeddings
        (:func:`~digirl_lite.policy.goal_features.pretrained_token_table`), "trained": drawn
        and trained as T5's."""
        from transformers import T5Config

        from digirl_lite.paths import data_dir

        tok = SPTokenizer(Path(tokenizer_dir or data_dir() / "tokenizer") / SIM_TOKENIZER_FILE)
        cfg = {**SIM_PRESET, **overrides}
        img_dim, img_scale = cfg.pop("img_dim"), cfg.pop("img_scale", 1.0)
        config = T5Config(vocab_size=tok.vocab_size, pad_token_id=0, eos_token_id=1,
                          decoder_start_token_id=0, **cfg)
        config.img_dim, config.img_scale = img_dim, img_scale
        feats = None
        if goal_features not in (None, "none"):
            from digirl_lite.policy.goal_features import GoalFeatures

            feats = GoalFeatures(goal_features)
            config.lang_dim, config.goal_encoder = feats.dim, feats.name
            config.lang_token_dropout = float(goal_token_dropout)
        if token_embeddings not in TOKEN_EMBEDDINGS:
            raise ValueError(f"token_embeddings must be one of {', '.join(TOKEN_EMBEDDINGS)}, "
                             f"got {token_embeddings!r}")
        table = None
        if token_embeddings != "trained":
            from digirl_lite.policy.goal_features import pretrained_token_table

            table = pretrained_token_table(tok, config.d_model,
                                           encoder=feats.encoder if feats else None)
            config.frozen_token_embeddings, config.token_embeddings = True, token_embeddings
        torch.manual_seed(seed)
        model = AutoUIModel(config)
        if table is not None:
            with torch.no_grad():
                model.shared.weight.copy_(table)
        return cls(model, tok, goal_features=feats)


_UNTIED_FILE = "untied_lm_head.safetensors"


def _has_own_head(model: AutoUIModel) -> bool:
    return model.lm_head.weight.data_ptr() != model.shared.weight.data_ptr()


def _untie_head(model: AutoUIModel, head: torch.Tensor) -> None:
    """Give the model an output head of its own, equal to ``head``."""
    model.lm_head.weight = torch.nn.Parameter(head.detach().clone().to(model.shared.weight))


def _read_state_dict(d: Path) -> dict[str, torch.Tensor]:
    files = [f for f in sorted(d.glob("*.safetensors")) if f.name != _VALUE_FILE]
    if files:
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        return state
    bins = sorted(d.glob("pytorch_model*.bin"))
    if not bins:
        raise FileNotFoundError(f"{d} has no *.safetensors or pytorch_model*.bin weights")
    state = {}
    for f in bins:
        loaded = torch.load(f, map_location="cpu", weights_only=True)  # never unpickle code
        state.update(loaded.get("model_state_dict", loaded) if isinstance(loaded, dict) else {})
    return state
