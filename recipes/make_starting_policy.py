"""Build the starting policy (the AutoUI role): copy drills (the copying a pre-trained T5
brings), then supervised fine-tuning of the tiny preset on the simulator's expert
demonstrations, saved with the SFT settings it was built under.

    python recipes/make_starting_policy.py --world webshop   # -> <assets>/policies/sft-webshop
    python recipes/make_starting_policy.py --world general   # -> <assets>/policies/sft-general

(``<assets>``: :func:`digirl_lite.paths.data_dir`, the package's ``digirl_lite/assets/``.)

The main job loads it with ``starting_policy="shipped"`` (the sim_webshop preset, on either
world) and refuses it if the config's SFT settings differ from those it was built with.
Another setting's starting policy ships beside it under its SFT key, where "shipped" finds it
(``digirl_lite.train.starting.shipped_policy_dir``; the key is in the refusal's message)::

    python recipes/make_starting_policy.py --config recipes/configs/paper_setting.json \
        --world general --out <assets>/policies/sft-KEY

It is trained here from scratch (about 75 min a world on one core) unless ``--cache-dir`` is
given: then a policy of the same SFT key in that cache (``recipes/evaluate.py --policy sft``
leaves one in the user's cache) is saved as it is.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from digirl_lite.paths import data_dir
from digirl_lite.train.cli import config_from_args, run_parser
from digirl_lite.train.trainer import Trainer


def main(argv: list[str] | None = None) -> str:
    ap = run_parser(__doc__.split("\n\n")[0], out="")
    args = ap.parse_args(argv)
    cfg = config_from_args(args, starting_policy="sft")
    out = args.out or str(data_dir() / "policies" / f"sft-{cfg.world}")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        # built here unless --cache-dir is given: then a policy the cache holds under the
        # same SFT key (an evaluation's or a run's 'sft' start) is saved, not trained again
        cache = None if args.cache_dir is None else (args.cache_dir or None)
        trainer = Trainer(cfg, tmp, cache_dir=cache, progress=not args.quiet)
        trainer.build_starting_policy()
        trainer.save_starting_policy(out)
        shutil.copy(Path(tmp) / "metrics.jsonl", Path(out) / "sft_metrics.jsonl")
    print(f"{out}: {trainer.policy.num_parameters():,} parameters, "
          f"{time.perf_counter() - t0:.0f} s")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
