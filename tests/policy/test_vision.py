"""digirl_lite.vision: BLIP-2 features (a tiny random checkpoint), the sim encoder, the cache."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from tiny_models import (
    TINY_IMAGE,
    save_blip2_processor,
    tiny_blip2_config,
)

from digirl_lite.data import ScreenTable
from digirl_lite.data.records import screen_id_of_image
from digirl_lite.envs.sim.probes import (
    collect_sim_screens,
    drift_probe,
    loo_nn_accuracy,
    popup_probe,
    screen_label,
)
from digirl_lite.vision import FeatureCache, SimScreenEncoder


def _images(n: int, size=(27, 57), seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
            for _ in range(n)]


# ---------------------------------------------------------------------------------------
# Package
# ---------------------------------------------------------------------------------------
def test_import_is_light():
    code = (
        "import sys, digirl_lite.vision as v\n"
        "v.SimScreenEncoder, v.FeatureCache, v.Blip2Features\n"
        "print(sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_unknown_attribute():
    import digirl_lite.vision as v

    with pytest.raises(AttributeError, match="no attribute"):
        v.NoSuchThing  # noqa: B018


# ---------------------------------------------------------------------------------------
# BLIP-2 (a tiny random checkpoint saved like Salesforce/blip2-opt-2.7b)
# ---------------------------------------------------------------------------------------
# tiny_blip2: (checkpoint dir, the Blip2Model it holds), the reference code's model class,
# built once per session (tests/conftest.py)
@pytest.fixture(scope="module")
def blip(tiny_blip2):
    from digirl_lite.vision import Blip2Features

    return Blip2Features(tiny_blip2[0], device="cpu")


def test_blip2_shapes_and_dtype(blip):
    f = blip.encode(_images(3))
    assert blip.dim == 32
    assert f.shape == (3, 32) and f.dtype == np.float32
    assert np.isfinite(f).all()
    assert blip.encode([]).shape == (0, 32)
    assert blip.encode(_images(1)[0]).shape == (1, 32)  # one image, not a list


def test_blip2_matches_reference_call(blip, tiny_blip2):
    """The released code: Blip2Model.get_image_features(**processor(images)).pooler_output."""
    import torch

    imgs = _images(3, size=(270, 570))
    _, model = tiny_blip2
    with torch.no_grad():
        px = blip.processor(images=imgs, return_tensors="pt")["pixel_values"]
        ref = model.get_image_features(pixel_values=px).pooler_output.numpy()
    np.testing.assert_allclose(blip.encode(imgs), ref, rtol=1e-5, atol=1e-5)


def test_blip2_preprocessing_is_resize_rescale_normalize(blip):
    img = _images(1, size=(270, 570))[0]
    px = blip.pixel_values([img])
    assert px.shape == (1, 3, TINY_IMAGE, TINY_IMAGE)
    small = np.asarray(img.resize((TINY_IMAGE, TINY_IMAGE), Image.BICUBIC), np.float32) / 255
    mean = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)  # OpenAI CLIP's
    std = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)
    np.testing.assert_allclose(px[0], ((small - mean) / std).transpose(2, 0, 1), atol=1e-5)
    assert type(blip.processor).__name__ == "BlipImageProcessorPil"  # not the torchvision one


def test_blip2_deterministic_and_batch_invariant(blip, tiny_blip2):
    from digirl_lite.vision import Blip2Features

    imgs = _images(3, seed=1)
    batch = blip.encode(imgs)
    np.testing.assert_array_equal(batch, blip.encode(imgs))
    one_by_one = np.concatenate([blip.encode([im]) for im in imgs])
    np.testing.assert_allclose(batch, one_by_one, rtol=1e-5, atol=1e-6)
    chunked = Blip2Features(tiny_blip2[0], device="cpu", batch_size=2).encode(imgs)
    np.testing.assert_allclose(batch, chunked, rtol=1e-5, atol=1e-6)
    assert not np.allclose(batch[0], batch[1])  # different images, different features


def test_blip2_frozen(blip):
    assert not blip.model.training
    params = list(blip.model.parameters())
    assert params and not any(p.requires_grad for p in params)
    assert all(p.device.type == "cpu" for p in params)


def test_blip2_loads_exactly_the_saved_vision_weights(blip, tiny_blip2):
    from safetensors import safe_open

    path, _ = tiny_blip2
    with safe_open(str(path / "model.safetensors"), framework="pt") as st:
        saved = {k.removeprefix("vision_model."): st.get_tensor(k)
                 for k in st.keys() if k.startswith("vision_model.")}
    loaded = blip.model.state_dict()
    assert set(loaded) == set(saved)
    for k, v in saved.items():
        assert loaded[k].dtype == v.dtype and loaded[k].equal(v), k
    assert blip.unexpected_keys == []


def test_blip2_checkpoint_layouts(tmp_path, blip, tiny_blip2):
    """Blip2ForConditionalGeneration, a stand-alone vision tower, shards, a .bin file."""
    import torch
    from transformers import Blip2ForConditionalGeneration, Blip2VisionModel

    from digirl_lite.vision import Blip2Features

    _, model = tiny_blip2
    imgs = _images(2)
    expected = blip.encode(imgs)
    full = Blip2ForConditionalGeneration(tiny_blip2_config())
    full.vision_model.load_state_dict(model.vision_model.state_dict())
    full.save_pretrained(tmp_path / "full")
    vision = Blip2VisionModel(model.config.vision_config)
    vision.load_state_dict(model.vision_model.state_dict())
    vision.save_pretrained(tmp_path / "vision")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    model.config.save_pretrained(tmp_path / "bin")
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    layouts = ("full", "vision", "sharded", "bin")
    for d in layouts:
        save_blip2_processor(tmp_path / d)
    torch.manual_seed(123)  # a load that fell back to random init would differ
    for d in layouts:
        f = Blip2Features(tmp_path / d)
        np.testing.assert_allclose(f.encode(imgs), expected, rtol=1e-6, atol=1e-6, err_msg=d)
    # only the shards that hold vision weights are read
    shards = sorted((tmp_path / "sharded").glob("*.safetensors"))
    read = Blip2Features(tmp_path / "sharded").weight_files
    assert len(shards) > 2 and 0 < len(read) < len(shards)


def test_blip2_clear_errors(tmp_path, tiny_blip2):
    from safetensors.torch import save_file

    from digirl_lite.vision import Blip2Features

    with pytest.raises(FileNotFoundError, match="does not exist"):
        Blip2Features(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        Blip2Features(empty)
    src, model = tiny_blip2
    config_only = tmp_path / "config_only"
    model.config.save_pretrained(config_only)
    with pytest.raises(FileNotFoundError, match="no weight files"):
        Blip2Features(config_only)
    no_vision = tmp_path / "no_vision"
    model.config.save_pretrained(no_vision)
    save_file({k: v.contiguous() for k, v in model.qformer.state_dict().items()},
              str(no_vision / "model.safetensors"))
    with pytest.raises(ValueError, match="no vision weights"):
        Blip2Features(no_vision)
    partial = tmp_path / "partial"
    model.config.save_pretrained(partial)
    sd = {f"vision_model.{k}": v.contiguous() for k, v in model.vision_model.state_dict().items()
          if not k.startswith("post_layernorm")}
    save_file(sd, str(partial / "model.safetensors"))
    with pytest.raises(ValueError, match=r"lacks 2 of .*post_layernorm"):
        Blip2Features(partial)


def test_blip2_without_preprocessor_config_warns_and_uses_blip_defaults(tmp_path, blip,
                                                                        tiny_blip2):
    from digirl_lite.vision import Blip2Features

    _, model = tiny_blip2
    model.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="no preprocessor_config.json"):
        f = Blip2Features(tmp_path)
    imgs = _images(2)
    np.testing.assert_allclose(f.encode(imgs), blip.encode(imgs), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------
# The simulator encoder
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sim_screens():
    # 20 episodes per task set: ~75 distinct screens, 16 kinds, ~1.5 s
    return collect_sim_screens(episodes=20)


def test_sim_encoder_shapes_determinism_and_seed():
    imgs = _images(3, size=(270, 570)) + [Image.new("RGBA", (1080, 2280), (9, 9, 9, 255)),
                                          Image.new("L", (101, 203), 128)]
    enc = SimScreenEncoder(dim=64)
    f = enc.encode(imgs)
    assert f.shape == (5, 64) and f.dtype == np.float32 and enc.dim == 64
    np.testing.assert_array_equal(f, SimScreenEncoder(dim=64).encode(imgs))
    assert not np.allclose(f, SimScreenEncoder(dim=64, seed=1).encode(imgs))
    assert enc.encode([]).shape == (0, 64)
    one_by_one = np.concatenate([enc.encode(im) for im in imgs])  # one image, not a list
    np.testing.assert_array_equal(one_by_one, f)  # a screen's features ignore its batch
    with pytest.raises(ValueError):
        SimScreenEncoder(dim=0)


def test_sim_encoder_grid_is_the_cell_mean():
    """Against a slow loop: each cell's mean colour, scaled to [-1, 1]."""
    enc = SimScreenEncoder(grid=(4, 6))
    # a multiple of the grid (Image.reduce: exact), and not (a box filter whose edge pixels
    # are weighted a little differently from their exact overlap with the cell)
    for size, atol in (((40, 60), 0.5 + 1e-9), ((101, 203), 1.5)):
        img = _images(1, size=size)[0]
        a = np.asarray(img, np.float64)
        w, h = size
        ref = np.zeros((6, 4, 3))
        for r in range(6):
            for c in range(4):
                y0, y1, x0, x1 = r * h / 6, (r + 1) * h / 6, c * w / 4, (c + 1) * w / 4
                ys, xs = np.arange(h) + 0.5, np.arange(w) + 0.5
                # pixel weights: the fraction of each pixel inside the cell
                wy = np.clip(np.minimum(ys + 0.5, y1) - np.maximum(ys - 0.5, y0), 0, 1)
                wx = np.clip(np.minimum(xs + 0.5, x1) - np.maximum(xs - 0.5, x0), 0, 1)
                wgt = wy[:, None] * wx[None, :]
                ref[r, c] = (a * wgt[..., None]).sum((0, 1)) / wgt.sum()
        got = (enc.grid_features(img).reshape(6, 4, 3) + 1.0) * 127.5
        np.testing.assert_allclose(got, ref, atol=atol)  # uint8 rounding of the small image


@pytest.mark.slow
def test_sim_encoder_projection_keeps_distances(sim_screens):
    enc = SimScreenEncoder()
    x = np.stack([enc.grid_features(s.image) for s in sim_screens])
    f = enc.encode([s.image for s in sim_screens])
    i, j = np.triu_indices(len(x), 1)
    raw = np.linalg.norm(x[i] - x[j], axis=1) * np.sqrt(enc.dim / enc.input_dim)
    ratio = np.linalg.norm(f[i] - f[j], axis=1) / raw
    assert 0.85 < ratio.min() and ratio.max() < 1.15  # measured 0.92 .. 1.09


@pytest.mark.slow
def test_sim_encoder_tells_screen_kinds_apart(sim_screens):
    labels = [s.label for s in sim_screens]
    assert {"launcher", "google_home", "shop_results", "shop_results+popup", "voice"} <= set(
        labels)
    r = loo_nn_accuracy(SimScreenEncoder().encode([s.image for s in sim_screens]), labels)
    assert r["n_classes"] >= 12 and r["n_scored"] >= 60
    assert r["accuracy"] >= 0.93, r  # measured 0.971 (70 screens scored)


def test_loo_nn_accuracy_on_hand_made_points():
    x = np.array([[0.0], [0.1], [5.0], [5.2], [1.0], [9.0]])
    r = loo_nn_accuracy(x, ["a", "a", "b", "b", "b", "c"])
    # scored: the five a/b points; the b at 1.0 has an "a" nearest; "c" is alone
    assert r["n_scored"] == 5 and r["accuracy"] == pytest.approx(4 / 5)
    assert r["accuracy_all"] == pytest.approx(4 / 6)
    assert r["confusions"] == [("b", "a", 1)]


def test_screen_label():
    from digirl_lite.envs.sim.world import Page, PhoneState

    page = Page("chrome", "shop_results", site="ebay", query="x")
    assert screen_label(PhoneState(page=page)) == "shop_results"
    assert screen_label(PhoneState(page=page, overlay="popup")) == "shop_results+popup"
    assert screen_label(PhoneState(page=page, overlay="voice")) == "voice"
    assert screen_label(PhoneState(page=page, loading=True)) == "blank"


@pytest.mark.slow
def test_sim_encoder_popup_moves_features_more_than_a_query_change():
    r = popup_probe(SimScreenEncoder(), queries=("usb c cable", "dell xps 13"))
    assert r["popup"]["min"] > r["same_kind"]["max"]
    assert r["popup_over_same_kind"] > 10, r  # measured 38 (16 over 4 queries)
    assert r["voice"]["min"] > r["same_kind"]["max"]
    assert r["consent"]["min"] > r["same_kind"]["max"]  # a banner over the bottom fifth
    assert r["same_kind"]["min"] > 0  # a query change is still visible


@pytest.mark.slow
def test_sim_encoder_sees_drift():
    r = drift_probe(SimScreenEncoder(), day_a=1, day_b=7)
    assert r["changed"] >= 10 and r["unchanged_max"] < 1e-4
    assert r["changed_distance"]["mean"] > 1.0  # measured 6.8 (a query change: ~0.5)


def test_sim_encoder_full_size_and_recorded_size_agree():
    from digirl_lite.envs.sim.render import Renderer
    from digirl_lite.envs.sim.world import N_RESULTS, Page, PhoneState

    enc = SimScreenEncoder()
    r = Renderer(cache_size=0)
    order = tuple(range(N_RESULTS))
    states = [PhoneState(page=Page("chrome", "shop_results", site="ebay", query=q, order=order))
              for q in ("usb c cable", "dell xps 13")]
    full = [r.render(s) for s in states]
    small = [im.resize((270, 570), Image.BILINEAR) for im in full]
    f_full, f_small = enc.encode(full), enc.encode(small)
    resize_d = np.linalg.norm(f_full - f_small, axis=1).max()
    query_d = np.linalg.norm(f_small[0] - f_small[1])
    assert resize_d < 0.5 * query_d  # measured 0.075 vs 0.25


# ---------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------
class CountingEncoder:
    """Mean colour times a fixed vector; records each encode call's batch size."""

    dim = 4

    def __init__(self) -> None:
        self.calls: list[int] = []

    def encode(self, images):
        self.calls.append(len(images))
        m = np.array([np.asarray(im, np.float32).mean() for im in images])
        return (m[:, None] * np.arange(1, 5)[None, :]).astype(np.float32)


def test_cache_encodes_only_misses_once():
    enc = CountingEncoder()
    cache = FeatureCache(enc)
    a, b, c = _images(3)
    f1 = cache.get([a, b, a])  # a repeated within the call: encoded once
    assert enc.calls == [2] and (cache.hits, cache.misses) == (1, 2)
    np.testing.assert_array_equal(f1, CountingEncoder().encode([a, b, a]))
    f2 = cache.get([b, c, a])
    assert enc.calls == [2, 1] and (cache.hits, cache.misses) == (3, 3)
    np.testing.assert_array_equal(f2[[0, 2]], f1[[1, 0]])
    assert cache.hit_rate == pytest.approx(0.5) and len(cache) == 3
    cache.get([a])
    assert enc.calls == [2, 1]  # all hits: no encoder call
    assert screen_id_of_image(a) in cache


def test_cache_explicit_ids_and_errors():
    enc = CountingEncoder()
    cache = FeatureCache(enc)
    a, b = _images(2)
    cache.get([a], ids=["home"])
    f = cache.get([b], ids=["home"])  # the id names the content: b's pixels are not read
    np.testing.assert_array_equal(f, enc.encode([a]))
    with pytest.raises(ValueError, match="2 images but 1 ids"):
        cache.get([a, b], ids=["x"])
    with pytest.raises(ValueError):
        FeatureCache(enc, max_items=0)

    class Bad(CountingEncoder):
        def encode(self, images):
            return np.zeros((len(images), 3), np.float32)

    with pytest.raises(ValueError, match="expected"):
        FeatureCache(Bad()).get([a])
    assert FeatureCache(enc).hit_rate == 0.0


def test_cache_lru_bound():
    enc = CountingEncoder()
    cache = FeatureCache(enc, max_items=2)
    a, b, c = _images(3)
    cache.get([a, b])
    cache.get([a])  # a is now the most recent
    cache.get([c])  # evicts b
    assert len(cache) == 2
    assert screen_id_of_image(b) not in cache and screen_id_of_image(a) in cache
    misses = cache.misses
    cache.get([b])
    assert cache.misses == misses + 1
    big = cache.get(_images(5, seed=9))  # more misses than the bound: all still returned
    assert big.shape == (5, 4) and len(cache) == 2


def test_cache_prune_keeps_the_needed_and_the_most_recent_spare():
    enc = CountingEncoder()
    cache = FeatureCache(enc)
    imgs = _images(8)
    ids = [f"k{i}" for i in range(8)]
    cache.get(imgs, ids)
    cache.get([imgs[1]], ["k1"])  # k1 used again: the most recent of the others
    table = ScreenTable()
    for i in (0, 5):
        table.add(imgs[i], screen_id=f"k{i}")
    assert cache.prune(table, spare=2) == 4  # k0, k5 needed; k1, k7 the spare
    assert sorted(k for k in ids if k in cache) == ["k0", "k1", "k5", "k7"]
    assert cache.prune(table, spare=2) == 0 and len(cache) <= len(table) + 2
    calls = len(enc.calls)
    np.testing.assert_array_equal(cache.get([imgs[5], imgs[1]], ["k5", "k1"]),
                                  enc.encode([imgs[5], imgs[1]]))
    assert len(enc.calls) == calls + 1  # hits only (the +1 is the reference encode above)
    assert cache.prune(set(), spare=0) == 4 and len(cache) == 0
    with pytest.raises(ValueError):
        cache.prune(table, spare=-1)


def test_cache_fills_a_screen_table():
    enc = CountingEncoder()
    table = ScreenTable()
    a, b, c = _images(3)
    ida, idb = table.add(a), table.add(b)
    known = np.full(4, 7.0, np.float32)
    idc = table.add(c, features=known)
    table.add(screen_id="no-image")  # id only: nothing to encode
    cache = FeatureCache(enc)
    assert cache.fill(table) == 2
    np.testing.assert_array_equal(table.features([ida, idb]), enc.encode([a, b]))
    np.testing.assert_array_equal(table.features([idc])[0], known)  # left as it was
    assert not table.has_features("no-image")
    assert cache.fill(table) == 0


def test_cache_fill_does_not_read_images_it_has_features_for():
    enc = CountingEncoder()
    cache = FeatureCache(enc)
    a, b = _images(2)
    cache.get([a], ids=["a"])
    table = ScreenTable()

    def unreadable():
        raise AssertionError("the image of a cached screen was read")

    table.add(unreadable, screen_id="a")  # e.g. a screen already in the store, on disk
    table.add(b, screen_id="b")
    assert cache.fill(table) == 2
    assert enc.calls == [1, 1]  # a once (above), b once: a's features came from the cache
    np.testing.assert_array_equal(table.features(["a"]), enc.encode([a]))


def test_cache_on_simulated_episodes():
    from digirl_lite.envs.sim import Copier, SimPhoneEnv

    cache = FeatureCache(SimScreenEncoder(dim=32))
    env = SimPhoneEnv("webshop_test", seed=0)
    n_frames = 0
    for i in range(5):
        agent = Copier(seed=i)
        obs, _ = env.reset(seed=i)
        done = False
        while not done:
            cache.get([obs.screenshot], ids=[obs.screen_id])
            n_frames += 1
            obs, _, term, trunc, _ = env.step(agent.act(obs))
            done = term or trunc
    assert cache.hits + cache.misses == n_frames
    assert cache.hits >= 4  # the launcher, at least, repeats every episode
    assert len(cache) == cache.misses


def test_features_json_serialisable_summary():
    """The benchmark prints these dicts: plain JSON values that survive a round trip."""
    r = loo_nn_accuracy(np.eye(3), ["a", "a", "b"])  # "b" is alone: a neighbour, not scored
    assert json.loads(json.dumps(r)) == {"accuracy": 1.0, "accuracy_all": 2 / 3, "n_scored": 2,
                                         "n_screens": 3, "n_classes": 2, "confusions": []}
    r = loo_nn_accuracy(np.array([[0.0], [1.0], [5.0], [6.0], [1.2]]), list("aabbb"))
    assert all(type(v) in (int, float, list) for v in r.values()), r
    assert json.loads(json.dumps(r)) == {"accuracy": 0.6, "accuracy_all": 0.6, "n_scored": 5,
                                         "n_screens": 5, "n_classes": 2,
                                         "confusions": [["a", "b", 1], ["b", "a", 1]]}
