"""Encode each distinct screen once: a feature cache keyed by screen content.

The same screens come back all the time (the launcher starts every episode, a shop's home
page is visited by every task on that shop), and a BLIP-2 forward pass costs far more than a
simulator step (notes/MEASURED.md: do each image job once per distinct screen). The cache's
key is the screen's content hash (:func:`digirl_lite.data.records.screen_id_of_image`) or an
id the caller already has, such as the environment's ``obs.screen_id`` or a
:class:`~digirl_lite.data.ScreenTable` id; equal keys must mean identical pixels.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from digirl_lite.data.records import screen_id_of_image

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

    from digirl_lite.data.records import ScreenTable

__all__ = ["ImageEncoder", "FeatureCache"]

SPARE_FEATURES = 1024
"""Feature vectors :meth:`FeatureCache.prune` keeps beyond the screens still needed (the most
recently used): 1024 x 1408 floats (BLIP-2) is 5.8 MB."""


@runtime_checkable
class ImageEncoder(Protocol):
    """Anything that maps screenshots to feature vectors (Blip2Features, SimScreenEncoder)."""

    dim: int

    def encode(self, images: Sequence[Image.Image]) -> np.ndarray:
        """(N, dim) float32 features of N images."""
        ...


class FeatureCache:
    """Features of screens by content key; only misses are encoded, in one encoder call.

    Args:
        encoder: an :class:`ImageEncoder`.
        max_items: keep at most this many feature vectors, least recently used out first
            (None: unbounded; 10k screens x 1408 floats is 56 MB).

    Attributes:
        hits, misses: lookups answered from the cache / encoded. A key repeated within one
            ``get`` call is encoded once: its first lookup is the miss, the others are hits.
    """

    def __init__(self, encoder: ImageEncoder, max_items: int | None = None) -> None:
        if max_items is not None and max_items <= 0:
            raise ValueError(f"max_items must be positive or None, got {max_items}")
        self.encoder = encoder
        self.max_items = max_items
        self.dim = int(encoder.dim)
        self._store: OrderedDict[str, np.ndarray] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._store)

    def __contains__(self, key: object) -> bool:
        return key in self._store

    @property
    def hit_rate(self) -> float:
        """hits / lookups (0.0 before the first lookup)."""
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    def get(self, images: Sequence[Image.Image], ids: Sequence[str] | None = None) -> np.ndarray:
        """Features of ``images``: (N, dim) float32, row i for image i.

        Args:
            images: the screens. For keys already cached the image is not looked at, so a
                caller holding ids may pass placeholders only where it knows the key is cached.
            ids: one content key per image (default: ``screen_id_of_image`` of each image).
        """
        images = list(images)
        if ids is None:
            ids = [screen_id_of_image(im) for im in images]
        ids = list(ids)
        if len(ids) != len(images):
            raise ValueError(f"{len(images)} images but {len(ids)} ids")
        out = np.empty((len(images), self.dim), dtype=np.float32)
        todo: dict[str, list[int]] = {}  # key -> rows waiting for it, first row encodes
        for i, key in enumerate(ids):
            feats = self._store.get(key)
            if feats is not None:
                self._store.move_to_end(key)
                out[i] = feats
                self.hits += 1
            elif key in todo:
                todo[key].append(i)
                self.hits += 1
            else:
                todo[key] = [i]
                self.misses += 1
        if todo:
            keys = list(todo)
            new = np.asarray(self.encoder.encode([images[todo[k][0]] for k in keys]),
                             dtype=np.float32)
            if new.shape != (len(keys), self.dim):
                raise ValueError(
                    f"the encoder returned {new.shape} for {len(keys)} images, expected "
                    f"({len(keys)}, {self.dim})"
                )
            for key, row in zip(keys, new):
                out[todo[key]] = row
                self._put(key, row.copy())
        return out

    def _put(self, key: str, feats: np.ndarray) -> None:
        self._store[key] = feats
        self._store.move_to_end(key)
        if self.max_items is not None:
            while len(self._store) > self.max_items:
                self._store.popitem(last=False)

    def fill(self, screens: ScreenTable, batch_size: int = 256) -> int:
        """Give features to the screens of ``screens`` that lack them and have an image.

        The table's screen ids are the cache keys; a screen already cached is filled without
        reading its image. Screens without an image (imported with features only, or without
        either) are left as they are. Returns the number filled.
        """
        todo = [sid for sid in screens.ids if not screens.has_features(sid)]
        filled = 0
        for i in range(0, len(todo), batch_size):
            ids, images = [], []
            for sid in todo[i:i + batch_size]:
                cached = sid in self._store  # then the image need not be read
                img = None if cached else screens.image(sid)
                if cached or img is not None:
                    ids.append(sid)
                    images.append(img)
            if not ids:
                continue
            feats = self.get(images, ids)
            for sid, f in zip(ids, feats):
                screens.add(features=f, screen_id=sid)
            filled += len(ids)
        return filled

    def prune(self, keep: Container[str], spare: int = SPARE_FEATURES) -> int:
        """Forget the feature vectors not needed: every key in ``keep`` stays (e.g. the
        Trainer's ScreenTable, which the buffer bounds), and of the other keys only the
        ``spare`` most recently used (screens likely to come back: launchers, home pages).

        After it the cache holds at most ``len(keep) + spare`` vectors; one pass over the
        cache. Returns how many were forgotten.
        """
        if spare < 0:
            raise ValueError(f"spare must be >= 0, got {spare}")
        if len(self._store) <= spare:
            return 0
        others = [k for k in self._store if k not in keep]  # oldest first
        gone = others[:max(0, len(others) - spare)]
        for k in gone:
            del self._store[k]
        return len(gone)

    def clear(self) -> None:
        """Forget every feature vector and reset the counters."""
        self._store.clear()
        self.hits = self.misses = 0
