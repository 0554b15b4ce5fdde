"""A cheap frozen image encoder for the simulated phone's screens (numpy + Pillow, no torch).

The paper's policy sees one pooled BLIP-2 vector per screenshot (spec/DIGIRL.md section 3):
a frozen 1.1B-parameter ViT that costs about a second per screen on a CPU. On the simulated
phone that is wasted work. What the policy (and the critics) need from a screenshot is:

* *which screen* this is: the launcher, Google, one of six shops (each with its own header
  colour), a results list, a product page, an app, a blank page;
* *where things are*: the search box, the first result, the keyboard, a drifted layout;
* *whether a surprise is in the way*: a pop-up dims the page and puts a 900 x 800 px dialog
  in the middle, a consent banner covers the bottom fifth, voice input covers everything.

The simulator draws flat colour blocks (bars, cards, rows, tiles, dialogs), so all of that is
visible in the screen's *coarse colour layout*: the average colour of each cell of an 18 x 38
grid (60 x 60 px cells at 1080 x 2280, 15 x 15 px on the stored 270 x 570 screens) already
tells the screen kinds apart and moves a lot when a dialog appears or a layout drifts. Fine
detail (the letters of a query) moves it little; the policy reads the goal from its prompt.

Encoding (:class:`SimScreenEncoder`):

1. area-average the RGB screenshot onto ``grid`` cells (``Image.reduce`` when the size is a
   multiple of the grid, else a box filter), any input size;
2. scale pixel values to [-1, 1] (``x / 127.5 - 1``) and flatten: ``18 * 38 * 3 = 2052``
   floats;
3. multiply by a fixed Gaussian random matrix (seeded; entries ``N(0, 1 / 2052)``) to ``dim``
   floats. By Johnson-Lindenstrauss, distances between screens are kept up to a common factor
   ``sqrt(dim / 2052)`` and a few percent of noise; each feature has variance at most 1, the
   scale a LayerNorm'ed BLIP-2 vector has.

Measured on the simulator (``benchmarks/bench_vision.py``, 2-CPU machine): leave-one-out
1-nearest-neighbour accuracy of page kind + overlay 0.98 over 260 distinct screens of 200
expert and copier episodes (the misses: a shop's home vs its results page, both under a
pop-up); the smallest pop-up distance is 16x the largest query-change distance (31x the
mean); about 0.35 ms per stored 270 x 570 screen, 2.9 ms at 1080 x 2280. A finer grid (up to
54 x 114) or a per-cell contrast channel did not raise the 1-NN accuracy, and the contrast
channel made the features depend on the screenshot's resolution.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

__all__ = ["SimScreenEncoder", "DEFAULT_GRID", "SIM_FEATURE_DIM"]

SIM_FEATURE_DIM = 512
"""The encoder's default feature length (the critics' image features beside a policy that
reads screenshots itself, policy "vlm")."""

DEFAULT_GRID = (18, 38)
"""Cells across and down: 60 x 60 px cells on a 1080 x 2280 screen (the 9:19 aspect)."""


class SimScreenEncoder:
    """Frozen coarse-layout encoder: grid of mean colours -> seeded random projection.

    Follows the encoder interface of :class:`digirl_lite.vision.FeatureCache`:
    ``encode(images) -> (N, dim) float32`` and ``dim``.

    Args:
        dim: feature length (512 by default; 1408 mimics BLIP-2's shape).
        seed: seeds the projection matrix; equal seeds give equal features.
        grid: (cells across, cells down) of the colour grid.
    """

    def __init__(self, dim: int = SIM_FEATURE_DIM, seed: int = 0,
                 grid: tuple[int, int] = DEFAULT_GRID):
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        gw, gh = grid
        if gw <= 0 or gh <= 0:
            raise ValueError(f"grid must be two positive cell counts, got {grid}")
        self.dim = int(dim)
        self.seed = seed
        self.grid = (int(gw), int(gh))
        self.input_dim = gw * gh * 3
        rng = np.random.default_rng(seed)
        # (input_dim, dim); N(0, 1/input_dim) keeps each output's variance <= 1 for x in [-1, 1]
        self.projection = (
            rng.standard_normal((self.input_dim, self.dim)) / np.sqrt(self.input_dim)
        ).astype(np.float32)
        self.projection.setflags(write=False)

    def grid_features(self, image: Image.Image) -> np.ndarray:
        """The (gw * gh * 3,) float32 cell colours of one screen, in [-1, 1], before projection."""
        from PIL import Image

        if image.mode != "RGB":
            image = image.convert("RGB")
        gw, gh = self.grid
        w, h = image.size
        if w % gw == 0 and h % gh == 0:
            small = image.reduce((w // gw, h // gh))  # exact area average, ~2x faster than BOX
        else:
            small = image.resize((gw, gh), Image.BOX)
        cells = np.asarray(small, dtype=np.float32)  # (gh, gw, 3)
        return (cells / 127.5 - 1.0).reshape(-1)

    def encode(self, images: Sequence[Image.Image] | Image.Image) -> np.ndarray:
        """Features of ``images`` (any sizes): (N, dim) float32, deterministic."""
        if hasattr(images, "size") and hasattr(images, "mode"):  # one PIL image
            images = [images]
        if len(images) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        x = np.stack([self.grid_features(im) for im in images])  # (N, input_dim)
        # einsum, not BLAS: the same summation order for every row, so a screen's features do
        # not depend on the batch it came in, and no BLAS threads, which cost ~8 ms a call on
        # a busy 2-core machine against 0.1 ms here.
        return np.einsum("ni,ij->nj", x, self.projection)  # (N, dim)

    __call__ = encode

    def __repr__(self) -> str:
        return f"SimScreenEncoder(dim={self.dim}, seed={self.seed}, grid={self.grid})"
