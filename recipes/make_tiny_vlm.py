"""Write a tiny randomly initialised Qwen2-VL (about 1 M parameters) with its tokenizer and
image processor, built offline, for tests and smoke runs of ``policy="vlm"``:

    python recipes/make_tiny_vlm.py --out runs/tiny-vlm
    python recipes/offline_to_online.py --quick --set policy=vlm policy_path=runs/tiny-vlm

The directory has the layout of a real checkpoint (``config.json``, safetensors, tokenizer,
``preprocessor_config.json``, chat template): the policy loads it through transformers'
Auto classes as it would load Qwen2-VL-2B-Instruct. Sizes: :data:`digirl_lite.policy.
tiny_vlm.TINY_VLM` (``--set`` overrides them, e.g. ``--set num_hidden_layers=4``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> str:
    from digirl_lite.envs.sim.demos import sim_corpus
    from digirl_lite.policy.tiny_vlm import TINY_VLM, make_tiny_vlm

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the directory to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", nargs="*", default=[], metavar="SIZE=VALUE",
                    help=f"sizes to change (of {', '.join(sorted(TINY_VLM))})")
    args = ap.parse_args(argv)
    from digirl_lite.train.cli import parse_assignments

    sizes = parse_assignments(args.set, "--set", "SIZE")
    t0 = time.perf_counter()
    try:
        out = make_tiny_vlm(args.out, seed=args.seed,
                            corpus=sim_corpus(seed=args.seed, n_demos=20), **sizes)
    except ValueError as e:
        ap.error(str(e))
    from transformers import AutoConfig

    n = json.loads((out / "tiny_vlm.json").read_text())
    model_type = AutoConfig.from_pretrained(str(out)).model_type
    print(f"{out}: a {model_type} of {n['num_hidden_layers']} layers, hidden "
          f"{n['hidden_size']}, written in {time.perf_counter() - t0:.0f} s")
    return str(out)


if __name__ == "__main__":
    main(sys.argv[1:])
