"""The AutoUI multimodal T5 (spec/DIGIRL.md section 3) on the transformers 5.x API.

image vector (B, d_img) -> Linear(d_img, d_model) -> one-head attention from every encoder
state h to it gives v; gate g = sigmoid(W [h; v]); fused = (1 - g) * h + g * v; the T5
decoder writes the action string from the fused states.

Weight names follow Auto-UI / DigiRL (``image_dense``, ``mha_layer``, ``gate_dense`` beside
T5's ``shared``, ``encoder``, ``decoder``, ``lm_head``), so their checkpoints load as they are.

``generate()`` takes ``image_ids`` and fuses once: the encoder that generation calls is the
fused encoder (:class:`_FusedEncoder`), so every decoding step reuses the fused states.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import T5Config, T5ForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutput

__all__ = ["AutoUIModel", "last_frame"]


def last_frame(image_ids: torch.Tensor, img_dim: int) -> torch.Tensor:
    """(B, d) or (B, 2d) two-frame features -> (B, d): the policy sees the last frame."""
    if image_ids.dim() == 3:  # (B, 1, d): already a one-token image
        image_ids = image_ids[:, -1]
    if image_ids.shape[-1] == img_dim:
        return image_ids
    if image_ids.shape[-1] % img_dim == 0:
        return image_ids[..., -img_dim:]
    raise ValueError(f"image features have {image_ids.shape[-1]} floats per row; this policy "
                     f"takes {img_dim} (one frame) or a multiple (stacked frames)")


class _FusedEncoder:
    """What ``generate()`` calls as the encoder: T5's encoder followed by the image fusion.

    Not a registered submodule (its weights belong to the model), so ``state_dict`` names
    stay Auto-UI's.
    """

    def __init__(self, model: AutoUIModel) -> None:
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model.encoder, name)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, input_ids=None, attention_mask=None, image_ids=None, inputs_embeds=None,
                output_attentions=None, output_hidden_states=None, return_dict=True, lang=None):
        m = self._model
        if m.lang_dim:
            if lang is None:
                raise ValueError("this AutoUIModel reads goal features (config.lang_dim "
                                 f"{m.lang_dim}): pass lang, (B, T, {m.lang_dim})")
            if inputs_embeds is None:
                inputs_embeds = m.shared(input_ids)
            if lang.shape[-1] == m.lang_dim + 1:  # GoalFeatures.known_words' flags: a goal
                # word the training text never held is read through the features alone
                # (its tokens' own embeddings were never trained on it), acting and training
                inputs_embeds = inputs_embeds * (lang[..., -1:] <= 0.5)
                lang = lang[..., :-1]
            if m.lang_token_dropout >= 1.0 or (m.training and m.lang_token_dropout > 0):
                # the goal's own token embeddings dropped at random while training, so the
                # model learns to read the goal through the pretrained features too: with
                # both, it found the product from the few train phrasings' own words and cut
                # held-out phrasings at the wrong words (benchmarks/span_generalization.py).
                # At 1 they are never read, in training or acting: the features alone, so a
                # word no training line holds has no untrained embedding of its own to read
                goal = lang.abs().sum(-1, keepdim=True) > 0
                drop = torch.rand(goal.shape, device=goal.device) < m.lang_token_dropout
                inputs_embeds = inputs_embeds * ~(goal & drop)
            inputs_embeds = inputs_embeds + m.lang_dense(lang.to(inputs_embeds.dtype))
            input_ids = None
        out = m.encoder(input_ids=input_ids, attention_mask=attention_mask,
                        inputs_embeds=inputs_embeds, output_attentions=output_attentions,
                        output_hidden_states=output_hidden_states, return_dict=True)
        if image_ids is None:
            raise ValueError("AutoUIModel needs image_ids (the screenshot's features)")
        fused = m.fuse(out.last_hidden_state, image_ids)
        return BaseModelOutput(last_hidden_state=fused, hidden_states=out.hidden_states,
                               attentions=out.attentions)


class AutoUIModel(T5ForConditionalGeneration):
    """T5 with the gated image fusion of Auto-UI.

    Args:
        config: a T5Config; ``config.img_dim`` (default 1408, BLIP-2) is the image size;
            ``config.img_scale`` (default 1.0, Auto-UI's fusion exactly) multiplies the image
            vector before the fusion; ``config.lang_dim`` (default 0: none) the size of
            the goal features added to the token embeddings (``lang_dense``; one more
            channel, where given, flags the tokens whose own embeddings are dropped:
            :mod:`digirl_lite.policy.goal_features`, whose encoder ``config.goal_encoder``
            names); ``config.lang_token_dropout`` (default 0) the chance that a goal token's
            own embedding is dropped in training mode (1: always, acting too);
            ``config.frozen_token_embeddings``
            (default False) keeps the token embeddings (and the head tied to them) out of
            training (a pretrained table: ``config.token_embeddings``).
    """

    def __init__(self, config: T5Config) -> None:
        super().__init__(config)
        d = config.d_model
        self.img_dim = int(getattr(config, "img_dim", 1408))
        config.img_dim = self.img_dim
        self.img_scale = float(getattr(config, "img_scale", 1.0))
        config.img_scale = self.img_scale
        self.image_dense = nn.Linear(self.img_dim, d)
        self.mha_layer = nn.MultiheadAttention(embed_dim=d, num_heads=1, batch_first=True)
        self.gate_dense = nn.Linear(2 * d, d)
        self.lang_dim = int(getattr(config, "lang_dim", 0) or 0)
        config.lang_dim = self.lang_dim
        self.lang_token_dropout = float(getattr(config, "lang_token_dropout", 0.0) or 0.0)
        config.lang_token_dropout = self.lang_token_dropout
        if self.lang_dim:
            self.lang_dense = nn.Linear(self.lang_dim, d)
        self.post_init()
        self.frozen_token_embeddings = bool(getattr(config, "frozen_token_embeddings", False))
        config.frozen_token_embeddings = self.frozen_token_embeddings
        if self.frozen_token_embeddings:  # (AutoUIPolicy freezes them again after a load)
            self.shared.weight.requires_grad_(False)
        if self.lang_dim:  # T5's init draws it at std 1: ten times the token embeddings'
            # norm, which drowned which token a position holds (what copying needs)
            with torch.no_grad():
                self.lang_dense.weight.normal_(0.0, self.lang_dim ** -0.5)
                self.lang_dense.bias.zero_()

    def fuse(self, hidden: torch.Tensor, image_ids: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model) encoder states + (B, d_img) image -> (B, T, d_model) fused states."""
        img = last_frame(image_ids, self.img_dim).to(hidden.dtype)
        if self.img_scale != 1.0:
            img = img * self.img_scale
        emb = self.image_dense(img).unsqueeze(1)  # (B, 1, d_model)
        att, _ = self.mha_layer(hidden, emb, emb, need_weights=False)  # (B, T, d_model)
        gate = torch.sigmoid(self.gate_dense(torch.cat([hidden, att], dim=-1)))
        return (1 - gate) * hidden + gate * att

    def action_token_log_probs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                               image_ids: torch.Tensor, labels: torch.Tensor,
                               label_mask: torch.Tensor, lang: torch.Tensor | None = None
                               ) -> torch.Tensor:
        """(B, T) teacher-forced log-probabilities of ``labels`` (0 where ``label_mask`` is 0).

        The same numbers as ``log_softmax(self(..., labels=labels).logits)`` gathered at the
        labels, at about half the cost: the output head and the softmax over the vocabulary
        run only on the real action tokens (half of a padded batch's positions are pads on
        the simulator), and no second, unused loss is computed (issue 16's profile: the
        head's log-softmax was 30% of an actor update, half of it the model's own loss).
        """
        return self.action_token_outputs(input_ids, attention_mask, image_ids, labels,
                                         label_mask, lang)[0]

    def action_token_outputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                             image_ids: torch.Tensor, labels: torch.Tensor,
                             label_mask: torch.Tensor, lang: torch.Tensor | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`action_token_log_probs` and the decoder's last hidden states that predict
        each label, (B, T) and (B, T, d_model) (a value head reads the latter: the state
        from which token t is written)."""
        enc = _FusedEncoder(self).forward(input_ids=input_ids, attention_mask=attention_mask,
                                          image_ids=image_ids, lang=lang)
        dec = self.decoder(input_ids=self._shift_right(labels), attention_mask=label_mask,
                           encoder_hidden_states=enc.last_hidden_state,
                           encoder_attention_mask=attention_mask)
        hidden = dec.last_hidden_state
        sel = label_mask.bool()
        logits = self.head_logits(hidden[sel]).float()
        tok = -F.cross_entropy(logits, labels[sel], reduction="none")
        return torch.zeros(labels.shape, dtype=tok.dtype, device=tok.device).masked_scatter(
            sel, tok), hidden

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output head on the decoder's final states (..., d_model) -> (..., vocab),
        scaled first as T5's own forward does when the head is tied to the embeddings."""
        if getattr(self.config, "scale_decoder_outputs", self.config.tie_word_embeddings):
            hidden = hidden * (self.model_dim ** -0.5)
        return self.lm_head(hidden)

    def get_encoder(self, *args, **kwargs):
        return _FusedEncoder(self)

    def forward(self, input_ids=None, attention_mask=None, image_ids=None,
                decoder_input_ids=None, decoder_attention_mask=None, encoder_outputs=None,
                labels=None, lang=None, **kwargs):
        if encoder_outputs is None:
            encoder_outputs = _FusedEncoder(self).forward(
                input_ids=input_ids, attention_mask=attention_mask, image_ids=image_ids,
                inputs_embeds=kwargs.pop("inputs_embeds", None), lang=lang)
        # encoder_outputs from generate() are already fused
        return super().forward(attention_mask=attention_mask, encoder_outputs=encoder_outputs,
                               decoder_input_ids=decoder_input_ids,
                               decoder_attention_mask=decoder_attention_mask, labels=labels,
                               **kwargs)
