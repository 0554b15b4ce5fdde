"""The trajectory store: HF ``datasets`` (Arrow) on disk, appended in shards.

Layout of a store directory::

    digirl_store.json          manifest: format, schema_version, feature_dim, shard list
    shard-00000/trajectories/  one row per trajectory   (datasets.save_to_disk)
    shard-00000/steps/         one row per step
    shard-00000/screens/       one row per distinct screen: image (PNG), features (float32 x d)
    shard-00000/ids.json       the shard's trajectory ids and the screen ids it stored
    shard-00001/...            each append writes one shard

Each screen is stored once across all shards (an append skips screens already stored), and
features once per screen; the two-frame critic state is rebuilt by index on load.

Appends are atomic: a shard is written to a temporary folder, renamed into place, and only
then listed in the manifest (itself replaced atomically). A crash mid-append leaves the store
as it was; a shard folder that the manifest does not list is ignored.

Appends cost what they add: which trajectories and screens are stored is known from each
listed shard's ``ids.json`` (written inside the shard, so it is listed exactly when the shard
is), read once per process and store and then kept up to date, so an append never reads
earlier shards' tables (shards written before ``ids.json`` existed are read once).
:meth:`TrajectoryStore.traj_ids` and ``traj_id in store`` answer from it, exactly: only
listed shards count, and the manifest is re-read whenever another object has replaced it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from digirl_lite.actions import Action, ActionType
from digirl_lite.data.records import ScreenTable, Source, Step, Trajectory

__all__ = [
    "SCHEMA_VERSION",
    "MANIFEST",
    "StoreError",
    "TrajectoryStore",
    "save_trajectories",
    "load_trajectories",
]

SCHEMA_VERSION = 1
MANIFEST = "digirl_store.json"
FORMAT_NAME = "digirl_lite.trajectory_store"
IDS_FILE = "ids.json"
"""In each shard: ``{"traj_ids": [...], "screen_ids": [...]}`` (the screens it stored)."""


class StoreError(RuntimeError):
    """A store that is missing, of another schema version, or corrupt (the message says where)."""


def _datasets():
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - a core dependency
        raise ImportError("the trajectory store needs `datasets` (pip install digirl-lite)") from e
    return datasets


@contextmanager
def _quiet_progress():
    ds = _datasets()
    from datasets.utils import logging as dlog

    was = ds.are_progress_bars_disabled()
    level = dlog.get_verbosity()
    ds.disable_progress_bars()
    dlog.set_verbosity_error()
    try:
        yield
    finally:
        dlog.set_verbosity(level)
        if not was:
            ds.enable_progress_bars()


def _features(feature_dim: int | None) -> dict[str, Any]:
    ds = _datasets()
    v = ds.Value
    traj = ds.Features({
        "traj_id": v("string"), "task": v("string"), "final_reward": v("float64"),
        "ending": v("string"), "source": v("string"), "iteration": v("int64"),
        "horizon": v("int64"), "seeds_json": v("string"), "truncation_reason": v("string"),
        "num_steps": v("int64"), "true_success": v("bool"),
    })
    steps = ds.Features({
        "traj_id": v("string"), "step_index": v("int64"), "task": v("string"),
        "prompt": v("string"), "action_text": v("string"), "action_type": v("string"),
        "touch_y": v("float64"), "touch_x": v("float64"), "lift_y": v("float64"),
        "lift_x": v("float64"), "typed_text": v("string"), "invalid_reason": v("string"),
        "reward": v("float64"), "done": v("bool"), "screen_id": v("string"),
        "next_screen_id": v("string"), "mc_return": v("float64"), "timings_json": v("string"),
        "verdict": v("string"), "judge_reply": v("string"), "policy_version": v("int64"),
        "action_token_ids": ds.List(v("int64")), "action_log_probs": ds.List(v("float32")),
        "decided_by": v("string"),
    })
    screen_cols = {"screen_id": v("string"), "image": ds.Image(), "source_path": v("string")}
    if feature_dim:
        screen_cols["features"] = ds.List(v("float32"), length=feature_dim)
    return {"trajectories": traj, "steps": steps, "screens": ds.Features(screen_cols)}


_ADDED_COLUMNS: dict[str, dict[str, Any]] = {
    "steps": {"policy_version": -1, "action_token_ids": [], "action_log_probs": [],
              "decided_by": ""},
    "trajectories": {"true_success": None},  # issue 32: the environment's truth
}
"""Columns added after schema version 1 was first written, per table, with the value an
older store's rows read as (an unknown version, no tokens, no truth)."""


# ----------------------------------------------------------------------------------------
# records <-> rows
# ----------------------------------------------------------------------------------------
def _traj_row(t: Trajectory) -> dict[str, Any]:
    return {
        "traj_id": t.traj_id, "task": t.task, "final_reward": float(t.final_reward),
        "ending": t.ending.value, "source": t.source.value, "iteration": t.iteration,
        "horizon": t.horizon, "seeds_json": json.dumps(dict(t.seeds), sort_keys=True),
        "truncation_reason": t.truncation_reason, "num_steps": len(t.steps),
        "true_success": t.true_success,
    }


def _traj_from_row(r: dict[str, Any], steps: Sequence[Step]) -> Trajectory:
    """The trajectory of a :func:`_traj_row` row and its steps (``num_steps`` is the
    caller's to check)."""
    return Trajectory(
        traj_id=r["traj_id"], task=r["task"], steps=tuple(steps),
        final_reward=r["final_reward"], ending=r["ending"], source=Source(r["source"]),
        iteration=r["iteration"], horizon=r["horizon"],
        seeds=json.loads(r["seeds_json"] or "{}"), truncation_reason=r["truncation_reason"],
        true_success=r.get("true_success"),  # absent from older rows: no truth recorded
    )


def _step_row(t: Trajectory, i: int, s: Step) -> dict[str, Any]:
    a = s.action
    return {
        "traj_id": t.traj_id, "step_index": i, "task": s.task, "prompt": s.prompt,
        "action_text": s.action_text, "action_type": a.action_type.value,
        "touch_y": a.touch_yx[0], "touch_x": a.touch_yx[1],
        "lift_y": a.lift_yx[0], "lift_x": a.lift_yx[1],
        "typed_text": a.typed_text, "invalid_reason": a.invalid_reason,
        "reward": float(s.reward), "done": bool(s.done), "screen_id": s.screen_id,
        "next_screen_id": s.next_screen_id, "mc_return": float(s.mc_return),
        "timings_json": json.dumps(dict(s.timings), sort_keys=True),
        "verdict": s.verdict.value if s.verdict is not None else None,
        "judge_reply": s.judge_reply, "policy_version": int(s.policy_version),
        "action_token_ids": list(s.action_token_ids),
        "action_log_probs": list(s.action_log_probs),
        "decided_by": s.decided_by,
    }


def _action_from_row(r: dict[str, Any]) -> Action:
    atype = ActionType(r["action_type"])
    if atype is ActionType.INVALID:
        return Action.invalid(r["invalid_reason"] or "invalid", raw=r["action_text"])
    return Action(atype, (r["touch_y"], r["touch_x"]), (r["lift_y"], r["lift_x"]),
                  r["typed_text"] or "")


def _step_from_row(r: dict[str, Any]) -> Step:
    return Step(
        task=r["task"], prompt=r["prompt"], action_text=r["action_text"],
        action=_action_from_row(r), reward=r["reward"], done=r["done"],
        screen_id=r["screen_id"], next_screen_id=r["next_screen_id"],
        mc_return=r["mc_return"], timings=json.loads(r["timings_json"] or "{}"),
        verdict=r["verdict"], judge_reply=r["judge_reply"],
        policy_version=r.get("policy_version", -1),
        action_token_ids=r.get("action_token_ids") or (),
        action_log_probs=r.get("action_log_probs") or (),
        decided_by=r.get("decided_by") or "",
    )


# ----------------------------------------------------------------------------------------
# Which ids a store holds
# ----------------------------------------------------------------------------------------
class _IdIndex:
    """Trajectory and screen ids of a store's first ``len(shards)`` listed shards."""

    __slots__ = ("shards", "traj_ids", "screen_ids")

    def __init__(self) -> None:
        self.shards: list[tuple[str, str | None]] = []  # (name, uid) in manifest order
        self.traj_ids: set[str] = set()
        self.screen_ids: dict[str, tuple[str, int]] = {}  # -> (shard, row in its screens)

    def add(self, shard: tuple[str, str | None], traj_ids: Iterable[str],
            screen_ids: Iterable[str]) -> None:
        self.traj_ids.update(traj_ids)
        for row, sid in enumerate(screen_ids):
            self.screen_ids.setdefault(sid, (shard[0], row))
        self.shards.append(shard)


_INDEXES: OrderedDict[tuple[str, str], _IdIndex] = OrderedDict()
"""Per (real path, store id), shared by every TrajectoryStore object of this process (the
Trainer opens its store anew for each append); shards are immutable once listed, and an
index is only used for a manifest whose (name, uid) list starts with the index's."""
_INDEXES_KEPT = 16


# ----------------------------------------------------------------------------------------
# The store
# ----------------------------------------------------------------------------------------
class TrajectoryStore:
    """A directory of trajectories and screens; see the module docstring for its layout.

    Use :meth:`create` for a new store, :meth:`open` for an existing one, :meth:`append` to
    add trajectories (with the screens they reference), :meth:`load` to read everything.
    """

    def __init__(self, path: str | os.PathLike[str], manifest: dict[str, Any]) -> None:
        self.path = Path(path)
        self.manifest = manifest
        self._manifest_sig: tuple[int, int, int] | None = None  # of the file last read
        self._index: _IdIndex | None = None

    # -- opening ------------------------------------------------------------------------
    @classmethod
    def create(
        cls, path: str | os.PathLike[str], feature_dim: int | None = None,
        exist_ok: bool = False,
    ) -> TrajectoryStore:
        """Make an empty store at ``path`` (an existing store is opened if ``exist_ok``)."""
        p = Path(path)
        if (p / MANIFEST).exists():
            if exist_ok:
                return cls.open(p)
            raise StoreError(f"{p} already holds a trajectory store")
        if p.exists() and any(p.iterdir()):
            raise StoreError(f"{p} exists and is not empty; refusing to create a store there")
        p.mkdir(parents=True, exist_ok=True)
        manifest = {"format": FORMAT_NAME, "schema_version": SCHEMA_VERSION,
                    "feature_dim": feature_dim, "shards": [], "rows": {},
                    "store_id": uuid.uuid4().hex, "shard_uids": {}}
        store = cls(p, {})
        store._write_manifest(manifest)
        return store

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> TrajectoryStore:
        """Open an existing store; StoreError with the reason if it is not a valid one."""
        store = cls(path, {})
        store._refresh()
        return store

    @staticmethod
    def _read_manifest(p: Path) -> tuple[dict[str, Any], tuple[int, int, int]]:
        """The manifest of the store at ``p``, validated, and the (inode, mtime, size) of
        the file it was read from."""
        mpath = p / MANIFEST
        if not mpath.is_file():
            raise StoreError(f"{p} is not a digirl_lite trajectory store (no {MANIFEST})")
        try:
            with open(mpath, "rb") as f:
                st = os.fstat(f.fileno())
                manifest = json.loads(f.read().decode())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise StoreError(f"{mpath} is corrupt: {e}") from e
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
            raise StoreError(f"{mpath} is not a digirl_lite store manifest")
        version = manifest.get("schema_version")
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"{p} has schema version {version!r}; this digirl_lite reads version "
                f"{SCHEMA_VERSION}"
            )
        if not isinstance(manifest.get("shards"), list):
            raise StoreError(f"{mpath} has no shard list")
        return manifest, (st.st_ino, st.st_mtime_ns, st.st_size)

    def _refresh(self) -> None:
        """Re-read the manifest if the file is not the one last read or written by this
        object (another object appended): a stat when nothing changed."""
        try:
            st = os.stat(self.path / MANIFEST)
            sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            sig = None
        if sig is None or sig != self._manifest_sig:
            self.manifest, self._manifest_sig = self._read_manifest(self.path)

    @property
    def feature_dim(self) -> int | None:
        return self.manifest.get("feature_dim")

    def _write_manifest(self, manifest: dict[str, Any]) -> None:
        """Replace the manifest file by ``manifest`` atomically; only then is it this
        object's manifest."""
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".manifest-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(manifest, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
                st = os.fstat(f.fileno())  # a rename keeps inode and mtime
            os.replace(tmp, self.path / MANIFEST)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.manifest = manifest
        self._manifest_sig = (st.st_ino, st.st_mtime_ns, st.st_size)

    # -- which ids are stored ---------------------------------------------------------------
    def _ids(self) -> _IdIndex:
        """The ids of the listed shards: the newest manifest, the shards not indexed yet."""
        self._refresh()
        uids = self.manifest.get("shard_uids") or {}
        listed = [(name, uids.get(name)) for name in self.manifest["shards"]]
        sid = self.manifest.get("store_id")
        key = (os.path.realpath(self.path), sid) if sid else None
        idx = _INDEXES.get(key) if key else None
        if idx is None or idx.shards != listed[:len(idx.shards)]:
            idx = self._index
        if idx is None or idx.shards != listed[:len(idx.shards)]:
            idx = _IdIndex()
        for shard in listed[len(idx.shards):]:
            idx.add(shard, *self._shard_ids(shard[0]))
        self._remember(idx)
        return idx

    def _remember(self, idx: _IdIndex) -> None:
        self._index = idx
        sid = self.manifest.get("store_id")
        if sid:
            key = (os.path.realpath(self.path), sid)
            _INDEXES[key] = idx
            _INDEXES.move_to_end(key)
            while len(_INDEXES) > _INDEXES_KEPT:
                _INDEXES.popitem(last=False)

    def _shard_ids(self, shard: str) -> tuple[list[str], list[str]]:
        """A listed shard's (trajectory ids, screen ids stored in it): its ``ids.json``, or
        its tables where that is missing (older stores) or does not match the manifest."""
        rows = self.manifest.get("rows", {}).get(shard, {})
        try:
            d = json.loads((self.path / shard / IDS_FILE).read_text())
            t, s = d["traj_ids"], d["screen_ids"]
            if (isinstance(t, list) and isinstance(s, list)
                    and len(t) == rows.get("trajectories", len(t))
                    and len(s) == rows.get("screens", len(s))):
                return t, s
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return (self._load_table(shard, "trajectories").data.column("traj_id").to_pylist(),
                self._load_table(shard, "screens").data.column("screen_id").to_pylist())

    def traj_ids(self) -> frozenset[str]:
        """Ids of the stored trajectories, exactly those of the shards the manifest lists
        (an append that did not finish adds none). Cheap: no table is read."""
        return frozenset(self._ids().traj_ids)

    def __contains__(self, traj_id: object) -> bool:
        """Whether a trajectory of this id is stored (``t.traj_id in store``); see
        :meth:`traj_ids`."""
        return traj_id in self._ids().traj_ids

    # -- writing ------------------------------------------------------------------------
    def stored_screen_ids(self) -> set[str]:
        """Ids of the stored screens (a copy; no table is read, see :meth:`traj_ids`)."""
        return set(self._ids().screen_ids)

    def append(self, trajectories: Sequence[Trajectory], screens: ScreenTable,
               offload: bool = True) -> str | None:
        """Write ``trajectories`` and the screens they reference as one new shard.

        Screens already in the store are not written again. Every screen a step references
        must be in ``screens`` or already stored. Returns the shard name (None if empty).

        With ``offload`` the screens just written stay in ``screens`` as loaders from this
        shard instead of decoded images (:meth:`ScreenTable.offload`): ``screens.image(id)``
        still returns the picture, and a long run's memory stays flat. So do the screens
        these trajectories use that were stored by an earlier append and are decoded in
        ``screens`` (a run that dropped them from its table and saw them again): loaders from
        the shards that hold them.
        """
        trajectories = list(trajectories)
        if not trajectories:
            return None
        index = self._ids()  # also the newest manifest, if another object appended
        fd = self.feature_dim  # the manifest changes only once the shard is in place
        if fd is None and screens.feature_dim is not None:
            if self.manifest["shards"]:
                raise StoreError(
                    f"{self.path} was written without image features; these screens carry "
                    f"{screens.feature_dim}-d features. Write them to a new store."
                )
            fd = screens.feature_dim
        elif screens.feature_dim not in (None, fd):
            raise StoreError(
                f"screens carry {screens.feature_dim}-d features; {self.path} stores {fd}-d"
            )
        stored, known = index.screen_ids, index.traj_ids
        adding: set[str] = set()
        needed: dict[str, None] = {}
        for t in trajectories:
            if t.traj_id in known or t.traj_id in adding:
                raise StoreError(f"trajectory {t.traj_id!r} is already in {self.path}")
            adding.add(t.traj_id)
            for s in t.steps:
                needed.setdefault(s.screen_id)
                needed.setdefault(s.next_screen_id)
        new_ids = [sid for sid in needed if sid not in stored]
        old_ids = [sid for sid in needed if sid in stored]
        missing = [sid for sid in new_ids if sid not in screens]
        if missing:
            raise StoreError(
                f"{len(missing)} referenced screen(s) are neither in the ScreenTable nor in "
                f"the store, e.g. {missing[0]!r}"
            )
        feats = _features(fd)
        ds = _datasets()
        traj_rows = [_traj_row(t) for t in trajectories]
        step_rows = [_step_row(t, i, s) for t in trajectories for i, s in enumerate(t.steps)]
        screen_rows = []
        for sid in new_ids:
            row: dict[str, Any] = {"screen_id": sid, "image": screens.image(sid),
                                   "source_path": screens.source_path(sid)}
            if fd:
                f = screens.matrix()[screens.index_of([sid])[0]]
                row["features"] = None if np.isnan(f).all() else f
            screen_rows.append(row)

        names = set(self.manifest["shards"])
        n = len(names)
        while f"shard-{n:05d}" in names or (self.path / f"shard-{n:05d}").exists():
            n += 1
        name = f"shard-{n:05d}"
        tmp = Path(tempfile.mkdtemp(dir=self.path, prefix=f".tmp-{name}-"))
        try:
            with _quiet_progress():
                for table, rows in (("trajectories", traj_rows), ("steps", step_rows),
                                    ("screens", screen_rows)):
                    if not rows:  # datasets writes no data file for 0 rows; see _load_table
                        continue
                    cols = {k: [r.get(k) for r in rows] for k in feats[table]}
                    dset = ds.Dataset.from_dict(cols, features=feats[table])
                    dset.save_to_disk(str(tmp / table))
            traj_ids = [t.traj_id for t in trajectories]
            (tmp / IDS_FILE).write_text(json.dumps({"traj_ids": traj_ids,
                                                    "screen_ids": new_ids}))
            os.rename(tmp, self.path / name)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        uid = uuid.uuid4().hex
        m = self.manifest
        self._write_manifest({
            **m, "feature_dim": fd, "shards": [*m["shards"], name],
            "rows": {**m.get("rows", {}), name: {
                "trajectories": len(traj_rows), "steps": len(step_rows),
                "screens": len(screen_rows)}},
            "store_id": m.get("store_id") or uuid.uuid4().hex,  # older stores get one now
            "shard_uids": {**(m.get("shard_uids") or {}), name: uid},
        })
        index.add((name, uid), traj_ids, new_ids)  # listed now, so now in the index
        self._remember(index)
        if offload:
            loaders: dict[str, Any] = {}
            if screen_rows:
                written = self._load_table(name, "screens")
                loaders.update({sid: _ImageLoader(written, row)
                                for row, sid in enumerate(new_ids)
                                if screen_rows[row]["image"] is not None})
            # screens stored earlier, dropped from a run's table and seen again: decoded anew
            where: dict[str, list[tuple[str, int]]] = {}
            for sid in screens.decoded(old_ids):
                shard, row = stored[sid]
                where.setdefault(shard, []).append((sid, row))
            for shard, rows in where.items():  # a shard's screens table per shard, no more
                dset = self._load_table(shard, "screens")
                images = dset.data.column("image")
                loaders.update({sid: _ImageLoader(dset, row) for sid, row in rows
                                if images[row].is_valid})  # stored with its picture
            screens.offload(loaders)
        return name

    # -- reading ------------------------------------------------------------------------
    def _load_table(self, shard: str, table: str):
        ds = _datasets()
        where = self.path / shard / table
        expected = _features(self.feature_dim)[table]
        n_rows = self.manifest.get("rows", {}).get(shard, {}).get(table)
        if n_rows == 0:  # empty tables are not written
            if where.exists():
                raise StoreError(f"{where} should be empty (the manifest says 0 rows)")
            return ds.Dataset.from_dict({k: [] for k in expected}, features=expected)
        if not (self.path / shard).is_dir():
            raise StoreError(f"{self.path / shard} is listed in the manifest but missing")
        try:
            with _quiet_progress():
                dset = ds.load_from_disk(str(where))
        except Exception as e:
            raise StoreError(f"cannot read {where}: {type(e).__name__}: {e}") from e
        added = _ADDED_COLUMNS.get(table, {})
        absent = [k for k in added if k not in dset.features]
        if absent and set(dset.features) | set(absent) == set(expected):
            # written before these columns existed: unknown (-1, no tokens, no truth)
            for k in absent:
                dset = dset.add_column(k, [added[k]] * dset.num_rows)
            dset = dset.cast(expected, keep_in_memory=True)  # reading writes nothing
        if dset.features != expected:
            got = set(dset.features)
            want = set(expected)
            detail = (f"missing columns {sorted(want - got)}, unexpected {sorted(got - want)}"
                      if got != want else "column types differ")
            raise StoreError(f"{where} does not match schema version {SCHEMA_VERSION}: {detail}")
        if n_rows is not None and dset.num_rows != n_rows:
            raise StoreError(f"{where} has {dset.num_rows} rows; the manifest says {n_rows}")
        return dset

    def __len__(self) -> int:
        self._refresh()
        return sum(self._load_table(s, "trajectories").num_rows for s in self.manifest["shards"])

    def load(self, with_images: bool = True) -> tuple[list[Trajectory], ScreenTable]:
        """Read every trajectory and screen.

        Images are decoded on demand (``screens.image(id)``); features are loaded at once.

        Raises:
            StoreError: naming the shard and table that is corrupt or inconsistent.
        """
        self._refresh()
        screens = ScreenTable(self.feature_dim)
        trajectories: list[Trajectory] = []
        for shard in self.manifest["shards"]:
            sc = self._load_table(shard, "screens")
            ids = sc.data.column("screen_id").to_pylist()
            paths = sc.data.column("source_path").to_pylist()
            if self.feature_dim:
                col = sc.data.column("features")
                flat = col.to_pylist()
            else:
                flat = [None] * len(ids)
            has_image = [not v for v in sc.data.column("image").is_null().to_pylist()]
            for row, (sid, f, p, hi) in enumerate(zip(ids, flat, paths, has_image)):
                loader = _ImageLoader(sc, row) if (with_images and hi) else None
                screens.add(loader, None if f is None else np.asarray(f, np.float32),
                            screen_id=sid, source_path=p)
            tr = self._load_table(shard, "trajectories").to_list()
            st = self._load_table(shard, "steps").to_list()
            by_traj: dict[str, list[dict[str, Any]]] = {}
            for r in st:
                by_traj.setdefault(r["traj_id"], []).append(r)
            for r in tr:
                rows = sorted(by_traj.pop(r["traj_id"], []), key=lambda x: x["step_index"])
                where = f"{self.path / shard}: trajectory {r['traj_id']!r}"
                if [x["step_index"] for x in rows] != list(range(r["num_steps"])):
                    raise StoreError(f"{where} should have steps 0..{r['num_steps'] - 1}, "
                                     f"found {[x['step_index'] for x in rows][:10]}")
                try:
                    trajectories.append(_traj_from_row(r, [_step_from_row(x) for x in rows]))
                except (ValueError, TypeError, KeyError) as e:
                    raise StoreError(f"{where} is corrupt: {e}") from e
            if by_traj:
                raise StoreError(f"{self.path / shard}: steps of unknown trajectories "
                                 f"{sorted(by_traj)[:3]}")
        for t in trajectories:
            for s in t.steps:
                for sid in (s.screen_id, s.next_screen_id):
                    if sid not in screens:
                        raise StoreError(f"{self.path}: trajectory {t.traj_id!r} references "
                                         f"screen {sid!r}, which is not stored")
        return trajectories, screens

    def export_parquet(self, out_dir: str | os.PathLike[str]) -> dict[str, Path]:
        """Write ``trajectories.parquet``, ``steps.parquet``, ``screens.parquet`` (images as
        PNG bytes) for tools outside Python's HF stack. Returns the paths written."""
        ds = _datasets()
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        written = {}
        with _quiet_progress():
            for table in ("trajectories", "steps", "screens"):
                parts = [self._load_table(s, table) for s in self.manifest["shards"]]
                if parts:
                    dset = ds.concatenate_datasets(parts)
                else:
                    dset = ds.Dataset.from_dict(
                        {k: [] for k in _features(self.feature_dim)[table]},
                        features=_features(self.feature_dim)[table])
                path = out / f"{table}.parquet"
                dset.to_parquet(str(path))
                written[table] = path
        return written


class _ImageLoader:
    """Decodes one stored screenshot when asked (keeps a whole store's images off the heap)."""

    def __init__(self, dset: Any, row: int) -> None:
        self._dset, self._row = dset, row

    def __call__(self):
        return self._dset[self._row]["image"]


def save_trajectories(
    path: str | os.PathLike[str], trajectories: Iterable[Trajectory], screens: ScreenTable,
) -> TrajectoryStore:
    """Create a store at ``path`` (or open the one there) and append ``trajectories``."""
    store = TrajectoryStore.create(path, screens.feature_dim, exist_ok=True)
    store.append(list(trajectories), screens)
    return store


def load_trajectories(
    path: str | os.PathLike[str], with_images: bool = True,
) -> tuple[list[Trajectory], ScreenTable]:
    """Open the store at ``path`` and read it whole."""
    return TrajectoryStore.open(path).load(with_images=with_images)
