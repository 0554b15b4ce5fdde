"""Trajectories as TRL's multi-turn vision dataset: ``images`` and ``messages`` (issue 31, item 4).

TRL's ``SFTTrainer`` trains a vision-language model on a ``datasets.Dataset`` whose rows
hold ``messages`` (``{"role", "content"}`` turns, each ``content`` a list of parts
``{"type": "image"}`` and ``{"type": "text", "text": ...}``) and ``images`` (the PIL images
that the ``{"type": "image"}`` parts stand for, in order): the layout of TRL 1.16's
``DataCollatorForVisionLanguageModeling`` and ``prepare_multimodal_messages``, and of the
Hub's vision SFT sets (e.g. ``HuggingFaceH4/llava-instruct-mix-vsft``).

:func:`to_messages_dataset` writes **one row per trajectory**, two turns per step::

    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": step.prompt}]}
    {"role": "assistant", "content": [{"type": "text", "text": step.action_text}]}

the screenshot the action was taken on with the prompt the policy reads (``Previous Actions:
... Goal: ...</s>``, spec/DIGIRL.md section 3), then what the policy wrote, verbatim, in the
action format (section 2). ``images[k]`` is step k's screen.

The other columns keep what the round trip needs, under the store's names
(:mod:`digirl_lite.data.store`): the trajectory table's columns (``traj_id``, ``task``,
``final_reward``, ``ending``, ``source``, ``iteration``, ``horizon``, ``seeds_json``,
``truncation_reason``, ``num_steps``, ``true_success``: the environment's truth, None where
it had none; a dataset written before that column reads as None); ``steps``, per step the
store's step columns but those the conversation holds (``prompt``, ``action_text``) or the
row implies (``traj_id``, ``step_index``); and ``extra_images``, the screens the steps led to
that no user turn shows (usually one: the screen after the last action), in the order of
:func:`_unshown`. TRL's trainer drops every column but ``messages`` and ``images``
(``remove_unused_columns``).

:func:`from_messages_dataset` gives back equal trajectories (every field of every step and
trajectory) and a :class:`ScreenTable` with the same pictures (PNG, lossless) under the same
screen ids. What it does not keep: screens' image features and source paths (TRL has no use
for them; features are recomputed from the images), and screens no step references. A step's
action is stored as its text only, so a step whose ``action`` is not what its ``action_text``
parses to (never the case for trajectories collected here: the environments and the
importers parse the text) is refused at export.

Train on the successes (:meth:`Trajectory.is_success`) for behaviour cloning; an
infrastructure truncation without steps is a row with no turns, which TRL cannot train on.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from digirl_lite.actions import parse_action
from digirl_lite.data.records import ScreenTable, Trajectory
from digirl_lite.data.store import (
    _ADDED_COLUMNS,
    _datasets,
    _features,
    _quiet_progress,
    _step_from_row,
    _step_row,
    _traj_from_row,
    _traj_row,
)

if TYPE_CHECKING:  # pragma: no cover
    import datasets

__all__ = ["MessagesFormatError", "to_messages_dataset", "from_messages_dataset",
           "messages_features"]

_IN_MESSAGES = ("prompt", "action_text")
"""Step columns the conversation holds (the user turn's text, the assistant turn's)."""
_IMPLIED = ("traj_id", "step_index")
"""Step columns the row and the turn's position imply."""


class MessagesFormatError(ValueError):
    """A dataset not in :func:`to_messages_dataset`'s layout (the message names the row and
    the column)."""


def messages_features() -> datasets.Features:
    """The dataset's columns and types (see the module docstring)."""
    ds = _datasets()
    v = ds.Value
    tables = _features(None)
    step = {k: f for k, f in tables["steps"].items() if k not in _IN_MESSAGES + _IMPLIED}
    return ds.Features({
        "images": ds.List(ds.Image()),
        "messages": ds.List({"role": v("string"),
                             "content": ds.List({"type": v("string"), "text": v("string")})}),
        **tables["trajectories"],
        "steps": ds.List(step),
        "extra_images": ds.List(ds.Image()),
    })


def _unshown(screen_pairs: Iterable[tuple[str, str]]) -> list[str]:
    """Of (screen_id, next_screen_id) per step: the next screens no step was taken on, in
    order of first appearance (the ``extra_images`` of a row)."""
    pairs = list(screen_pairs)
    shown = {sid for sid, _ in pairs}
    return list(dict.fromkeys(nxt for _, nxt in pairs if nxt not in shown))


# ----------------------------------------------------------------------------------------
# export
# ----------------------------------------------------------------------------------------
def to_messages_dataset(
    trajectories: Iterable[Trajectory],
    screens: ScreenTable,
    *,
    image_size: tuple[int, int] | None = None,
) -> datasets.Dataset:
    """One row per trajectory in TRL's multi-turn vision layout (see the module docstring).

    Args:
        trajectories: the trajectories to write, in row order (e.g. a store's successes:
            ``[t for t in load_trajectories(path)[0] if t.is_success]``).
        screens: a table holding every screen they reference, with its image.
        image_size: (width, height) to resize every screenshot to (bilinear, as the
            recorder shrinks them); None keeps the size the table holds (270 x 570 for the
            recorder's default). Screen ids are kept either way.

    Raises:
        ValueError: naming the trajectory and step, for a screen missing from ``screens`` or
            held without its image, or a step whose action is not its text's.
    """
    ds = _datasets()
    from PIL import Image

    if image_size is not None:
        image_size = tuple(image_size)  # type: ignore[assignment]
        if len(image_size) != 2 or not all(isinstance(n, int) and n > 0 for n in image_size):
            raise ValueError(f"image_size must be (width, height) in pixels, got {image_size}")
    features = messages_features()
    step_columns = list(features["steps"].feature)
    encoded: dict[str, dict[str, Any]] = {}  # a screen seen in many rows is encoded once

    def png(sid: str, where: str) -> dict[str, Any]:
        if sid not in encoded:
            if sid not in screens:
                raise ValueError(f"{where}: screen {sid!r} is not in the ScreenTable")
            img = screens.image(sid)
            if img is None:
                raise ValueError(f"{where}: screen {sid!r} is held without its image (features "
                                 "only); the messages layout needs the screenshots")
            if image_size is not None and img.size != image_size:
                img = img.resize(image_size, Image.BILINEAR)
            buf = io.BytesIO()
            img.save(buf, format="PNG")
            encoded[sid] = {"bytes": buf.getvalue(), "path": None}
        return encoded[sid]

    rows: list[dict[str, Any]] = []
    for t in trajectories:
        images, messages, steps = [], [], []
        for i, s in enumerate(t.steps):
            where = f"trajectory {t.traj_id!r}, step {i}"
            if parse_action(s.action_text) != s.action:
                raise ValueError(
                    f"{where}: its action ({s.action.action_type.value}) is not what its text "
                    f"parses to, and the messages layout keeps only the text "
                    f"({s.action_text[:120]!r})")
            images.append(png(s.screen_id, where))
            messages.append({"role": "user", "content": [{"type": "image", "text": None},
                                                         {"type": "text", "text": s.prompt}]})
            messages.append({"role": "assistant",
                             "content": [{"type": "text", "text": s.action_text}]})
            row = _step_row(t, i, s)
            steps.append({k: row[k] for k in step_columns})
        extra = [png(sid, f"trajectory {t.traj_id!r}, its last screens")
                 for sid in _unshown((s.screen_id, s.next_screen_id) for s in t.steps)]
        rows.append({"images": images, "messages": messages, **_traj_row(t), "steps": steps,
                     "extra_images": extra})
    with _quiet_progress():
        return ds.Dataset.from_dict({k: [r[k] for r in rows] for k in features},
                                    features=features)


# ----------------------------------------------------------------------------------------
# import
# ----------------------------------------------------------------------------------------
def from_messages_dataset(
    dataset: datasets.Dataset,
) -> tuple[list[Trajectory], ScreenTable]:
    """The trajectories and screens of a dataset :func:`to_messages_dataset` wrote (also
    after ``save_to_disk`` / ``load_from_disk`` or a trip through the Hub). Each distinct
    screen is decoded once and held in memory by the returned table.

    Raises:
        MessagesFormatError: for a missing column, a row whose image count does not match
            its image placeholders, turns that are not a user turn (image and prompt) and an
            assistant turn (the step's action) per step, or fields that do not make a valid
            trajectory; the message names the row and the column. Nothing is dropped.
    """
    ds = _datasets()
    if isinstance(dataset, ds.DatasetDict):
        raise MessagesFormatError(f"a DatasetDict (splits {sorted(dataset)}): pass one split, "
                                  f"e.g. dataset[{next(iter(dataset), 'train')!r}]")
    features = messages_features()
    missing = [k for k in features if k not in dataset.column_names
               and k not in _ADDED_COLUMNS["trajectories"]]  # older exports: None
    if missing:
        raise MessagesFormatError(
            f"the dataset has no column(s) {missing}; from_messages_dataset reads the layout "
            f"to_messages_dataset writes (columns {list(features)})")
    step_columns = list(features["steps"].feature)
    screens = ScreenTable()
    out: list[Trajectory] = []
    seen: dict[str, int] = {}
    for r, row in enumerate(dataset):
        t = _row_trajectory(r, row, step_columns, screens)
        if t.traj_id in seen:
            raise MessagesFormatError(f"row {r}, column 'traj_id': {t.traj_id!r} is also row "
                                      f"{seen[t.traj_id]}'s")
        seen[t.traj_id] = r
        out.append(t)
    return out, screens


def _row_trajectory(r: int, row: dict[str, Any], step_columns: Sequence[str],
                    screens: ScreenTable) -> Trajectory:
    from PIL import Image

    where = f"row {r} (trajectory {row['traj_id']!r})"

    def bad(column: str, msg: str) -> MessagesFormatError:
        return MessagesFormatError(f"{where}, column {column!r}: {msg}")

    for col in ("images", "messages", "steps", "extra_images"):
        if not isinstance(row[col], list):
            raise bad(col, f"expected a list, got {type(row[col]).__name__}")
    images, messages, metas = row["images"], row["messages"], row["steps"]
    if len(metas) != row["num_steps"]:
        raise bad("steps", f"{len(metas)} steps, but num_steps is {row['num_steps']}")
    if len(messages) != 2 * len(metas):
        raise bad("messages", f"{len(messages)} turns for {len(metas)} steps (each step is a "
                              "user turn and an assistant turn)")
    placeholders = sum(1 for m in messages if isinstance(m, dict)
                       for part in _content(m) if part.get("type") == "image")
    if placeholders != len(images):
        raise bad("images", f"{len(images)} images for {placeholders} image placeholders in "
                            "'messages'")
    for i, meta in enumerate(metas):
        absent = [k for k in step_columns if not isinstance(meta, dict) or k not in meta]
        if absent:
            raise bad("steps", f"step {i} has no field(s) {absent}")
    extra_ids = _unshown((m["screen_id"], m["next_screen_id"]) for m in metas)
    if len(row["extra_images"]) != len(extra_ids):
        raise bad("extra_images", f"{len(row['extra_images'])} images for the {len(extra_ids)} "
                                  "screen(s) the steps led to that no user turn shows")
    for col, pictures, ids in (("images", images, [m["screen_id"] for m in metas]),
                               ("extra_images", row["extra_images"], extra_ids)):
        for k, (img, sid) in enumerate(zip(pictures, ids)):
            if not isinstance(img, Image.Image):
                raise bad(col, f"item {k} is a {type(img).__name__}, not a decoded image "
                               "(load the column as datasets.Image())")
            screens.add(img, screen_id=sid)

    steps = []
    for i, meta in enumerate(metas):
        texts = []
        for k, role, n_images in ((2 * i, "user", 1), (2 * i + 1, "assistant", 0)):
            try:
                texts.append(_turn_text(messages[k], role, n_images))
            except ValueError as e:
                raise bad("messages", f"turn {k} (step {i}'s {role} turn) {e}") from None
        prompt, text = texts
        try:
            step = _step_from_row({**meta, "prompt": prompt, "action_text": text})
        except (ValueError, TypeError) as e:
            raise bad("steps", f"step {i}: {e}") from e
        parsed = parse_action(text)
        if parsed != step.action:
            said = (f"does not parse ({parsed.invalid_reason})" if not parsed.is_valid
                    else f"is a {parsed.action_type.value}")
            raise bad("messages", f"turn {2 * i + 1} (step {i}'s assistant turn) is not the "
                                  f"step's action: {text[:120]!r} {said}, but step {i} was "
                                  f"recorded as {step.action.action_type.value}")
        steps.append(step)
    try:
        return _traj_from_row(row, steps)
    except (ValueError, TypeError) as e:
        raise MessagesFormatError(f"{where}: {e}") from e


def _content(turn: dict[str, Any]) -> list[dict[str, Any]]:
    """A turn's parts (string content, which TRL also takes, is one text part)."""
    c = turn.get("content")
    if isinstance(c, str):
        return [{"type": "text", "text": c}]
    return [p for p in c if isinstance(p, dict)] if isinstance(c, list) else []


def _turn_text(turn: Any, role: str, n_images: int) -> str:
    """The one text part of a ``role`` turn with exactly ``n_images`` image parts; a
    ValueError saying what is wrong otherwise."""
    if not isinstance(turn, dict) or turn.get("role") != role:
        got = turn.get("role") if isinstance(turn, dict) else type(turn).__name__
        raise ValueError(f"should be a {role!r} turn, got {got!r}")
    parts = _content(turn)
    texts = [p.get("text") for p in parts if p.get("type") == "text"]
    kinds = [p.get("type") for p in parts]
    if (len(texts) != 1 or not isinstance(texts[0], str)
            or kinds.count("image") != n_images or len(kinds) != n_images + 1):
        want = "one image part and one text part" if n_images else "one text part"
        raise ValueError(f"should hold {want}, got parts {kinds}")
    return texts[0]
