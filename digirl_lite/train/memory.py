"""Memory bounded by the replay buffer (issue 15): what a long run keeps of its screens and
caches.

A run's :class:`~digirl_lite.data.ScreenTable` gains the screens of every trajectory it
collects, its :class:`~digirl_lite.vision.FeatureCache` the features of every screen it
encodes, its :class:`~digirl_lite.critics.EmbeddingCache` every prompt it embeds. Everything
collected is in the trajectory store on disk, and the learner only reads what its buffer
holds, so after each ``buffer.add``::

    bound_to_buffer(buffer, screens, features, text)

drops the screens (images or loaders, features) no buffered trajectory uses, including
the shared ones only once the last trajectory using them is evicted, and trims both caches
to what the buffer needs plus a few recently used entries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.critics.text import EmbeddingCache
    from digirl_lite.data.records import ScreenTable
    from digirl_lite.data.replay import ReplayBuffer
    from digirl_lite.vision.cache import FeatureCache

__all__ = ["bound_to_buffer"]


def bound_to_buffer(
    buffer: ReplayBuffer,
    screens: ScreenTable,
    features: FeatureCache | None = None,
    text: EmbeddingCache | None = None,
    *,
    feature_spare: int | None = None,
    text_spare: int | None = None,
) -> dict[str, int]:
    """Drop what the buffer no longer needs; return how much was dropped of each.

    - ``screens``: every screen no buffered step uses (``buffer.screen_ids()``, kept up to
      date by ``buffer.add``), in one compaction of the table.
    - ``features``: the vectors of screens not in ``screens``, except the ``feature_spare``
      most recently used (default :data:`~digirl_lite.vision.cache.SPARE_FEATURES`).
    - ``text``: the embeddings of texts the buffer's trajectories do not use
      (:func:`~digirl_lite.critics.data.buffer_texts`), except the ``text_spare`` most
      recently used (default :data:`~digirl_lite.critics.text.SPARE_TEXTS`).

    Costs one pass over the table and the caches; the text pass (over the buffer's steps) is
    skipped while the text cache is within its spare.
    """
    out = {"screens": len(screens.retain(buffer.screen_ids()))}
    if features is not None:
        from digirl_lite.vision.cache import SPARE_FEATURES

        out["features"] = features.prune(
            screens, SPARE_FEATURES if feature_spare is None else feature_spare)
    if text is not None:
        from digirl_lite.critics.text import SPARE_TEXTS

        spare = SPARE_TEXTS if text_spare is None else text_spare
        out["texts"] = 0
        if len(text) > spare:
            from digirl_lite.critics.data import buffer_texts

            out["texts"] = text.prune(buffer_texts(buffer), spare)
    return out
