"""Copy-constrained typing: the text of a TYPE action is a span of the instruction (issue 32,
item 5).

On instructions phrased unlike its training data, the tiny Auto-UI policy finds the shop but
not the product's span: it writes "up a crsunial mx500 ssd" for "At ebay.com, look up a
crucial mx500 ssd", "sony wh-720n headphones f" for "get me sony wh-ch720n headphones from
newegg.com", and on the test list it stutters ("8bitdo sn30 pro pro pro"). What a phone task
asks to type (a product, a shop's address, a search) is written in its instruction, so
:class:`CopyLogitsProcessor` masks, inside the ``typed_text`` of a TYPE action, every token that
would take the text out of the instruction's spans:

* the text starts at the start of one of the instruction's words;
* every prefix of it occurs in the instruction there, compared case-insensitively (the
  simulator compares typed text with the task's query case-insensitively, like a search box);
* the closing quote is allowed only where the text ends at the end of a word (the next
  character of the instruction is not a letter or digit, or there is none).

The model's own distribution picks *which* span (where it starts and ends); the mask only
removes what no span allows. Rows whose action type is not TYPE, rows before the typed text
and after its closing quote, and prompts without a ``Goal:`` are left as they are. Where the
earlier processors (the grammar's mask and its step budget) leave no token the copy rule
allows, the row is left as they made it: the mask never empties a row.

A premise, not a law: a task that asks to type something its instruction does not contain
(a translation, a computed value, a reply) cannot be done under this mask. The setting is
off by default (``copy_typed_text``); ``tests/policy/test_copying.py`` checks the premise on every
shipped task list and split (what the simulator's expert types is a span of the line).

A text the row's episode typed already (``typed``, kept per phone by the sampling agent where
``typed_span_once`` is on) is not copied again while the rule leaves another span: with a span
chooser, its spans less the typed ones (all of them where every one was typed); without one,
the text may not close on a typed text. Measured on the held-out phrasings (issue 32, item 5):
the tiny policy typed the shop's address a second time, into the shop's search box, because
its prompt holds only its last action.

Like the grammar's mask, this changes what is sampled but not what the actor is trained on
(:meth:`AutoUIPolicy.log_prob` is the unmasked model's likelihood); PPO and GRPO, which need
the recorded probabilities to be the scored ones, refuse it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch
from transformers import LogitsProcessor

from digirl_lite.policy.grammar import MARKER, SEP_TEXT, _vocabulary, per_tokenizer
from digirl_lite.prompts import task_from_prompt

__all__ = ["CopyLogitsProcessor", "CopyVocabulary", "copy_logits_processor", "span_ok"]

TYPE_HEAD = MARKER + 'TYPE"'
"""What the action string holds before its typed text when the action is a TYPE."""
TEXT_HEAD = SEP_TEXT[SEP_TEXT.index('"typed_text"'):]
"""``"typed_text": "``: the typed text starts after it."""


def _source(instruction: str) -> str:
    """The instruction as spans are matched in it: lower case, whitespace collapsed."""
    return " ".join(instruction.lower().split())


def _word_starts(src: str) -> list[int]:
    return [i for i, ch in enumerate(src) if ch.isalnum() and (i == 0 or not src[i - 1].isalnum())]


def _ends_word(src: str, q: int) -> bool:
    return q >= len(src) or not src[q].isalnum()


def _continuations(src: str, starts: Sequence[int], text: str) -> list[int]:
    """Where ``text`` (lower-cased) can go on in ``src``: the positions just after each
    occurrence of it that begins at a word start."""
    n = len(text)
    return [p + n for p in starts if src.startswith(text, p)]


def span_ok(instruction: str, text: str, complete: bool = True) -> bool:
    """Whether ``text`` is allowed by the copy rule: a case-insensitive span of
    ``instruction`` starting at a word start and (``complete``) ending at a word end; with
    ``complete`` False, whether it can still grow into one."""
    src, t = _source(instruction), text.lower()
    if not t:
        return not complete
    return _keeps_to(src, _word_starts(src), t, complete)


def _keeps_to(src: str, starts: Sequence[int], t: str, complete: bool) -> bool:
    """The rule on a non-empty lower-cased ``t``: a span of ``src`` from one of ``starts``,
    ending at a word end (``complete``), or one that can still grow into such a span."""
    qs = _continuations(src, starts, t)
    return any(_ends_word(src, q) for q in qs) if complete else bool(qs)


class CopyVocabulary:
    """One tokenizer's token strings indexed for the copy rule (built once per tokenizer).

    Args:
        tokenizer: an :class:`SPTokenizer` or :class:`HFTokenizer`.
    """

    def __init__(self, tokenizer: Any) -> None:
        v = _vocabulary(tokenizer)  # the grammar's decoded token strings (shared)
        self.strings, self.first_strings, self.ends = v.strings, v.first_strings, v.ends
        self.size = v.size
        self.by_text: dict[str, list[int]] = {}  # lower-cased string without a quote -> ids
        self.quoted: list[int] = []  # tokens holding a quote: they may close the text
        for i, s in enumerate(self.strings):
            if not s:
                continue
            if '"' in s:
                self.quoted.append(i)
            elif "\n" not in s and len(s.lower()) == len(s):
                self.by_text.setdefault(s.lower(), []).append(i)
        self.max_len = max((len(k) for k in self.by_text), default=1)

    def piece(self, token: int, first: bool) -> str:
        s = (self.first_strings if first else self.strings)[token] if token < self.size else None
        return s or ""


def _copy_vocabulary(tokenizer: Any) -> CopyVocabulary:
    return per_tokenizer(CopyVocabulary, tokenizer)


class _Row:
    """One row's decoded action so far and its instruction's spans: any word span, or only
    ``spans`` (``(start, end)`` in the lower-cased instruction; a span chooser's); less the
    texts in ``typed`` (module docstring)."""

    __slots__ = ("decoded", "src", "starts", "done", "ends", "typed")

    def __init__(self, instruction: str | None,
                 spans: Sequence[tuple[int, int]] | None = None,
                 typed: Collection[str] = ()) -> None:
        self.decoded = ""
        self.src = _source(instruction) if instruction else None
        self.starts = _word_starts(self.src) if self.src else []
        self.ends: dict[int, set[int]] | None = None
        self.typed = {_source(t) for t in typed if t and t.strip()}
        if self.src and spans:
            fresh = [(a, b) for a, b in spans if _source(self.src[a:b]) not in self.typed]
            self.ends = {}
            for a, b in fresh or spans:  # every span typed already: all of them again
                self.ends.setdefault(int(a), set()).add(int(b))
            self.starts = sorted(self.ends)
            self.typed = set()  # applied to the spans
        self.done = self.src is None  # nothing to copy from: never masked

    def conts(self, t: str) -> list[tuple[int, int]]:
        """``(start, position after t)`` of each allowed occurrence of ``t`` (every start
        for an empty one)."""
        src, n = self.src or "", len(t)
        return [(p, p + n) for p in self.starts if (not t or src.startswith(t, p))
                and (self.ends is None or p + n <= max(self.ends[p]))]

    def may_end(self, p: int, q: int) -> bool:
        """Whether a text from ``p`` may close at ``q``."""
        if self.ends is not None:
            return q in self.ends[p]
        src = self.src or ""
        return _ends_word(src, q) and not (self.typed and src[p:q] in self.typed)

    def limit(self, p: int) -> int:
        return len(self.src or "") if self.ends is None else max(self.ends[p])

    def text(self) -> str | None:
        """The typed text written so far (None: not in a TYPE action's typed text)."""
        d = self.decoded
        i = d.find(TYPE_HEAD)
        if i < 0:
            return None
        j = d.find(TEXT_HEAD, i)
        return None if j < 0 else d[j + len(TEXT_HEAD):]

    def allowed(self, text: str) -> bool:
        """Whether the typed text ``text`` (possibly closed by a quote) keeps to the rule."""
        k = text.find('"')
        body, closed = (text, False) if k < 0 else (text[:k], True)
        if "\n" in body:
            return False
        t = body.lower()
        if not t:
            return True  # an empty text: the grammar (or the parser) decides
        if self.ends is None:
            return (_keeps_to(self.src, self.starts, t, closed)
                    and not (closed and _source(t) in self.typed))
        pq = self.conts(t)
        return any(self.may_end(p, q) for p, q in pq) if closed else bool(pq)


class CopyLogitsProcessor(LogitsProcessor):
    """Masks, inside a TYPE action's typed text, every token the copy rule forbids (module
    docstring). One per ``generate`` / :func:`~digirl_lite.policy.decoding.decode` call.

    Args:
        vocabulary: the tokenizer's :class:`CopyVocabulary`.
        instructions: one per row (None: that row is not masked).
        prompt_length: the ids before the action in ``input_ids`` (1 for Auto-UI's T5).
        spans: a span chooser (:func:`copy_logits_processor`), or None.
        typed: one per row, the texts its episode typed already (not copied again while the
            rule leaves another span), or None.
    """

    def __init__(self, vocabulary: CopyVocabulary, instructions: Sequence[str | None],
                 prompt_length: int = 1, spans: Any = None,
                 typed: Sequence[Collection[str]] | None = None) -> None:
        self.vocab = vocabulary
        self.instructions = list(instructions)
        self.spans = spans
        if typed is not None and len(typed) != len(self.instructions):
            raise ValueError(f"{len(typed)} typed-text lists for {len(self.instructions)} rows")
        self.typed = [tuple(t) for t in typed] if typed is not None else None
        self.prompt_length = int(prompt_length)
        self._rows: list[_Row] | None = None
        self._length = -1

    def _feed(self, row: _Row, token: int, first: bool) -> None:
        if token in self.vocab.ends:
            row.done = True
            return
        row.decoded += self.vocab.piece(token, first)
        text = row.text()
        if text is not None and '"' in text:
            row.done = True  # the typed text is closed: nothing more to mask

    def _sync(self, input_ids: torch.Tensor) -> None:
        batch, t = input_ids.shape
        p = self.prompt_length
        if self._rows is not None and t == self._length + 1 and len(self._rows) == batch:
            for row, tok in zip(self._rows, input_ids[:, -1].tolist()):
                if not row.done:
                    self._feed(row, int(tok), t - 1 == p)
        else:
            if len(self.instructions) != batch:
                raise ValueError(f"{len(self.instructions)} instructions for {batch} rows")
            typed = self.typed or [()] * batch
            self._rows = [_Row(ins, self.spans.spans(ins) if self.spans is not None and ins
                               else None, tt) for ins, tt in zip(self.instructions, typed)]
            for row, ids in zip(self._rows, input_ids[:, p:].tolist()):
                for k, tok in enumerate(ids):
                    if row.done:
                        break
                    self._feed(row, int(tok), k == 0)
        self._length = t

    def _row_mask(self, row: _Row) -> torch.Tensor | None:
        """(V,) the tokens the rule allows for this row, or None where it allows all."""
        text = row.text()
        v = self.vocab
        ok = torch.zeros(v.size, dtype=torch.bool)
        if text is None:
            if TYPE_HEAD not in row.decoded:
                return None
            # before the typed text of a TYPE: only a token that crosses into it is checked
            ok[:] = True
            for i in v.quoted:
                after = row.decoded + v.strings[i]
                j = after.find(TEXT_HEAD, after.find(TYPE_HEAD))
                if j >= 0 and not row.allowed(after[j + len(TEXT_HEAD):]):
                    ok[i] = False
            return ok
        t = text.lower()
        pq = row.conts(t)
        src = row.src
        for p, q in pq:
            for n in range(1, min(v.max_len, row.limit(p) - q) + 1):
                ids = v.by_text.get(src[q:q + n])
                if ids:
                    ok[ids] = True
        if not t or any(row.may_end(p, q) for p, q in pq):
            for i in v.quoted:  # the quote may close it (an empty text: for the grammar)
                if row.allowed(text + v.strings[i]):
                    ok[i] = True
        return ok

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._sync(input_ids)
        n = scores.shape[-1]
        for b, row in enumerate(self._rows or []):
            if row.done:
                continue
            ok = self._row_mask(row)
            if ok is None:
                continue
            if ok.shape[0] != n:  # a model head wider than the tokenizer: the rest is masked
                ok = torch.nn.functional.pad(ok, (0, max(n - ok.shape[0], 0)))[:n]
            ok = ok.to(scores.device)
            keep = ok & torch.isfinite(scores[b])
            if bool(keep.any()):  # never empty a row the earlier processors left open
                scores[b] = scores[b].masked_fill(~keep, float("-inf"))
        return scores


def copy_logits_processor(tokenizer: Any, prompts: Sequence[str],
                          prompt_length: int = 1, spans: Any = None,
                          typed: Sequence[Collection[str]] | None = None
                          ) -> CopyLogitsProcessor:
    """A fresh processor for one call: each prompt's ``Goal:`` is the row's instruction.
    ``spans``: a span chooser (anything with ``spans(instruction)`` -> ``(start, end)``
    pairs in the lower-cased instruction, e.g. a
    :class:`~digirl_lite.policy.span_extractor.SpanExtractor`): the text must be one of
    them; None: any span of whole words. ``typed``: one per prompt, the texts its episode
    typed already (not copied again while another span is left)."""
    return CopyLogitsProcessor(_copy_vocabulary(tokenizer),
                               [task_from_prompt(p) for p in prompts], prompt_length, spans,
                               typed)
