"""Image features on the simulated phone: does the encoder see what the policy needs, how fast.

    python benchmarks/bench_vision.py
    python benchmarks/bench_vision.py --episodes 30 --cache-episodes 20      # quick
    python benchmarks/bench_vision.py --blip2-dir /models/blip2-opt-2.7b    # also BLIP-2

Prints JSON:

* ``nn``: leave-one-out 1-nearest-neighbour accuracy of screen labels (page kind + overlay)
  over the distinct screens of expert and copier episodes on ``webshop_test`` and
  ``general_test`` (default surprises), from the features and from the unprojected grid;
* ``popup``: feature distance page -> same page under a pop-up (consent banner, voice input)
  vs page -> same page for another query (``same_kind``);
* ``drift``: feature distance of the same page on day 1 and day 7;
* ``ms_per_screen``: encoding time at the recorded 270 x 570 and at 1080 x 2280;
* ``cache``: :class:`FeatureCache` hit rate over copier episodes, keyed by ``obs.screen_id``
  and by pixel content.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from digirl_lite.envs.sim import Copier, SimPhoneEnv
from digirl_lite.envs.sim.probes import (
    collect_sim_screens,
    drift_probe,
    loo_nn_accuracy,
    popup_probe,
)
from digirl_lite.envs.sim.render import Renderer
from digirl_lite.rollout.episode import RECORD_SIZE
from digirl_lite.vision import FeatureCache, SimScreenEncoder


def _ms_per_screen(encoder, images, repeats: int = 3) -> dict[str, float]:
    """Batched: best of ``repeats`` whole-batch calls, per image. One by one: the median call
    (means are skewed by BLAS threads waiting on a busy 2-core machine)."""
    best_batch, single = float("inf"), []
    for _ in range(repeats):
        t = time.perf_counter()
        encoder.encode(images)
        best_batch = min(best_batch, time.perf_counter() - t)
        for im in images:
            t = time.perf_counter()
            encoder.encode([im])
            single.append(time.perf_counter() - t)
    return {"batched": round(best_batch / len(images) * 1e3, 3),
            "one_by_one_median": round(float(np.median(single)) * 1e3, 3),
            "one_by_one_p90": round(float(np.percentile(single, 90)) * 1e3, 3)}


def _cache_run(encoder, episodes: int, seed: int) -> dict:
    by_id, by_pixels = FeatureCache(encoder), FeatureCache(encoder)
    env = SimPhoneEnv("webshop_test", seed=seed)
    frames = 0
    t_id = 0.0
    for i in range(episodes):
        agent = Copier(seed=seed * 100_000 + i)
        obs, _ = env.reset(seed=seed * 100_000 + i)
        done = False
        while not done:
            t = time.perf_counter()
            by_id.get([obs.screenshot], ids=[obs.screen_id])
            t_id += time.perf_counter() - t
            by_pixels.get([obs.screenshot])
            frames += 1
            obs, _, term, trunc, _ = env.step(agent.act(obs))
            done = term or trunc
    return {
        "episodes": episodes, "frames": frames,
        "hit_rate_screen_id": round(by_id.hit_rate, 4), "distinct_screen_ids": len(by_id),
        "hit_rate_pixels": round(by_pixels.hit_rate, 4), "distinct_pixel_screens": len(by_pixels),
        "ms_per_frame_screen_id": round(t_id / frames * 1e3, 3),
    }


def evaluate(encoder, screens, args) -> dict:
    images = [s.image for s in screens]
    labels = [s.label for s in screens]
    nn = loo_nn_accuracy(encoder.encode(images), labels)
    nn["confusions"] = nn["confusions"][:6]
    full = Renderer(cache_size=0)
    full_images = [full.render(s.state) for s in screens[:50]]
    return {
        "nn": nn,
        "popup": popup_probe(encoder),
        "drift": drift_probe(encoder, day_a=1, day_b=args.drift_day),
        "ms_per_screen": {
            f"{RECORD_SIZE[0]}x{RECORD_SIZE[1]}": _ms_per_screen(encoder, images[:200]),
            "1080x2280": _ms_per_screen(encoder, full_images),
        },
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=100,
                    help="episodes per task set for the screen collection (half copier)")
    ap.add_argument("--cache-episodes", type=int, default=100)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--drift-day", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--blip2-dir", default=None,
                    help="a local BLIP-2 checkpoint: also evaluate Blip2Features")
    args = ap.parse_args(argv)

    t = time.perf_counter()
    screens = collect_sim_screens(episodes=args.episodes, seed=args.seed)
    collect_s = time.perf_counter() - t
    enc = SimScreenEncoder(dim=args.dim, seed=args.seed)
    out: dict = {
        "screens": len(screens), "collect_s": round(collect_s, 2),
        "encoder": repr(enc),
        **evaluate(enc, screens, args),
    }
    grid = np.stack([enc.grid_features(s.image) for s in screens])
    out["nn"]["accuracy_unprojected_grid"] = round(
        loo_nn_accuracy(grid, [s.label for s in screens])["accuracy"], 4)
    out["cache"] = _cache_run(enc, args.cache_episodes, args.seed)
    if args.blip2_dir:
        from digirl_lite.vision import Blip2Features

        blip = Blip2Features(args.blip2_dir)
        out["blip2"] = {"encoder": repr(blip), **evaluate(blip, screens, args)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
