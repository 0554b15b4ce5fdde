"""Grammar-constrained decoding of the AutoUI action string (issue 16, item 5).

A sampled policy that is off its data writes strings :func:`~digirl_lite.actions.parse_action`
rejects (``0.8852 0.3763, 0.87940.3212DUAL_POINT``): every such step is a wasted no-op
(an INVALID action). :class:`ActionLogitsProcessor` masks, at each decoding step and for each
row, every token whose text would take the row's decoded prefix out of the action language
below, so every string sampled with it parses to a valid action:

    Action Decision: "action_type": "<TYPE>", "touch_point": "[<P>]", "lift_point": "[<P>]",
    "typed_text": "<TEXT>"                                                      (one line)

* ``<TYPE>`` is one of the seven AutoUI action types;
* ``<P>`` is ``<N>, <N>`` for DUAL_POINT, with ``<N>`` = ``0.dddd`` or ``1.0000`` (spec
  section 2: [y, x], normalised, four decimals), and ``-1.0, -1.0`` for every other type;
* ``<TEXT>`` is one or more characters other than ``"`` and a newline for TYPE, and empty for
  every other type;
* then the end of sequence. Leading spaces are allowed (a T5 tokenizer's first piece may
  carry one; decoding drops it).

This is a subset of what ``parse_action`` accepts (it also takes other whitespace, numbers
with other decimals, quotes inside typed text): the canonical strings ``format_action``
writes, which is what the policies are trained on.

The automaton is a small hand-written state machine over characters. Each tokenizer's token
strings are decoded once (:func:`token_strings`), and per automaton state the set of tokens
it allows is computed once and cached (:class:`ActionVocabulary`), so a decoding step costs
one dictionary lookup and one tensor comparison per row.

**The step budget.** An action must also *end* within ``max_new_tokens``: a token is allowed
only if the shortest way to finish the action after it (counted in this vocabulary's tokens,
the end-of-sequence included) still fits in what is left. Without this, a typed text could
run to the cap and be cut (an INVALID string again).

**What is sampled.** Masked tokens get a logit of -inf, so sampling draws from the model's
distribution renormalised over the allowed tokens (temperature commutes with the mask).
Steps do not record the sampling log-probability (``Step`` has no such field); what the
actor update uses, :meth:`AutoUIPolicy.log_prob`, stays the *unconstrained* model's
teacher-forced likelihood on purpose: the updates of the paper (filtered behaviour cloning,
AWR weights) are maximum likelihood on kept actions with no importance ratio, so they need
the model's own likelihood, and raising it on valid strings is what makes the model need the
mask less. (The constrained log-probability would add -log Z per token, Z the allowed mass.)
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers import LogitsProcessor

from digirl_lite.actions import ACTION_MARKER, ActionType

__all__ = ["ActionGrammar", "ActionVocabulary", "ActionLogitsProcessor",
           "action_logits_processor", "token_strings"]

TYPES = tuple(t.value for t in ActionType if t is not ActionType.INVALID)
MARKER = ACTION_MARKER + '"action_type": "'
SEP_TOUCH = '", "touch_point": "['
SEP_LIFT = ']", "lift_point": "['
SEP_TEXT = ']", "typed_text": "'
NO_POINT_TEXT = "-1.0, -1.0"
_NUMBERS = {"0": "0.5000", "1": "1.0000"}  # canonical completions of a number by lead digit
_INF = np.iinfo(np.int32).max

# A state is a hashable tuple:
#   ("pre", pos)            inside MARKER, pos characters written
#   ("type", prefix)        writing the action type
#   ("seg", T, i, sub)      in segment i of type T's segments; sub: characters written of a
#                           literal, of a number ("" / "0" / "0." / "0.1" ...; only the lead
#                           digit and the length matter, digits are kept as "0"/"1" and "d"),
#                           or 0/1 = no character / some characters of a typed text
#   ("end",)                the action is complete: only end-of-sequence
#   ("done",)               end-of-sequence written
# and, for a tokenizer, ("first",): the start, before the first token (decoded alone, which
# for a transformers T5 tokenizer drops every "▁" of that piece, not only the leading one).
State = tuple
FIRST: State = ("first",)


def _segments(action_type: str) -> tuple[tuple[str, ...], ...]:
    """What follows the action type, as ("lit", s) / ("num",) / ("text",) segments."""
    point = ([("num",), ("lit", ", "), ("num",)] if action_type == "DUAL_POINT"
             else [("lit", NO_POINT_TEXT)])
    segs: list[tuple[str, ...]] = [("lit", SEP_TOUCH), *point, ("lit", SEP_LIFT), *point,
                                   ("lit", SEP_TEXT)]
    if action_type == "TYPE":
        segs.append(("text",))
    segs.append(("lit", '"'))
    merged: list[tuple[str, ...]] = []
    for s in segs:  # adjacent literals make one
        if merged and s[0] == "lit" and merged[-1][0] == "lit":
            merged[-1] = ("lit", merged[-1][1] + s[1])
        else:
            merged.append(s)
    return tuple(merged)


class ActionGrammar:
    """The character automaton of the action language (module docstring). Pure Python."""

    def __init__(self) -> None:
        self.segments = {t: _segments(t) for t in TYPES}

    start: State = ("pre", 0)

    def _enter(self, action_type: str, i: int) -> State:
        """The state at the start of segment ``i`` (the end state past the last one)."""
        if i >= len(self.segments[action_type]):
            return ("end",)
        kind = self.segments[action_type][i][0]
        return ("seg", action_type, i, 0 if kind == "text" else "")

    def step(self, state: State, ch: str) -> State | None:
        """The state after character ``ch``, or None if ``ch`` leaves the language."""
        kind = state[0]
        if kind == "pre":
            pos = state[1]
            if pos == 0 and ch == " ":
                return state
            if MARKER[pos] != ch:
                return None
            return ("type", "") if pos + 1 == len(MARKER) else ("pre", pos + 1)
        if kind == "type":
            prefix = state[1]
            if prefix in self.segments:  # a whole type name: its first separator follows
                return self.step(self._enter(prefix, 0), ch)
            longer = prefix + ch
            return ("type", longer) if any(t.startswith(longer) for t in TYPES) else None
        if kind != "seg":
            return None  # nothing follows the end
        _, t, i, sub = state
        seg = self.segments[t][i]
        if seg[0] == "lit":
            lit = seg[1]
            if lit[len(sub)] != ch:
                return None
            sub += ch
            return self._enter(t, i + 1) if len(sub) == len(lit) else ("seg", t, i, sub)
        if seg[0] == "num":  # 0.dddd or 1.0000
            n = len(sub)
            if n == 0:
                ok = ch in "01"
            elif n == 1:
                ok = ch == "."
            else:
                ok = ch == "0" if sub[0] == "1" else ch.isascii() and ch.isdigit()
            if not ok:
                return None
            sub += ch if n < 2 else "d"
            return self._enter(t, i + 1) if len(sub) == 6 else ("seg", t, i, sub)
        # typed text: any character but a quote or a newline; a quote ends a non-empty one
        if ch == '"':
            return self.step(self._enter(t, i + 1), ch) if sub else None
        if ch == "\n":
            return None
        return ("seg", t, i, 1)

    def feed(self, state: State | None, text: str) -> State | None:
        for ch in text:
            if state is None:
                return None
            state = self.step(state, ch)
        return state

    def completions(self, state: State) -> list[str]:
        """Candidate shortest ways to finish from ``state`` (the end-of-sequence excluded)."""
        kind = state[0]
        if kind in ("end", "done"):
            return [""]
        if kind == "pre":
            head = MARKER[state[1]:]
            return [head + t + self._rest(t, 0) for t in TYPES]
        if kind == "type":
            p = state[1]
            return [t[len(p):] + self._rest(t, 0) for t in TYPES if t.startswith(p)]
        _, t, i, sub = state
        seg = self.segments[t][i]
        if seg[0] == "lit":
            here = seg[1][len(sub):]
        elif seg[0] == "num":
            here = ("0.5000", "1.0000") if not sub else (_NUMBERS[sub[0]][len(sub):],)
            return [h + self._rest(t, i + 1) for h in here]
        else:
            here = "" if sub else "a"
        return [here + self._rest(t, i + 1)]

    def _rest(self, action_type: str, i: int) -> str:
        out = []
        for seg in self.segments[action_type][i:]:
            out.append(seg[1] if seg[0] == "lit" else "0.5000" if seg[0] == "num" else "a")
        return "".join(out)


def _special_ids(tokenizer: Any) -> set[int]:
    """Token ids that must never be written (unknown, padding, control pieces)."""
    sp = getattr(tokenizer, "sp", None)
    if sp is not None:  # SPTokenizer
        return {i for i in range(sp.GetPieceSize()) if sp.IsControl(i) or sp.IsUnknown(i)}
    tok = getattr(tokenizer, "tok", None)
    if tok is not None:  # HFTokenizer
        return set(tok.all_special_ids)
    return set()


def _anchor_id(tokenizer: Any) -> int:
    """A token that decodes to a plain character, to decode every other token after it."""
    sp = getattr(tokenizer, "sp", None)
    if sp is not None:
        ids = sp.EncodeAsIds("a")
    else:
        ids = tokenizer.tok.encode("a", add_special_tokens=False)
    return int(ids[-1])


def token_strings(tokenizer: Any) -> tuple[list[str | None], list[str | None], set[int]]:
    """Each token's text, first and after another token, and the tokens that end decoding.

    Decoded through the tokenizer's own ``batch_decode`` (so with its treatment of spaces and
    special tokens): the text of token ``i`` after others is ``decode([a, i])`` minus
    ``decode([a])`` for a plain token ``a``; as the first token, ``decode([i])`` (a T5
    tokenizer drops the spaces of the first piece). None for tokens that must never be
    written: special ones, empty ones, and byte pieces that decode to no whole character.

    Returns:
        (strings, first, ends): ``strings[i]`` the text of token ``i`` after another (or
        None), ``first[i]`` as the first token; ``ends`` the ids that end decoding
        (end-of-sequence, and a sentencepiece ``</s>`` piece, which
        :meth:`SPTokenizer.decode` stops at).
    """
    vocab = int(tokenizer.vocab_size)
    a = _anchor_id(tokenizer)
    base = tokenizer.batch_decode([[a]])[0]
    alone = tokenizer.batch_decode([[i] for i in range(vocab)])
    pairs = tokenizer.batch_decode([[a, i] for i in range(vocab)])
    triples = tokenizer.batch_decode([[a, i, a] for i in range(vocab)])
    special = _special_ids(tokenizer)
    ends = {int(tokenizer.eos_token_id)}
    strings: list[str | None] = []
    first: list[str | None] = []
    for i, (d1, d2, d3) in enumerate(zip(alone, pairs, triples)):
        s = d2[len(base):] if d2.startswith(base) else None
        if i not in special and d3 == base and s == "":
            ends.add(i)  # decoding stops at it: an end of sequence
        if i in special or i in ends or not s or "\ufffd" in s:
            s = d1 = None
        strings.append(s)
        # alone, a piece may decode to nothing (a T5 "▁"): allowed, it only starts the text
        first.append(d1 if d1 is not None and "\ufffd" not in d1 else None)
    return strings, first, ends


class ActionVocabulary:
    """One tokenizer's view of the grammar: per state, which tokens are allowed and how many
    tokens the shortest finish takes after each (computed on first use, then cached).

    Args:
        tokenizer: an :class:`SPTokenizer` or :class:`HFTokenizer`.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.grammar = ActionGrammar()
        self.strings, self.first_strings, self.ends = token_strings(tokenizer)
        self.eos_id = int(tokenizer.eos_token_id)
        self.size = len(self.strings)
        self._by_first = self._index(self.strings)
        self._by_first_alone = self._index(self.first_strings)
        self._lookup = {s for s in self.strings if s}
        self._max_len = max((len(s) for s in self._lookup), default=1)
        self._need: dict[State, int] = {}
        self._after: dict[State, tuple[torch.Tensor, dict[int, State], int, torch.Tensor]] = {}
        self._tokens_of: dict[str, int] = {}

    @staticmethod
    def _index(strings: list[str | None]) -> dict[str, list[int]]:
        """Token ids by their first character."""
        out: dict[str, list[int]] = {}
        for i, s in enumerate(strings):
            if s:
                out.setdefault(s[0], []).append(i)
        return out

    def min_tokens(self, text: str) -> int:
        """The fewest tokens of this vocabulary that write ``text`` (a large number if none)."""
        hit = self._tokens_of.get(text)
        if hit is not None:
            return hit
        n = len(text)
        best = [0] + [_INF] * n
        for i in range(n):
            if best[i] == _INF:
                continue
            for j in range(i + 1, min(n, i + self._max_len) + 1):
                if best[i] + 1 < best[j] and text[i:j] in self._lookup:
                    best[j] = best[i] + 1
        self._tokens_of[text] = best[n]
        return best[n]

    def need(self, state: State) -> int:
        """Tokens the shortest finish from ``state`` takes, end-of-sequence included."""
        if state[0] == "done":
            return 0
        hit = self._need.get(state)
        if hit is None:
            best = min(self.min_tokens(c) for c in self.grammar.completions(state))
            hit = _INF if best == _INF else best + 1
            self._need[state] = hit
        return hit

    def _table(self, state: State) -> tuple[torch.Tensor, dict[int, State], int, torch.Tensor]:
        """(need_after, next, most, free): ``need_after[i]`` the tokens still needed after
        writing token ``i`` (int32, a large number where ``i`` is not allowed), ``next`` its
        state; ``free`` the allowed tokens when the budget is at least ``most``."""
        key, hit = state, self._after.get(state)
        if hit is not None:
            return hit
        need_after = np.full(self.size, _INF, dtype=np.int64)
        nxt: dict[int, State] = {}
        if state[0] in ("end", "done"):
            need_after[self.eos_id] = 0
            if state[0] == "end":
                for i in self.ends:
                    need_after[i] = 0
        else:
            g = self.grammar
            strings, index = self.strings, self._by_first
            if state == FIRST:
                strings, index, state = self.first_strings, self._by_first_alone, g.start
                for i, s in enumerate(strings):
                    if s == "":
                        need_after[i], nxt[i] = self.need(state), state
            for first, ids in index.items():
                s1 = g.step(state, first)
                if s1 is None:
                    continue
                for i in ids:
                    s = g.feed(s1, strings[i][1:])  # type: ignore[index]
                    if s is not None:
                        need_after[i] = self.need(s)
                        nxt[i] = s
        finite = need_after < _INF
        most = int(need_after[finite].max()) if finite.any() else _INF
        hit = (torch.from_numpy(need_after.astype(np.int32)), nxt, most,
               torch.from_numpy(finite))
        self._after[key] = hit
        return hit

    def advance(self, state: State, token: int) -> State:
        """The state after writing ``token``."""
        if state[0] == "done" or token in self.ends:
            return ("done",)
        nxt = self._table(state)[1].get(token)
        return nxt if nxt is not None else ("done",)  # only where the mask was bypassed

    def feed_ids(self, ids: Sequence[int]) -> State:
        state: State = FIRST
        for t in ids:
            state = self.advance(state, int(t))
        return state

    def allowed(self, state: State, budget: int) -> torch.Tensor:
        """(V,) bool: the tokens allowed in ``state`` when at most ``budget`` more tokens may
        follow this one. Never all False: when nothing fits the budget, the tokens with the
        shortest finish; in a state with no way on (not reachable through the mask), the
        end-of-sequence."""
        need_after, _, most, free = self._table(state)
        if budget >= most:
            return free
        ok = need_after <= budget
        if not bool(ok.any()):
            least = int(need_after.min())
            if least < _INF:
                ok = need_after == least
            else:
                ok = torch.zeros(self.size, dtype=torch.bool)
                ok[self.eos_id] = True
        return ok


_PER_TOKENIZER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def per_tokenizer(cls: type, tokenizer: Any) -> Any:
    """One ``cls(tokenizer)`` per tokenizer object, built on first use and dropped with the
    tokenizer (the grammar's :class:`ActionVocabulary`, the copy rule's vocabulary)."""
    built = _PER_TOKENIZER.setdefault(tokenizer, {})
    if cls not in built:
        built[cls] = cls(tokenizer)
    return built[cls]


def _vocabulary(tokenizer: Any) -> ActionVocabulary:
    """The tokenizer's :class:`ActionVocabulary` (:func:`per_tokenizer`)."""
    return per_tokenizer(ActionVocabulary, tokenizer)


class ActionLogitsProcessor(LogitsProcessor):
    """Masks every token that would take a row out of the action language (one per
    ``generate`` call: it follows each row's state from step to step).

    Args:
        vocabulary: the tokenizer's :class:`ActionVocabulary`.
        max_new_tokens: the generation's cap; an action must end within it.
    """

    def __init__(self, vocabulary: ActionVocabulary, max_new_tokens: int,
                 prompt_length: int = 1) -> None:
        self.vocab = vocabulary
        self.max_new_tokens = int(max_new_tokens)
        # ids before the action in generate()'s input_ids: an encoder-decoder's decoder
        # start token (1), a decoder-only model's whole (left-padded) prompt
        self.prompt_length = int(prompt_length)
        self._states: list[State] | None = None
        self._length = -1

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # input_ids: (B, t) the prompt_length ids before the action, then the action's so
        # far; scores: (B, V_model)
        batch, t = input_ids.shape
        p = self.prompt_length
        if self._states is not None and t == self._length + 1 and len(self._states) == batch:
            last = input_ids[:, -1].tolist()
            self._states = [self.vocab.advance(s, tok) for s, tok in zip(self._states, last)]
        else:
            self._states = [self.vocab.feed_ids(row[p:]) for row in input_ids.tolist()]
        self._length = t
        budget = self.max_new_tokens - (t - p + 1)  # tokens that may follow this one
        rows: dict[State, torch.Tensor] = {}
        for s in self._states:
            if s not in rows:
                rows[s] = self.vocab.allowed(s, budget)
        mask = torch.stack([rows[s] for s in self._states])  # (B, V_tokenizer)
        n = scores.shape[-1]
        if mask.shape[1] != n:  # a model head wider than the tokenizer: the rest is masked
            mask = torch.nn.functional.pad(mask, (0, n - mask.shape[1]))[:, :n]
        return scores.masked_fill(~mask.to(scores.device), float("-inf"))


def action_logits_processor(tokenizer: Any, max_new_tokens: int,
                            prompt_length: int = 1) -> ActionLogitsProcessor:
    """A fresh processor for one ``generate`` call (the tokenizer's tables are shared);
    ``prompt_length``: the ids before the action in ``generate``'s input_ids (1, the
    decoder start token, for Auto-UI's T5; the padded prompt for a decoder-only VLM)."""
    return ActionLogitsProcessor(_vocabulary(tokenizer), max_new_tokens, prompt_length)
