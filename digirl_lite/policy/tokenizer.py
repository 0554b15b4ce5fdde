"""The simulator preset's tokenizer: sentencepiece, trained by :func:`train_sim_tokenizer`.

The AutoUI action string is mostly fixed scaffolding; declaring that scaffolding (and the
action type names, the prompt's ``Previous Actions:`` / ``Goal:``) as user-defined pieces,
and splitting digits, turns an action string into about 30 tokens instead of about 85, which
halves training time (shared/notes/MEASURED.md). Encoding and decoding go through
sentencepiece itself (no extra whitespace around user-defined pieces, an exact round trip)
with T5's special ids: pad 0, eos 1, unk 2.

It is trained on a world's text, given as lines (the simulator's:
:func:`digirl_lite.envs.sim.demos.sim_corpus`). Real Auto-UI checkpoints bring their own
tokenizer (:class:`HFTokenizer` wraps it).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["ACTION_PIECES", "SPTokenizer", "HFTokenizer", "train_sim_tokenizer",
           "SIM_TOKENIZER_FILE"]

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
SIM_TOKENIZER_FILE = "spiece.model"

ACTION_PIECES = (
    'Action Decision: "action_type": "',
    '", "touch_point": "[',
    ']", "lift_point": "[',
    ']", "typed_text": "',
    "DUAL_POINT", "TYPE", "PRESS_BACK", "PRESS_HOME", "PRESS_ENTER",
    "STATUS_TASK_COMPLETE", "TASK_IMPOSSIBLE",
    "-1.0, -1.0", "Previous Actions:", "Goal:", "</s>",
)
COORD_PIECES = tuple(f"0.{i:04d}" for i in range(10_000)) + ("1.0000",)
"""Every 4-decimal coordinate is one piece: the tiny model then picks a coordinate as one
token instead of counting four digits (with digits split it repeated digits, "0.0700000...",
and never produced an exact tap)."""


class SPTokenizer:
    """A sentencepiece model with T5's ids (pad 0, eos 1, unk 2); left truncation keeps
    the end of a prompt (the goal) when it is too long."""

    pad_token_id = PAD_ID
    eos_token_id = EOS_ID

    def __init__(self, model_file: str | Path | None = None, model_proto: bytes | None = None):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor()
        if model_proto is not None:
            self.sp.LoadFromSerializedProto(model_proto)
        elif model_file is not None:
            if not Path(model_file).is_file():
                raise FileNotFoundError(f"no sentencepiece model at {model_file}")
            self.sp.Load(str(model_file))
        else:
            raise ValueError("give model_file or model_proto")
        if (self.sp.pad_id(), self.sp.eos_id(), self.sp.unk_id()) != (PAD_ID, EOS_ID, UNK_ID):
            raise ValueError("the sentencepiece model must use pad 0, eos 1, unk 2 (T5's ids)")
        self._eos_piece_id = self.sp.PieceToId("</s>")

    @property
    def vocab_size(self) -> int:
        return self.sp.GetPieceSize()

    def serialized(self) -> bytes:
        return self.sp.serialized_model_proto()

    def encode(self, text: str, max_length: int | None = None) -> list[int]:
        """Token ids of ``text`` followed by eos (a literal ``</s>`` is eos too)."""
        ids = [EOS_ID if i == self._eos_piece_id else i for i in self.sp.EncodeAsIds(text)]
        if not ids or ids[-1] != EOS_ID:
            ids.append(EOS_ID)
        if max_length is not None and len(ids) > max_length:
            ids = ids[-max_length:]  # left truncation: keep the goal
        return ids

    def encode_spans(self, text: str, max_length: int | None = None
                     ) -> tuple[list[int], list[tuple[int, int]]]:
        """:meth:`encode`'s ids with each token's ``(start, end)`` character span in
        ``text`` (the eos that :meth:`encode` appends: an empty span at the end; a
        byte-fallback piece that ends inside a character: an empty span before it)."""
        proto = self.sp.encode(text, out_type="proto")
        raw = text.encode("utf-8")
        char_at = [0] * (len(raw) + 1)  # byte offset -> character offset
        b = 0
        for k, ch in enumerate(text):
            n = len(ch.encode("utf-8"))
            for j in range(n):
                char_at[b + j] = k
            b += n
        char_at[len(raw)] = len(text)
        ids, spans = [], []
        for piece in proto.pieces:
            ids.append(EOS_ID if piece.id == self._eos_piece_id else piece.id)
            spans.append((char_at[piece.begin], char_at[piece.end]))
        if not ids or ids[-1] != EOS_ID:
            ids.append(EOS_ID)
            spans.append((len(text), len(text)))
        if max_length is not None and len(ids) > max_length:
            ids, spans = ids[-max_length:], spans[-max_length:]  # as encode() cuts
        return ids, spans

    def __call__(self, texts: Sequence[str], max_length: int | None = 512,
                 spans: bool = False) -> dict[str, Any]:
        """Right-padded ``input_ids`` and ``attention_mask`` (torch tensors); ``spans``:
        also each text's token spans (:meth:`encode_spans`), a list per text."""
        import torch

        rows = [self.encode_spans(t, max_length) for t in texts] if spans else None
        seqs = [ids for ids, _ in rows] if rows else [self.encode(t, max_length) for t in texts]
        n = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), n), PAD_ID, dtype=torch.long)
        mask = torch.zeros((len(seqs), n), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        out = {"input_ids": ids, "attention_mask": mask}
        if rows:
            out["spans"] = [sp for _, sp in rows]
        return out

    def decode(self, ids: Iterable[int]) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i in (EOS_ID, self._eos_piece_id):  # a sampled literal "</s>" ends it too
                break
            if i == PAD_ID:
                continue
            out.append(i)
        return self.sp.DecodeIds(out)

    def batch_decode(self, batch) -> list[str]:
        return [self.decode(row) for row in batch]

    def save(self, directory: str | Path) -> Path:
        p = Path(directory) / SIM_TOKENIZER_FILE
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(self.serialized())
        return p


class HFTokenizer:
    """A transformers tokenizer (a real Auto-UI checkpoint's) behind the same calls."""

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        self.tok.truncation_side = "left"
        self.tok.padding_side = "right"  # AutoUIPolicy.log_prob cuts pads off the right
        self.pad_token_id = tokenizer.pad_token_id
        self.eos_token_id = tokenizer.eos_token_id

    @property
    def vocab_size(self) -> int:
        return len(self.tok)

    def __call__(self, texts: Sequence[str], max_length: int | None = 512) -> dict[str, Any]:
        enc = self.tok(list(texts), return_tensors="pt", padding=True,
                       truncation=max_length is not None, max_length=max_length)
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    def batch_decode(self, batch) -> list[str]:
        return self.tok.batch_decode(batch, skip_special_tokens=True)

    def save(self, directory: str | Path) -> None:
        self.tok.save_pretrained(str(directory))


def train_sim_tokenizer(lines: Sequence[str], vocab_size: int = 11_000,
                        seed: int = 0) -> SPTokenizer:
    """Train the preset's sentencepiece model (unigram) on ``lines``; deterministic."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.Train(
        sentence_iterator=iter(lines), model_writer=buf, vocab_size=vocab_size,
        model_type="unigram", character_coverage=1.0, byte_fallback=True, split_digits=True,
        # pieces are matched after spaces become "▁" (U+2581)
        user_defined_symbols=[p.replace(" ", "\u2581") for p in ACTION_PIECES]
        + list(COORD_PIECES),
        pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        pad_piece="<pad>", eos_piece="<eos>", unk_piece="<unk>",
        add_dummy_prefix=False, remove_extra_whitespaces=False, normalization_rule_name="identity",
        num_threads=1, minloglevel=2, max_sentence_length=4096,
        shuffle_input_sentence=False, hard_vocab_limit=False,
    )
    return SPTokenizer(model_proto=buf.getvalue())
