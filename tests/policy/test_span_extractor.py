"""The typed-span extractor (digirl_lite.policy.span_extractor, issue 32 item 5): MiniLM
fine-tuned on train pairs picks the product's span, word-aligned, in the copy mask's
coordinates; the web addresses are always offered; it saves and loads without pickles; the
config names the field and the run's copy mask gets it."""

from __future__ import annotations

import pytest
import torch

from digirl_lite.envs.sim.drills import extractor_pairs
from digirl_lite.policy.span_extractor import SpanExtractor, address_spans


def test_address_spans_are_whole_words():
    src = "at ebay.com, look up x.y z on bestbuy.com and e.g.x"
    got = [src[a:b] for a, b in address_spans(src)]
    assert got[:3] == ["ebay.com", "x.y", "bestbuy.com"]


def test_pairs_are_train_tasks_and_drills_with_their_typed_text():
    pairs = extractor_pairs("webshop", 0.5, "wide", 0, 50)
    assert len(pairs) > 300
    for text, typed in pairs:
        assert typed.lower() in " ".join(text.lower().split()), (text, typed)
    held = set((__import__("digirl_lite.paths", fromlist=["data_dir"]).data_dir() / "tasks" /
                "webshop_unseen_phrasings.txt").read_text().splitlines())
    assert not held & {t for t, _ in pairs}  # never a held-out line


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    ex = SpanExtractor.pretrained(seed=0)
    fit = ex.fit(extractor_pairs("webshop", 0.5, "base", 0, 200), steps=40, batch=16, seed=0)
    return ex, fit


@pytest.mark.slow  # a MiniLM fine-tune: about a minute on 2 cores
def test_a_short_fine_tune_finds_products_and_round_trips(trained, tmp_path):
    ex, fit = trained
    assert fit["pairs"] > 300 and fit["final_loss"] < 3.0
    tests = {'Go to costco.com, search for "bose soundsport free", and select the first entry':
             "bose soundsport free",
             "Search for logitech g305 on walmart.com": "logitech g305"}
    for text, product in tests.items():
        src = " ".join(text.lower().split())
        spans = ex.spans(text)
        got = {src[a:b] for a, b in spans}
        assert product in got, (text, got)
        assert any(src[a:b].endswith(".com") for a, b in spans)  # the address, always
        for a, b in spans:  # whole words
            assert (a == 0 or not src[a - 1].isalnum()) and (b == len(src)
                                                              or not src[b].isalnum())
    ex.save(tmp_path / "x")
    again = SpanExtractor.load(tmp_path / "x")
    for text in tests:
        assert again.spans(text) == ex.spans(text)
    with pytest.raises(FileNotFoundError, match="no saved SpanExtractor"):
        SpanExtractor.load(tmp_path)


@pytest.mark.slow
def test_config_names_the_field_and_keys_the_pile(tmp_path):
    from digirl_lite.errors import ConfigError
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    with pytest.raises(ConfigError, match="set copy_typed_text true"):
        sim_quick(typed_span_extractor="minilm")
    with pytest.raises(ConfigError, match="typed_span_extractor must be"):
        sim_quick(typed_span_extractor="bert", copy_typed_text=True)
    on = sim_quick(typed_span_extractor="minilm", copy_typed_text=True)
    off = sim_quick(copy_typed_text=True)
    wide = sim_quick(typed_span_extractor="minilm", copy_typed_text=True,
                     typed_span_phrasings="wide")
    once = sim_quick(typed_span_extractor="minilm", copy_typed_text=True,
                     typed_span_phrasings="wide", typed_span_once=True)
    keys = {Trainer(c, tmp_path / str(i), cache_dir=None, progress=False).pile_key()
            for i, c in enumerate((on, off, wide, once))}
    assert len(keys) == 4
    with pytest.raises(ConfigError, match="typed_span_once applies to the copy mask"):
        sim_quick(typed_span_once=True)
    assert Trainer(off, tmp_path / "o", cache_dir=None, progress=False).copy_text() is True
    with pytest.raises(ConfigError, match="typed_span_phrasings: there is no span extractor"):
        sim_quick(typed_span_phrasings="wide")
    with pytest.raises(ConfigError, match="typed_span_phrasings must be one of"):
        sim_quick(typed_span_phrasings="narrow", typed_span_extractor="minilm",
                  copy_typed_text=True)


def test_the_extractors_phrasings_key_its_cache(tmp_path):
    """``typed_span_phrasings`` trains the extractor on its own phrasings: another key, found
    in the cache by it (a cached one of the other phrasings is never read); unset, the key
    follows the starting policy's phrasings as before."""
    import json

    from digirl_lite.paths import content_key
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.starting import SPAN_EXTRACTOR_STEPS, span_extractor

    seen: list[dict] = []
    for ph in (None, "wide"):
        c = sim_quick(typed_span_extractor="minilm", copy_typed_text=True,
                      sft_phrasing_share=0.5, typed_span_phrasings=ph)
        key = content_key("spanx-v1", "minilm", c.world, 0.5, ph or "base", c.sft_seed,
                          SPAN_EXTRACTOR_STEPS, 0)
        d = tmp_path / f"spanx-{key}"
        d.mkdir()
        (d / "span_extractor.json").write_text(json.dumps({"max_width": 16}))
        with pytest.raises(OSError):  # found by its key: the (empty) saved one is opened
            span_extractor(c, cache_dir=tmp_path, log=lambda **kw: seen.append(kw))
        assert seen[-1]["loaded"] == str(d)


def test_train_layers_fine_tunes_only_the_top_layers():
    """``fit(train_layers=k)``: the embeddings and the layers below the top k keep their
    pretrained weights, the top k and the head move; a k outside the encoder is refused."""
    ex = SpanExtractor.pretrained(seed=0)
    layers = ex.model.encoder.layer
    before = {n: p.detach().clone() for n, p in ex.model.named_parameters()}
    pairs = extractor_pairs("webshop", 0.0, "base", 0, 0)[:8]
    ex.fit(pairs, steps=2, batch=4, lr=1e-3, seed=0, train_layers=1)
    top = f"encoder.layer.{len(layers) - 1}."
    moved = {n for n, p in ex.model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all(n.startswith(top) for n in moved)
    with pytest.raises(ValueError, match="train_layers must be in 0..6"):
        ex.fit(pairs, steps=1, batch=4, train_layers=7)
