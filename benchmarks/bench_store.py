"""Time a round trip of the trajectory store at the size of a real offline pile.

Writes ``random_pile`` (default: 528 trajectories, the Web Shopping off-to-online pile of
spec/DIGIRL.md section 7; horizon 20; 1408-d BLIP-2 features; 270 x 570 screenshots, the
judge's 4x-shrunk size) to a temporary store, reads it back, and prints one JSON object::

    python benchmarks/bench_store.py [--n 528] [--horizon 20] [--feature-dim 1408] ...

Timings include building the rows / decoding the tables, not generating the pile. ``load_s``
reads trajectories and features; ``load_images_s`` additionally decodes every stored PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from digirl_lite.data import load_trajectories, save_trajectories
from digirl_lite.data.synthetic import random_pile


def dir_size_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=528, help="trajectories (Web Shopping pile: 528)")
    ap.add_argument("--horizon", type=int, default=20, help="step budget H (Web Shopping: 20)")
    ap.add_argument("--feature-dim", type=int, default=1408, help="floats per screen (BLIP-2)")
    ap.add_argument("--image-size", type=int, nargs=2, default=(270, 570),
                    metavar=("W", "H"), help="screenshot width and height in pixels")
    ap.add_argument("--n-screens", type=int, default=24, help="distinct screens in the pool")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=None, help="parent folder for the store (default: tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the store instead of deleting it")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    trajs, screens = random_pile(args.n, seed=args.seed, horizon=args.horizon,
                                 feature_dim=args.feature_dim, n_screens=args.n_screens,
                                 image_size=tuple(args.image_size))
    gen_s = time.perf_counter() - t0

    parent = Path(tempfile.mkdtemp(prefix="bench_store-", dir=args.dir))
    path = parent / "store"
    try:
        t0 = time.perf_counter()
        save_trajectories(path, trajs, screens)
        write_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        loaded, table = load_trajectories(path)
        load_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        for sid in table.ids:
            table.image(sid)
        images_s = time.perf_counter() - t0

        if loaded != trajs:
            raise SystemExit("round trip failed: loaded trajectories differ")
        result = {
            "trajectories": len(loaded),
            "steps": sum(len(t) for t in loaded),
            "distinct_screens": len(table),
            "feature_dim": args.feature_dim,
            "image_size": list(args.image_size),
            "generate_s": round(gen_s, 3),
            "write_s": round(write_s, 3),
            "load_s": round(load_s, 3),
            "load_images_s": round(load_s + images_s, 3),
            "store_mb": round(dir_size_bytes(path) / 2**20, 3),
            "store_path": str(path) if args.keep else None,
        }
    finally:
        if not args.keep:
            shutil.rmtree(parent, ignore_errors=True)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    main()
