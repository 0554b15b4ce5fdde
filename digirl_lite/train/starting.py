"""The simulator's starting policy (the AutoUI role, a copier of people): the tiny preset,
taught by copy drills and supervised fine-tuning on the scripted expert's demonstrations,
cached and shipped under a key of the settings it was built with.

Simulator-only: the Trainer calls :func:`starting_policy` for ``starting_policy`` "sft" or
"shipped"; a directory (a saved policy or a real Auto-UI checkpoint) never comes here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["sft_key", "shipped_policy_dir", "starting_policy", "train_sft", "save_starting_policy",
           "span_extractor"]

SPAN_EXTRACTOR_STEPS, SPAN_EXTRACTOR_DRILLS = 40, 0
"""The span extractor's fine-tuning: updates of 32 pairs, and the copy drills beside the
train tasks. 40 updates find the typed text as often as the 300 the paper3 grids' extractor
had (``benchmarks/results/span_extractor_budget.json``, exact match: Web Shopping test /
unseen products / unseen phrasings 98.3 / 97.9 / 98.3% against 98.3 / 97.9 / 96.7%; General
test / unseen names / unseen phrasings 100 / 100 / 51% against 100 / 100 / 52%) in about a
seventh of the time (300 took 679-1,057 s on a fresh clone); training only the top 2 encoder
layers does not (unseen products 68.8%). With 3,000
drills (made-up products, most in AitW's phrasing) the extractor found the product in 77.5%
of the held-out phrasings, against 90.0% without (120 lines; 100 / 97.5% on the test list)."""


def span_extractor(cfg: Any, *, cache_dir: Path | None,
                   log: Callable[..., None] = lambda **kw: None) -> Any:
    """The run's :class:`~digirl_lite.policy.span_extractor.SpanExtractor`
    (``typed_span_extractor``): loaded from ``cache_dir`` by its key, else fine-tuned
    (deterministic from ``sft_seed``) and saved there. In a data-parallel run every process
    calls it at the same point: they fine-tune it together (each a share of every batch,
    gradients averaged) and process 0 saves it."""
    from digirl_lite import distributed as dist
    from digirl_lite.envs.setup import sim_extractor_pairs
    from digirl_lite.paths import content_key
    from digirl_lite.policy.span_extractor import SpanExtractor

    c = cfg
    share = c.sft_phrasing_share
    phrasings = c.train_phrasings if share else "base"
    if c.typed_span_phrasings is not None:  # its own: half its data in them
        share, phrasings = 0.5, c.typed_span_phrasings
    key = content_key("spanx-v1", c.typed_span_extractor, c.world, share,
                      phrasings, c.sft_seed, SPAN_EXTRACTOR_STEPS, SPAN_EXTRACTOR_DRILLS)
    cached = cache_dir / f"spanx-{key}" if cache_dir else None
    # in a data-parallel run process 0 decides, all fine-tune together, process 0 saves
    if dist.broadcast_object(cached is not None and (cached / "span_extractor.json").is_file()):
        log(stage="span_extractor", loaded=str(cached))
        return SpanExtractor.load(cached)
    t0 = time.perf_counter()
    ex = SpanExtractor.pretrained(seed=c.sft_seed)
    fit = ex.fit(sim_extractor_pairs(c.world, share, phrasings, c.sft_seed,
                                     SPAN_EXTRACTOR_DRILLS), steps=SPAN_EXTRACTOR_STEPS,
                 seed=c.sft_seed)
    log(stage="span_extractor", seconds=round(time.perf_counter() - t0, 1), **fit)
    if cached is not None and dist.rank() == 0:
        ex.save(cached)
    return ex


def demo_phone(cfg: Any) -> dict[str, Any]:
    """The phone the demonstrations are recorded on (``sft_phone``), as
    :func:`~digirl_lite.envs.setup.sim_demonstrations` arguments: "older", the defaults of
    day 1 and its older layout (nothing of ``sim_surprises``); "live", the run's day,
    surprises and layout (``sim_layout``)."""
    if cfg.sft_phone == "older":
        return {}
    return {"day": cfg.day, "surprises": dict(cfg.sim_surprises), "layout": cfg.sim_layout}


def sft_key(cfg: Any) -> str:
    """What the SFT starting policy depends on (a cached or shipped one must match)."""
    from digirl_lite.paths import content_key, data_dir
    from digirl_lite.policy import SIM_PRESET, SPTokenizer
    from digirl_lite.policy.tokenizer import SIM_TOKENIZER_FILE

    c = cfg
    vocab = SPTokenizer(data_dir() / "tokenizer" / SIM_TOKENIZER_FILE).vocab_size
    # v4: General's demonstrations and drills vary its searches' names (Web Shopping as before)
    version = "sft-v3" if c.world == "webshop" else "sft-v4"
    policy = (SIM_PRESET, vocab) if c.policy == "autoui" else (
        "vlm", str(Path(c.policy_path).expanduser().resolve()), c.lora, c.vlm_image_size,
        c.vlm_dtype)
    return content_key(version, c.world, c.sft_seed, c.sft_demos, c.sft_updates,
                       c.sft_batch, c.sft_lr, c.sft_surprise_rate, c.sft_varied_products,
                       c.sft_copy_updates, c.sft_copy_share, *policy,
                       *((("slip", c.sft_slip_rate),) if c.sft_slip_rate else ()),
                       *((("popup_back", c.sft_popup_back_share),)
                         if c.sft_popup_back_share else ()),
                       *((("phone", c.sft_phone, c.day, sorted(c.sim_surprises.items()),
                            c.sim_layout),)
                         if c.sft_phone != "older" else ()),
                       *((("phrasing", c.sft_phrasing_share),) if c.sft_phrasing_share else ()),
                       *((("phrasings", c.train_phrasings),)
                         if c.sft_phrasing_share and c.train_phrasings != "base" else ()),
                       *((("goal", c.goal_features),)
                         if getattr(c, "goal_features", "none") != "none" else ()),
                       *((("goal_drop", c.goal_token_dropout),)
                         if getattr(c, "goal_token_dropout", 0.0) else ()),
                       *((("token_embeddings", c.token_embeddings),)
                         if getattr(c, "token_embeddings", "trained") != "trained" else ()))


def save_starting_policy(policy: Any, cfg: Any, directory: str | Path) -> Path:
    """Save ``policy`` with the SFT key and settings it was built under (``sft.json``)."""
    from digirl_lite.paths import atomic_write_text

    d = policy.save(directory)
    atomic_write_text(d / "sft.json", json.dumps({
        "key": sft_key(cfg), "world": cfg.world,
        "sft_seed": cfg.sft_seed, "sft_demos": cfg.sft_demos, "sft_updates": cfg.sft_updates,
        "sft_batch": cfg.sft_batch, "sft_lr": cfg.sft_lr,
        "sft_surprise_rate": cfg.sft_surprise_rate,
        "sft_varied_products": cfg.sft_varied_products,
        "sft_copy_updates": cfg.sft_copy_updates,
        "sft_copy_share": cfg.sft_copy_share, "sft_slip_rate": cfg.sft_slip_rate,
        "sft_popup_back_share": cfg.sft_popup_back_share, "sft_phone": cfg.sft_phone,
        "sft_phrasing_share": cfg.sft_phrasing_share, "train_phrasings": cfg.train_phrasings,
        "goal_features": cfg.goal_features,
        "goal_token_dropout": cfg.goal_token_dropout,
        "token_embeddings": cfg.token_embeddings}, indent=1))
    return d


def shipped_policy_dir(cfg: Any) -> Path:
    """The shipped starting policy for ``cfg`` in :func:`~digirl_lite.paths.data_dir` (the
    package's ``assets/``): ``policies/sft-<world>`` (the main job's), else
    ``policies/sft-<key>`` for another setting's SFT key (:func:`sft_key`; the paper
    setting's, built by ``recipes/make_starting_policy.py --out`` there). The first when
    neither is there, so that the error names the main job's."""
    from digirl_lite.paths import data_dir

    policies, key = data_dir() / "policies", sft_key(cfg)
    default, keyed = policies / f"sft-{cfg.world}", policies / f"sft-{key}"
    if keyed.is_dir() and not _built_with(default, key):
        return keyed
    return default


def _built_with(directory: Path, key: str) -> bool:
    meta = directory / "sft.json"
    return meta.is_file() and json.loads(meta.read_text()).get("key") == key


def starting_policy(cfg: Any, *, features: Any, cache_dir: Path | None, device: Any,
                    process_index: int = 0, accelerator: Any = None,
                    log: Callable[..., None] = lambda **kw: None,
                    bar: Callable[[int, str], Any] | None = None,
                    is_main: bool = True) -> tuple[Any, float | None]:
    """``cfg.starting_policy`` "shipped" (:func:`shipped_policy_dir`: built with this
    config's SFT settings) or "sft" (cached by key in ``cache_dir``, else trained here).
    Returns (policy, seconds of SFT or None when loaded)."""
    from digirl_lite.policy.factory import load_kwargs, load_policy

    src = cfg.starting_policy
    key = sft_key(cfg)
    cached = (shipped_policy_dir(cfg) if src == "shipped"
              else cache_dir / f"sft-{key}" if cache_dir else None)
    meta = cached / "sft.json" if cached is not None else None
    if meta is not None and meta.is_file():
        made = json.loads(meta.read_text()).get("key")
        if made != key:
            raise ValueError(
                f"{cached} was built with other SFT settings (key {made}, this run {key}); "
                "set starting_policy='sft' (built here, cached by key), or build it with "
                "recipes/make_starting_policy.py, for a setting other than the main job's with "
                f"--out {cached.parent}/sft-{key}" if src == "shipped" else
                f"{cached} was built with other SFT settings (key {made}, this run {key})")
        log(stage="sft", loaded=str(cached))
        policy = load_policy(cached, **load_kwargs(cfg))
        policy.value_head_fresh = True  # SFT never trains the value head: it is a fresh one
        return policy, None
    if src == "shipped":
        raise FileNotFoundError(
            f"no shipped starting policy at {cached}; build it with python "
            f"recipes/make_starting_policy.py --world {cfg.world} (or set starting_policy='sft')")
    t0 = time.perf_counter()
    policy = train_sft(cfg, features, device=device, process_index=process_index,
                       accelerator=accelerator, log=log, bar=bar)
    seconds = time.perf_counter() - t0
    if cached is not None and is_main:
        save_starting_policy(policy, cfg, cached)
    return policy, seconds


def train_sft(cfg: Any, features: Any, *, device: Any = "cpu", process_index: int = 0,
              accelerator: Any = None, log: Callable[..., None] = lambda **kw: None,
              bar: Callable[[int, str], Any] | None = None):
    """The starting policy from fresh preset weights: ``sft_copy_updates`` copy drills
    (:func:`~digirl_lite.envs.setup.sim_copy_drills`: the copying a pre-trained T5 brings),
    then supervised fine-tuning on the expert's demonstrations, with a share
    ``sft_copy_share`` of drills in every batch."""
    import contextlib

    import torch

    from digirl_lite.envs.setup import sim_copy_drills, sim_demonstrations
    from digirl_lite.policy.factory import fresh_policy
    from digirl_lite.policy.updates import steps_to_batch, text_mle_update

    c = cfg
    demos, dscreens, _ = sim_demonstrations(c.world, n=c.sft_demos, seed=c.sft_seed,
                                            surprise_rate=c.sft_surprise_rate,
                                            varied_products=c.sft_varied_products,
                                            slip_rate=c.sft_slip_rate,
                                            popup_back_share=c.sft_popup_back_share,
                                            phrasing_share=c.sft_phrasing_share,
                                            phrasings=c.train_phrasings,
                                            **demo_phone(c))
    features.fill(dscreens)
    steps = [s for t in demos for s in t.steps]
    policy = fresh_policy(c).to(device)
    opt = torch.optim.AdamW(policy.parameters(), lr=c.sft_lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min(1.0, (u + 1) / 50))
    rng = np.random.default_rng([c.sft_seed, process_index])
    drills = sim_copy_drills(seed=c.sft_seed * 1009 + process_index, world=c.world,
                             phrasing_share=c.sft_phrasing_share, phrasings=c.train_phrasings)
    if policy.screen_input == "features":
        no_image: Any = np.zeros((c.sft_batch, policy.img_dim), dtype=np.float32)
    else:  # a VLM's drills show it a blank screen
        from PIL import Image

        no_image = [Image.new("RGB", tuple(c.vlm_image_size), "white")] * c.sft_batch
    n_drill = int(round(c.sft_copy_share * c.sft_batch))
    total = c.sft_copy_updates + c.sft_updates
    with (bar(total, "sft") if bar else contextlib.nullcontext()) as b:
        for u in range(total):
            k = c.sft_batch if u < c.sft_copy_updates else n_drill
            drill = [next(drills) for _ in range(k)]
            prompts, actions = [p for p, _ in drill], [a for _, a in drill]
            feats = no_image[:k]
            if k < c.sft_batch:
                batch = [steps[i] for i in rng.integers(0, len(steps), c.sft_batch - k)]
                bp, bf, ba = steps_to_batch(batch, dscreens, policy)
                prompts, actions = prompts + bp, actions + ba
                feats = (list(feats) + list(bf) if isinstance(bf, list) else
                         np.concatenate([feats, np.asarray(bf, dtype=np.float32)]))
            loss = text_mle_update(policy, opt, prompts, feats, actions, 1.0, accelerator)
            sched.step()
            if b is not None:
                b.update()
            if u % 100 == 0 or u == total - 1:
                log(stage="sft", update=u, loss=round(loss, 4),
                    phase="copy" if u < c.sft_copy_updates else "demos")
    return policy

