"""Train the simulator preset's sentencepiece tokenizer (digirl_lite/assets/tokenizer/spiece.model).

    python recipes/make_tokenizer.py --seed 0     # -> digirl_lite/assets/tokenizer

The corpus: the simulator's train instructions, and the prompts and action strings of the
scripted expert's clean demonstrations on both task sets.
"""

from __future__ import annotations

import argparse

from digirl_lite.envs.sim.demos import sim_corpus
from digirl_lite.paths import data_dir
from digirl_lite.policy.tokenizer import train_sim_tokenizer


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(data_dir() / "tokenizer"),
                    help="default: tokenizer/ in the package's assets (or $DIGIRL_LITE_DATA)")
    ap.add_argument("--vocab-size", type=int, default=11_000)
    ap.add_argument("--demos", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    tok = train_sim_tokenizer(sim_corpus(args.seed, args.demos), args.vocab_size)
    path = tok.save(args.out)
    print(f"{path}: {tok.vocab_size} pieces, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
