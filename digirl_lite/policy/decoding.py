"""The AutoUI model's decoding loop, written out: the fused encoder once, then one decoder
step per token with its own key/value cache.

``generate()`` on the simulator preset (128-wide, 2-layer T5) spent about three quarters of
its time in Python around the model (issue 16's profile: the model's ``linear`` calls were
~25% of a sampling call): the generation machinery, cache objects, mask construction and
the decoder's relative-position buckets recomputed at every step. :func:`decode` keeps the
arithmetic of T5's eager attention and of ``generate()``'s greedy loop (the logits
processors, the pads after eos, the stop when every row has ended) and drops the rest: the
self-attention keys and values go into preallocated tensors, the cross-attention's are
projected once from the fused encoder states, the position bias is computed once for the
whole action. ``tests/policy/test_decoding.py`` checks it against ``generate()``: the same tokens
and per-token log-probabilities, sampled and greedy, with and without the grammar.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

__all__ = ["decode"]

Processor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, H*dk) -> (B, H, T, dk)."""
    b, t, _ = x.shape
    return x.view(b, t, n_heads, -1).transpose(1, 2)


@torch.no_grad()
def decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
           image_ids: torch.Tensor, max_new_tokens: int, eos_token_id: int,
           pad_token_id: int, processors: Sequence[Processor] = (),
           lang: torch.Tensor | None = None) -> torch.Tensor:
    """Greedy decoding over the processed scores, as ``model.generate(do_sample=False,
    logits_processor=processors)`` does it (a :class:`~digirl_lite.policy.sampling.
    CategoricalSampler` last among the processors makes it sampling).

    Args:
        model: an :class:`~digirl_lite.policy.model.AutoUIModel` (in eval mode).
        input_ids, attention_mask: (B, S) the prompts.
        image_ids: (B, d_img) or two stacked frames.
        max_new_tokens: at most this many tokens after the decoder start.
        eos_token_id, pad_token_id: a row ends at eos and is padded after it.
        processors: called in order on ``(ids so far, float32 scores (B, V))``, the ids
            starting with the decoder start token.
        lang: (B, S, lang_dim) goal features, for a model that reads them.

    Returns:
        (B, 1 + steps) token ids, the decoder start token first; ``steps <= max_new_tokens``,
        fewer when every row has written eos.
    """
    from digirl_lite.policy.model import _FusedEncoder

    cfg = model.config
    dec = model.decoder
    enc = _FusedEncoder(model).forward(input_ids=input_ids, attention_mask=attention_mask,
                                       image_ids=image_ids, lang=lang).last_hidden_state
    b, device = enc.shape[0], enc.device
    n_heads = cfg.num_heads
    blocks = list(dec.block)
    # cross-attention: keys and values of the fused states, once; pads masked additively
    cross_kv = []
    for block in blocks:
        att = block.layer[1].EncDecAttention
        cross_kv.append((_heads(F.linear(enc, att.k.weight), n_heads),
                         _heads(F.linear(enc, att.v.weight), n_heads)))
    cross_mask = torch.zeros(b, 1, 1, enc.shape[1], dtype=enc.dtype, device=device)
    cross_mask.masked_fill_(~attention_mask.bool()[:, None, None, :], torch.finfo(enc.dtype).min)
    # self-attention: the relative position bias of every (query, key) pair of the action
    steps = max(int(max_new_tokens), 0)
    bias = blocks[0].layer[0].SelfAttention.compute_bias(max(steps, 1), max(steps, 1),
                                                         device=device).to(enc.dtype)
    dk = cfg.d_kv
    keys = [torch.zeros(b, n_heads, steps, dk, dtype=enc.dtype, device=device) for _ in blocks]
    values = [torch.zeros_like(k) for k in keys]
    qkv = [torch.cat([block.layer[0].SelfAttention.q.weight, block.layer[0].SelfAttention.k.weight,
                      block.layer[0].SelfAttention.v.weight]) for block in blocks]

    ids = torch.full((b, steps + 1), pad_token_id, dtype=torch.long, device=device)
    ids[:, 0] = cfg.decoder_start_token_id
    unfinished = torch.ones(b, dtype=torch.long, device=device)
    n = 0
    for t in range(steps):
        x = dec.embed_tokens(ids[:, t:t + 1])  # (B, 1, d)
        for i, block in enumerate(blocks):
            sa = block.layer[0].SelfAttention
            q, k, v = F.linear(block.layer[0].layer_norm(x), qkv[i]).split(
                sa.inner_dim, dim=-1)
            keys[i][:, :, t] = k.view(b, n_heads, dk)
            values[i][:, :, t] = v.view(b, n_heads, dk)
            s = torch.matmul(_heads(q, n_heads), keys[i][:, :, :t + 1].transpose(2, 3))
            w = torch.softmax(s + bias[:, :, t:t + 1, :t + 1], dim=-1)
            a = torch.matmul(w, values[i][:, :, :t + 1]).transpose(1, 2).reshape(b, 1, -1)
            x = x + F.linear(a, sa.o.weight)
            ca = block.layer[1].EncDecAttention
            q = _heads(F.linear(block.layer[1].layer_norm(x), ca.q.weight), n_heads)
            ck, cv = cross_kv[i]
            w = torch.softmax(torch.matmul(q, ck.transpose(2, 3)) + cross_mask, dim=-1)
            a = torch.matmul(w, cv).transpose(1, 2).reshape(b, 1, -1)
            x = x + F.linear(a, ca.o.weight)
            x = block.layer[2](x)  # T5's own feed-forward (dropout off in eval)
        h = dec.final_layer_norm(x)[:, 0]
        scores = model.head_logits(h).to(torch.float32)
        for p in processors:
            scores = p(ids[:, :t + 1], scores)
        nxt = scores.argmax(dim=-1)
        nxt = nxt * unfinished + pad_token_id * (1 - unfinished)
        ids[:, t + 1] = nxt
        n = t + 1
        unfinished = unfinished & (nxt != eos_token_id).long()
        if not bool(unfinished.any()):
            break
    return ids[:, :n + 1]
