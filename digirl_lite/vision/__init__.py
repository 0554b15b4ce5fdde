"""Image features of screenshots: the paper's frozen BLIP-2 tower, a cheap simulator encoder,
and a cache that encodes each distinct screen once.

* :class:`Blip2Features` (``blip2.py``): BLIP-2's vision tower, pooled, 1408 floats per
  screenshot (spec/DIGIRL.md section 3); needs torch and transformers and a local checkpoint.
* :class:`SimScreenEncoder` (``sim_encoder.py``): numpy only, ~0.35 ms a stored screen; enough to
  tell the simulated phone's screens apart and see pop-ups and drift.
* :class:`FeatureCache` (``cache.py``): features by screen content key; fills a
  :class:`~digirl_lite.data.ScreenTable`.

``import digirl_lite.vision`` is light: each class is imported on first use, and torch and
transformers only when a :class:`Blip2Features` is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from digirl_lite._lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.vision.blip2 import Blip2Features
    from digirl_lite.vision.cache import FeatureCache, ImageEncoder
    from digirl_lite.vision.sim_encoder import SimScreenEncoder

__all__ = ["Blip2Features", "SimScreenEncoder", "FeatureCache", "ImageEncoder"]

_WHERE = {
    "Blip2Features": "digirl_lite.vision.blip2",
    "SimScreenEncoder": "digirl_lite.vision.sim_encoder",
    "FeatureCache": "digirl_lite.vision.cache",
    "ImageEncoder": "digirl_lite.vision.cache",
}


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
