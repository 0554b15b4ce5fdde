"""Tiny random models in the real checkpoint layouts, built offline for tests: a BLIP-2
(``save_pretrained`` of ``Blip2Model`` plus its image processor), a RoBERTa (with a WordLevel
tokenizer) and an Auto-UI policy (config.json, model.safetensors, spiece.model)."""

from __future__ import annotations

from pathlib import Path

TINY_IMAGE = 32


def tiny_blip2_config(hidden: int = 32):
    from transformers import Blip2Config, OPTConfig

    vision = dict(hidden_size=hidden, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=4, image_size=TINY_IMAGE, patch_size=8)
    qformer = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                   intermediate_size=64, encoder_hidden_size=hidden, vocab_size=100)
    text = OPTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=32,
                     vocab_size=100, word_embed_proj_dim=16, max_position_embeddings=64)
    return Blip2Config(vision_config=vision, qformer_config=qformer,
                       text_config=text.to_dict(), num_query_tokens=4)


def save_blip2_processor(path, size: int = TINY_IMAGE) -> None:
    from transformers import BlipImageProcessorPil

    BlipImageProcessorPil(size={"height": size, "width": size}).save_pretrained(path)


def tiny_blip2_dir(path, hidden: int = 32, seed: int = 0):
    """A random ``Blip2Model`` (vision width ``hidden``: the features' width) saved to
    ``path``; its LayerNorms are perturbed so a weight that fails to load shows."""
    import torch
    from transformers import Blip2Model

    torch.manual_seed(seed)
    model = Blip2Model(tiny_blip2_config(hidden)).eval()
    with torch.no_grad():
        for p in model.vision_model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    save_blip2_processor(path)
    return Path(path), model


def tiny_roberta_dir(path, hidden: int = 32, positions: int = 40):
    """A random 2-layer RoBERTa and a WordLevel tokenizer saved to ``path`` (offline);
    ``positions``: its position table (texts of up to ``positions - 2`` tokens)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, RobertaConfig, RobertaModel

    words = ("previous actions goal go to walmart costco ebay search for the first entry "
             "news india open tap type").split()
    vocab = {w: i for i, w in enumerate(["<s>", "<pad>", "</s>", "<unk>", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            pad_token="<pad>", unk_token="<unk>",
                            model_max_length=512).save_pretrained(path)
    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=positions)
    RobertaModel(cfg).save_pretrained(path)
    return path


def tiny_autoui_dir(path, img_dim: int, seed: int = 0):
    """A random tiny Auto-UI checkpoint in the released layout: ``config.json`` (a T5 config
    with ``img_dim``), ``model.safetensors`` and the sentencepiece ``spiece.model`` (the
    simulator's, so the tiny model can write every action)."""
    import torch
    from transformers import T5Config, T5Tokenizer

    from digirl_lite.paths import data_dir
    from digirl_lite.policy import AutoUIModel, SPTokenizer

    spm = data_dir() / "tokenizer" / "spiece.model"
    cfg = T5Config(vocab_size=SPTokenizer(spm).vocab_size, d_model=32, d_kv=8, d_ff=64,
                   num_layers=1, num_decoder_layers=1, num_heads=2, decoder_start_token_id=0)
    cfg.img_dim = img_dim
    torch.manual_seed(seed)
    AutoUIModel(cfg).save_pretrained(str(path))
    T5Tokenizer(vocab_file=str(spm), extra_ids=0).save_pretrained(str(path))
    return Path(path)
