"""Records, the screen table, the on-disk trajectory store and the replay buffer.

Store tests write real HF ``datasets`` shards under ``tmp_path``; nothing of ours is mocked.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from digirl_lite.actions import Action, ActionType, format_action
from digirl_lite.data import (
    SCHEMA_VERSION,
    Ending,
    ReplayBuffer,
    ScreenTable,
    Source,
    Step,
    StoreError,
    Trajectory,
    TrajectoryStore,
    Verdict,
    load_trajectories,
    save_trajectories,
    screen_id_of_features,
    screen_id_of_image,
    split_of,
)
from digirl_lite.data.store import MANIFEST
from digirl_lite.data.synthetic import random_pile
from digirl_lite.prompts import build_prompt

TAP = format_action(Action.tap(x=0.5, y=0.62))
STOP = format_action(Action.key(ActionType.STATUS_TASK_COMPLETE))
TASK = "Go to walmart.com"


def make_step(
    screen_id: str = "s0", next_screen_id: str = "s1", reward: float = 0.0,
    done: bool = False, verdict: Verdict | str | None = None, text: str = TAP,
) -> Step:
    return Step.from_text(task=TASK, prompt=build_prompt(TASK), action_text=text,
                          reward=reward, done=done, screen_id=screen_id,
                          next_screen_id=next_screen_id, verdict=verdict)


def make_traj(
    traj_id: str, n_steps: int = 1, ending: Ending = Ending.AGENT_STOP,
    unjudged: bool = False,
) -> Trajectory:
    success = ending is Ending.SUCCESS
    steps = [
        make_step(f"{traj_id}/s{i}", f"{traj_id}/s{i + 1}",
                  reward=1.0 if (success and i == n_steps - 1) else 0.0,
                  done=i == n_steps - 1,
                  verdict=Verdict.UNJUDGED if (unjudged and i == 0) else Verdict.FAILURE)
        for i in range(n_steps)
    ]
    return Trajectory(traj_id=traj_id, task=TASK, steps=tuple(steps),
                      final_reward=1.0 if success else 0.0, ending=ending,
                      truncation_reason="emulator crashed" if ending is Ending.INFRA else None)


def referenced_screens(trajectories) -> set[str]:
    return {sid for t in trajectories for s in t.steps for sid in (s.screen_id, s.next_screen_id)}


def shard_screen_ids(shard_dir: Path) -> list[str]:
    import datasets

    return datasets.load_from_disk(str(shard_dir / "screens"))["screen_id"]


def tree_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


# ========================================================================================
# Step / Trajectory
# ========================================================================================
class TestStep:
    def test_verdict_string_is_coerced_to_enum(self):
        s = make_step(verdict="unjudged")
        assert s.verdict is Verdict.UNJUDGED

    def test_unknown_verdict_is_rejected(self):
        with pytest.raises(ValueError):
            make_step(verdict="maybe")

    @pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
    def test_non_finite_reward_is_rejected(self, bad):
        with pytest.raises(ValueError, match="finite"):
            make_step(reward=bad)

    def test_from_text_parses_and_keeps_malformed_text(self):
        good = make_step(text=TAP)
        assert good.action == Action.tap(x=0.5, y=0.62)
        bad = make_step(text="I think I should tap the button")
        assert bad.action.action_type is ActionType.INVALID
        assert bad.action.invalid_reason
        assert bad.action_text == "I think I should tap the button"

    def test_timings_are_copied(self):
        t = {"policy_s": 0.1}
        s = Step.from_text(task=TASK, prompt="p", action_text=TAP, reward=0.0, done=False,
                           screen_id="a", next_screen_id="b", timings=t)
        t["policy_s"] = 99.0
        assert s.timings == {"policy_s": 0.1}


class TestTrajectoryValidation:
    def test_valid_endings_construct(self):
        assert make_traj("ok", 3, Ending.SUCCESS).is_success
        assert not make_traj("stop", 2, Ending.AGENT_STOP).is_success
        assert make_traj("infra", 1, Ending.INFRA).is_infra_truncated

    def test_success_needs_positive_reward(self):
        steps = (make_step(),)
        with pytest.raises(ValueError, match="success"):
            Trajectory("t", TASK, steps, final_reward=0.0, ending=Ending.SUCCESS)

    @pytest.mark.parametrize("ending", [Ending.AGENT_STOP, Ending.BUDGET])
    def test_positive_reward_needs_success(self, ending):
        with pytest.raises(ValueError, match="final_reward"):
            Trajectory("t", TASK, (make_step(),), final_reward=1.0, ending=ending)

    def test_infra_with_positive_reward_is_rejected(self):
        with pytest.raises(ValueError):
            Trajectory("t", TASK, (make_step(),), final_reward=1.0, ending=Ending.INFRA,
                       truncation_reason="crash")

    def test_infra_needs_truncation_reason(self):
        with pytest.raises(ValueError, match="truncation_reason"):
            Trajectory("t", TASK, (make_step(),), final_reward=0.0, ending=Ending.INFRA)

    def test_truncation_reason_only_for_infra(self):
        with pytest.raises(ValueError, match="truncation_reason"):
            Trajectory("t", TASK, (make_step(),), final_reward=0.0, ending=Ending.BUDGET,
                       truncation_reason="crash")

    def test_only_infra_may_have_no_steps(self):
        t = Trajectory("t", TASK, (), final_reward=0.0, ending=Ending.INFRA,
                       truncation_reason="no device")
        assert len(t) == 0 and t.state_frames() == ([], [])
        for ending in (Ending.AGENT_STOP, Ending.BUDGET):
            with pytest.raises(ValueError, match="no steps"):
                Trajectory("t", TASK, (), final_reward=0.0, ending=ending)
        with pytest.raises(ValueError):
            Trajectory("t", TASK, (), final_reward=1.0, ending=Ending.SUCCESS)

    def test_empty_id_and_bad_horizon_are_rejected(self):
        with pytest.raises(ValueError, match="traj_id"):
            Trajectory("", TASK, (make_step(),), final_reward=0.0, ending=Ending.AGENT_STOP)
        with pytest.raises(ValueError, match="horizon"):
            Trajectory("t", TASK, (make_step(),), final_reward=0.0, ending=Ending.AGENT_STOP,
                       horizon=0)

    def test_string_enums_are_coerced(self):
        t = Trajectory("t", TASK, [make_step()], final_reward=0.0, ending="budget",
                       source="offline", seeds={"env": np.int64(3)})
        assert t.ending is Ending.BUDGET and t.source is Source.OFFLINE
        assert isinstance(t.steps, tuple)
        assert t.seeds == {"env": 3} and type(t.seeds["env"]) is int
        with pytest.raises(ValueError):
            Trajectory("t", TASK, [make_step()], final_reward=0.0, ending="crashed")


class TestTrajectoryViews:
    def test_with_mc_returns_four_step_success(self):
        t = make_traj("t", 4, Ending.SUCCESS)
        g = t.with_mc_returns()
        assert [s.mc_return for s in g.steps] == [0.125, 0.25, 0.5, 1.0]
        # a copy: the original is untouched, everything else is the same
        assert [s.mc_return for s in t.steps] == [0.0] * 4
        assert [s.action_text for s in g.steps] == [s.action_text for s in t.steps]
        assert g.traj_id == t.traj_id and g.ending is t.ending

    def test_with_mc_returns_failure_is_zero_and_gamma_is_used(self):
        assert [s.mc_return for s in make_traj("f", 3).with_mc_returns().steps] == [0.0] * 3
        g = make_traj("t", 3, Ending.SUCCESS).with_mc_returns(gamma=1.0)
        assert [s.mc_return for s in g.steps] == [1.0, 1.0, 1.0]

    def test_state_frames_repeat_first_frame(self):
        steps = (make_step("a", "b"), make_step("b", "c"), make_step("c", "d", done=True))
        t = Trajectory("t", TASK, steps, final_reward=0.0, ending=Ending.AGENT_STOP)
        prev, cur = t.state_frames()
        assert cur == ["a", "b", "c", "d"]
        assert prev == ["a", "a", "b", "c"]
        assert len(prev) == len(cur) == len(t) + 1

    def test_is_usable(self):
        assert make_traj("ok", 3).is_usable
        assert make_traj("win", 3, Ending.SUCCESS).is_usable
        assert not make_traj("infra", 3, Ending.INFRA).is_usable
        unj = make_traj("unj", 3, unjudged=True)
        assert unj.num_unjudged == 1 and not unj.is_usable
        # verdict None (no judge ran) is not unjudged
        none = Trajectory("n", TASK, (make_step(verdict=None),), 0.0, Ending.AGENT_STOP)
        assert none.is_usable


# ========================================================================================
# ScreenTable
# ========================================================================================
def _img(seed: int, size=(7, 5)) -> Image.Image:
    arr = np.random.default_rng(seed).integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(arr)


class TestScreenTable:
    def test_identical_images_dedup(self):
        table = ScreenTable(4)
        a1, a2 = _img(0), _img(0)  # two objects, same pixels
        assert a1 is not a2
        i1 = table.add(a1, np.ones(4))
        i2 = table.add(a2, np.ones(4))
        assert i1 == i2 == screen_id_of_image(a1)
        assert len(table) == 1 and table.ids == [i1]
        i3 = table.add(_img(1), np.zeros(4))
        assert i3 != i1 and len(table) == 2

    def test_same_pixels_other_size_or_mode_differ(self):
        arr = np.zeros((2, 6, 3), dtype=np.uint8)
        a = Image.fromarray(arr)
        b = Image.fromarray(arr.reshape(3, 4, 3))
        c = a.convert("RGBA")
        assert len({screen_id_of_image(a), screen_id_of_image(b), screen_id_of_image(c)}) == 3

    def test_repeat_fills_in_missing_features(self):
        table = ScreenTable(3)
        sid = table.add(_img(0))
        assert not table.has_features(sid)
        assert np.isnan(table.matrix()).all()  # cache built while features are missing
        table.add(_img(0), np.array([1.0, 2.0, 3.0]))
        assert table.has_features(sid) and len(table) == 1
        np.testing.assert_array_equal(table.features([sid]), [[1.0, 2.0, 3.0]])
        # a later repeat does not overwrite
        table.add(_img(0), np.array([9.0, 9.0, 9.0]))
        np.testing.assert_array_equal(table.features([sid]), [[1.0, 2.0, 3.0]])

    def test_features_only_screens_use_feature_hash(self):
        table = ScreenTable()
        f = np.arange(5, dtype=np.float32)
        sid = table.add(features=f)
        assert sid == screen_id_of_features(f) and table.feature_dim == 5
        assert table.add(features=f.copy()) == sid and len(table) == 1
        with pytest.raises(ValueError, match="needs an image, features"):
            table.add()

    def test_feature_dim_mismatch(self):
        table = ScreenTable(4)
        with pytest.raises(ValueError, match="5 floats.*4"):
            table.add(features=np.zeros(5))
        assert len(table) == 0
        inferred = ScreenTable()
        inferred.add(features=np.zeros(3))
        with pytest.raises(ValueError):
            inferred.add(features=np.zeros(4))

    def test_stack_builds_two_frames_by_index(self):
        d = 4
        rng = np.random.default_rng(0)
        feats = {k: rng.standard_normal(d).astype(np.float32) for k in "abc"}
        table = ScreenTable(d)
        ids = {k: table.add(features=v, screen_id=k) for k, v in feats.items()}
        prev = [ids["a"], ids["a"], ids["b"], ids["c"]]
        cur = [ids["a"], ids["b"], ids["c"], ids["a"]]
        out = table.stack(prev, cur)
        assert out.shape == (4, 2 * d) and out.dtype == np.float32
        for row, (p, c) in enumerate(zip("aabc", "abca")):
            np.testing.assert_array_equal(out[row, :d], feats[p])
            np.testing.assert_array_equal(out[row, d:], feats[c])
        with pytest.raises(ValueError):
            table.stack(prev, cur[:2])

    def test_features_errors_without_features_and_unknown_ids(self):
        table = ScreenTable(2)
        with_f = table.add(features=np.ones(2))
        without = table.add(_img(3))
        np.testing.assert_array_equal(table.features([with_f]), [[1.0, 1.0]])
        with pytest.raises(ValueError, match="no features"):
            table.features([with_f, without])
        with pytest.raises(ValueError, match="no features"):
            table.stack([with_f], [without])
        with pytest.raises(KeyError, match="nope"):
            table.features(["nope"])

    def test_merge(self):
        left = ScreenTable(2)
        a = left.add(_img(0), np.array([1.0, 1.0]), source_path="/a.png")
        b = left.add(_img(1))  # no features yet
        left.matrix()  # cached before the merge
        right = ScreenTable(2)
        right.add(_img(1), np.array([2.0, 2.0]), source_path="/b.png")
        c = right.add(features=np.array([3.0, 3.0]))
        left.merge(right)
        assert left.ids == [a, b, c]
        np.testing.assert_array_equal(left.features([a, b, c]), [[1, 1], [2, 2], [3, 3]])
        assert left.source_path(a) == "/a.png" and left.source_path(b) == "/b.png"
        assert np.asarray(left.image(b)).tolist() == np.asarray(_img(1)).tolist()
        assert len(right) == 2  # right is not changed
        with pytest.raises(ValueError):
            left.merge(_table_with(features=np.zeros(3)))

    def test_image_loader_is_called_on_demand(self):
        calls = []

        def loader():
            calls.append(1)
            return _img(5)

        table = ScreenTable()
        sid = table.add(loader, screen_id="lazy")
        assert sid == "lazy" and calls == []
        assert np.array_equal(np.asarray(table.image(sid)), np.asarray(_img(5)))
        assert calls == [1]


def _table_with(**kwargs) -> ScreenTable:
    t = ScreenTable()
    t.add(**kwargs)
    return t


# ========================================================================================
# TrajectoryStore
# ========================================================================================
@pytest.fixture(scope="module")
def pile():
    trajs, screens = random_pile(20, seed=0, horizon=6, feature_dim=8, n_screens=12,
                                 infra_rate=0.15, invalid_rate=0.2, unjudged_rate=0.1)
    # the pile exercises what the store must keep
    assert any(t.is_infra_truncated for t in trajs)
    assert any(t.num_unjudged for t in trajs)
    assert any(s.action.action_type is ActionType.INVALID for t in trajs for s in t.steps)
    return trajs, screens


@pytest.fixture(scope="module")
def saved_store(pile, tmp_path_factory):
    """A one-shard store of ``pile`` (copy it before changing it)."""
    trajs, screens = pile
    path = tmp_path_factory.mktemp("stores") / "store"
    save_trajectories(path, trajs, screens)
    return path


def _copy_store(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "store"
    shutil.copytree(src, dst)
    return dst


def test_screen_table_offload_swaps_images_for_loaders():
    t = ScreenTable()
    a, b = _img(1), _img(2)
    ida, idb = t.add(a), t.add(b)
    t.add(lambda: _img(3), screen_id="lazy")
    assert t.in_memory() == 2
    n = t.offload({ida: lambda: a.copy(), "lazy": lambda: None, "unknown": lambda: b})
    assert n == 1 and t.in_memory() == 1  # only decoded images are replaced
    assert t.image(ida) is not a and screen_id_of_image(t.image(ida)) == ida
    assert t.image(idb) is b
    assert screen_id_of_image(t.image("lazy")) == screen_id_of_image(_img(3))


@pytest.mark.slow
def test_append_leaves_written_screens_as_loaders_from_the_store(tmp_path):
    """A run appends every iteration: what the store holds must not stay decoded too."""
    trajs, screens = random_pile(8, seed=3, horizon=4, feature_dim=8, n_screens=10)
    pixels = {sid: np.asarray(screens.image(sid)).copy() for sid in screens.ids}
    used = referenced_screens(trajs)
    assert screens.in_memory() == len(screens) > len(used)
    save_trajectories(tmp_path / "a", trajs[:4], screens)
    first = referenced_screens(trajs[:4])
    assert screens.in_memory() == len(screens) - len(first)
    save_trajectories(tmp_path / "a", trajs[4:], screens)
    assert screens.in_memory() == len(screens) - len(used)  # unreferenced ones stay
    for sid in screens.ids:
        np.testing.assert_array_equal(np.asarray(screens.image(sid)), pixels[sid])
    # an offloaded table writes the same pictures into another store
    save_trajectories(tmp_path / "b", trajs, screens)
    _, loaded = load_trajectories(tmp_path / "b")
    for sid in used:
        np.testing.assert_array_equal(np.asarray(loaded.image(sid)), pixels[sid])
    kept, kept_screens = random_pile(4, seed=4, horizon=4, feature_dim=8, n_screens=6)
    TrajectoryStore.create(tmp_path / "c", 8).append(kept, kept_screens, offload=False)
    assert kept_screens.in_memory() == len(kept_screens)


@pytest.mark.slow
def test_append_offloads_screens_stored_before_and_seen_again(tmp_path):
    """A run drops a stored screen from its table (evicted) and later sees it again: the
    next append turns it back into a loader from the shard that holds it."""
    trajs, screens = random_pile(6, seed=3, horizon=4, feature_dim=8, n_screens=8)
    pixels = {sid: np.asarray(screens.image(sid)).copy() for sid in screens.ids}
    store = TrajectoryStore.create(tmp_path / "s", 8)
    store.append(trajs[:3], screens)
    first = referenced_screens(trajs[:3])
    seen_again = first & referenced_screens(trajs[3:])
    assert seen_again
    fresh = ScreenTable(8)  # the run's table after pruning, refilled by collection
    for sid in referenced_screens(trajs[3:]):
        fresh.add(Image.fromarray(pixels[sid]), screens.features([sid])[0], screen_id=sid)
    assert fresh.in_memory() == len(fresh)
    store.append(trajs[3:], fresh)
    assert fresh.in_memory() == 0 and not fresh.decoded(fresh.ids)
    for sid in fresh.ids:
        np.testing.assert_array_equal(np.asarray(fresh.image(sid)), pixels[sid])
    # a screen stored without its picture keeps the picture the table has
    bare = ScreenTable(8)
    bare.add(None, np.ones(8), screen_id="bare")
    t = Trajectory("b1", TASK, (make_step("bare", "bare", done=True),), 0.0, Ending.AGENT_STOP)
    store.append([t], bare)
    again = ScreenTable(8)
    again.add(_img(7), np.ones(8), screen_id="bare")
    t2 = Trajectory("b2", TASK, (make_step("bare", "bare", done=True),), 0.0, Ending.AGENT_STOP)
    store.append([t2], again)
    assert again.decoded(["bare"]) == ["bare"] and again.image("bare") is not None


def test_screen_table_remove_keeps_ids_features_and_matrix_consistent():
    t = ScreenTable(3)
    ids = [t.add(features=np.full(3, float(i)), screen_id=f"s{i}",
                 source_path=f"/p/{i}") for i in range(6)]
    t.add(_img(1), screen_id="img-only")
    before = t.matrix().copy()  # a cached matrix must be compacted along with the rows
    assert t.remove(["s1", "s4", "s1", "unknown"]) == 2
    kept = ["s0", "s2", "s3", "s5"]
    assert t.ids == kept + ["img-only"] and len(t) == 5
    assert "s1" not in t and "s4" not in t
    np.testing.assert_array_equal(t.index_of(kept + ["img-only"]), np.arange(5))
    np.testing.assert_array_equal(t.matrix()[:4], before[[0, 2, 3, 5]])
    np.testing.assert_array_equal(t.features(["s5", "s0"]), [[5.0] * 3, [0.0] * 3])
    np.testing.assert_array_equal(t.stack(["s3"], ["s2"]), [[3.0] * 3 + [2.0] * 3])
    assert t.source_path("s5") == "/p/5" and t.image("img-only") is not None
    with pytest.raises(KeyError, match="s4"):
        t.index_of(["s4"])
    assert t.remove([]) == 0 and t.remove(["s4"]) == 0
    # a removed screen can come back; the matrix follows
    t.add(features=np.full(3, 9.0), screen_id="s4")
    np.testing.assert_array_equal(t.features(["s4"]), [[9.0] * 3])
    gone = t.retain({"s0", "s4", "not-there"})
    assert sorted(gone) == ["img-only", "s2", "s3", "s5"] and t.ids == ["s0", "s4"]
    np.testing.assert_array_equal(t.matrix(), [[0.0] * 3, [9.0] * 3])
    assert ids[0] == "s0"


@pytest.mark.slow
def test_screen_table_remove_is_one_compaction_not_one_per_row():
    import time

    def timed_remove(n: int) -> float:
        t = ScreenTable(4)
        for i in range(n):
            t.add(features=np.zeros(4), screen_id=f"s{i}")
        t.matrix()
        t0 = time.process_time()  # this process's CPU time: other processes' load aside
        t.remove([f"s{i}" for i in range(0, n, 2)])  # half the table in one batch
        return time.process_time() - t0

    timed_remove(2000)  # warm
    small, big = min(timed_remove(4000) for _ in range(5)), min(
        timed_remove(40000) for _ in range(5))
    # linear is 10x, quadratic 100x; measured 10-40x alone and up to 65x on two cores
    # shared by four processes (cache effects at 40,000 rows), so the bound sits between
    assert big < 80 * small


class TestStoreRoundTrip:
    def test_trajectories_round_trip_equal(self, pile, saved_store):
        trajs, _ = pile
        loaded, _ = load_trajectories(saved_store)
        assert len(loaded) == len(trajs)
        assert [t.traj_id for t in loaded] == [t.traj_id for t in trajs]
        for a, b in zip(loaded, trajs):
            assert a == b, a.traj_id
        assert loaded == trajs

    def test_every_field_survives(self, pile, saved_store):
        trajs, _ = pile
        loaded, _ = load_trajectories(saved_store)
        for a, b in zip(loaded, trajs):
            assert (a.ending, a.source, a.iteration, a.horizon, a.seeds, a.truncation_reason,
                    a.final_reward) == (b.ending, b.source, b.iteration, b.horizon, b.seeds,
                                        b.truncation_reason, b.final_reward)
            for sa, sb in zip(a.steps, b.steps):
                assert sa.action == sb.action and sa.verdict is sb.verdict
                assert sa.timings == sb.timings and sa.mc_return == sb.mc_return
                assert sa.done is sb.done

    def test_images_and_features_round_trip(self, pile, saved_store):
        trajs, screens = pile
        _, loaded = load_trajectories(saved_store)
        used = referenced_screens(trajs)
        assert set(loaded.ids) == used  # only referenced screens are written
        assert loaded.feature_dim == screens.feature_dim == 8
        ids = sorted(used)
        np.testing.assert_array_equal(loaded.features(ids), screens.features(ids))
        assert loaded.features(ids).dtype == np.float32
        for sid in ids:
            got, want = loaded.image(sid), screens.image(sid)
            assert got.size == want.size and got.mode == want.mode
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
            assert screen_id_of_image(got) == sid

    def test_load_without_images(self, pile, saved_store):
        trajs, screens = pile
        loaded_t, loaded = load_trajectories(saved_store, with_images=False)
        assert loaded_t == trajs
        sid = trajs[0].steps[0].screen_id
        assert loaded.image(sid) is None
        np.testing.assert_array_equal(loaded.features([sid]), screens.features([sid]))

    def test_invalid_actions_keep_their_reason(self, pile, saved_store):
        trajs, _ = pile
        loaded, _ = load_trajectories(saved_store)
        pairs = [(a, b) for ta, tb in zip(loaded, trajs) for a, b in zip(ta.steps, tb.steps)
                 if b.action.action_type is ActionType.INVALID]
        assert pairs
        for a, b in pairs:
            assert a.action.action_type is ActionType.INVALID
            assert a.action.invalid_reason == b.action.invalid_reason
            assert a.action.invalid_reason  # non-empty
            assert a.action_text == b.action_text

    def test_handmade_edge_records_round_trip(self, tmp_path):
        screens = ScreenTable(3)
        a = screens.add(_img(0), np.array([1, 2, 3]))
        b = screens.add(_img(1))  # a screen without features
        weird = 'Action Decision: "action_type": "TYPE", "touch_point": "[-1.0, -1.0]", ' \
                '"lift_point": "[-1.0, -1.0]", "typed_text": "caf\u00e9 \u201cquoted\u201d"'
        steps = (
            Step.from_text(task="t\u00e2sk", prompt="p", action_text=weird, reward=0.0,
                           done=False, screen_id=a, next_screen_id=b, verdict=None,
                           judge_reply="Status: failure", timings={}),
            Step.from_text(task="t\u00e2sk", prompt="p", action_text="", reward=0.0,
                           done=True, screen_id=b, next_screen_id=b,
                           verdict=Verdict.UNJUDGED),
        )
        trajs = [
            Trajectory("x/1", "t\u00e2sk", steps, 0.0, Ending.BUDGET, Source.ONLINE,
                       iteration=7, horizon=2, seeds={"env": -3}),
            Trajectory("x/2", "", (), 0.0, Ending.INFRA, truncation_reason="adb offline"),
        ]
        save_trajectories(tmp_path / "s", trajs, screens)
        loaded, table = load_trajectories(tmp_path / "s")
        assert loaded == trajs
        assert loaded[0].steps[0].action.typed_text == "caf\u00e9 \u201cquoted\u201d"
        assert loaded[0].steps[1].action.action_type is ActionType.INVALID
        assert not table.has_features(b)
        with pytest.raises(ValueError, match="no features"):
            table.features([b])


class TestStoreAppend:
    def test_second_append_writes_new_shard_and_only_new_screens(self, tmp_path):
        trajs, screens = random_pile(30, seed=0, horizon=6, feature_dim=8, n_screens=12)
        first, second = trajs[:20], trajs[20:]
        extra, extra_screens = random_pile(5, seed=1, horizon=6, feature_dim=8, n_screens=4)
        path = tmp_path / "store"
        store = save_trajectories(path, first, screens)
        assert store.manifest["shards"] == ["shard-00000"]
        stored0 = shard_screen_ids(path / "shard-00000")
        assert len(stored0) == len(set(stored0)) == len(referenced_screens(first))
        digest0 = tree_digest(path / "shard-00000")

        both = ScreenTable(8)
        both.merge(screens)
        both.merge(extra_screens)
        name = TrajectoryStore.open(path).append(second + extra, both)
        assert name == "shard-00001"
        reopened = TrajectoryStore.open(path)
        assert reopened.manifest["shards"] == ["shard-00000", "shard-00001"]
        assert len(reopened) == 35

        written = shard_screen_ids(path / name)
        expected_new = referenced_screens(second + extra) - set(stored0)
        assert set(written) == expected_new and len(written) == len(expected_new)
        assert not set(written) & set(stored0)
        assert expected_new & referenced_screens(extra)  # the new pile's screens were written
        assert tree_digest(path / "shard-00000") == digest0  # first shard untouched

        loaded, table = load_trajectories(path)
        assert loaded == first + second + extra
        assert set(table.ids) == referenced_screens(trajs + extra)
        for sid in table.ids:
            src = screens if sid in screens else extra_screens
            np.testing.assert_array_equal(table.features([sid]), src.features([sid]))

    def test_append_only_known_screens_writes_no_screen_rows(self, tmp_path):
        trajs, screens = random_pile(12, seed=4, horizon=5, feature_dim=8, n_screens=6)
        path = tmp_path / "store"
        save_trajectories(path, trajs[:6], screens)
        stored = set(shard_screen_ids(path / "shard-00000"))
        later = [t for t in trajs[6:] if referenced_screens([t]) <= stored]
        assert later
        # an empty table suffices when every referenced screen is already stored
        store = TrajectoryStore.open(path)
        name = store.append(later, ScreenTable(8))
        assert name == "shard-00001"
        assert load_trajectories(path)[0] == trajs[:6] + later
        assert store._load_table(name, "screens").num_rows == 0
        extra, extra_screens = random_pile(1, seed=5, horizon=5, feature_dim=8, n_screens=6)
        assert TrajectoryStore.open(path).append(extra, extra_screens)  # still appendable
        assert load_trajectories(path)[0] == trajs[:6] + later + extra

    def test_append_of_stepless_infra_trajectories(self, tmp_path):
        infra = [Trajectory(f"i{k}", TASK, (), 0.0, Ending.INFRA, truncation_reason="no device")
                 for k in range(2)]
        path = tmp_path / "store"
        save_trajectories(path, infra, ScreenTable(8))
        assert load_trajectories(path)[0] == infra

    def test_stored_screens_need_not_be_in_the_table(self, pile, saved_store, tmp_path):
        trajs, _ = pile
        path = _copy_store(saved_store, tmp_path)
        old = trajs[0].steps[0].screen_id
        table = ScreenTable(8)
        new = table.add(_img(42, size=(27, 57)), np.full(8, 0.5))
        t = Trajectory("reuse", TASK, (make_step(old, new, done=True),), 0.0, Ending.AGENT_STOP)
        name = TrajectoryStore.open(path).append([t], table)  # `old` is only in the store
        assert shard_screen_ids(path / name) == [new]
        loaded, screens = load_trajectories(path)
        assert loaded == trajs + [t]
        np.testing.assert_array_equal(screens.features([new]), [np.full(8, 0.5)])

    def test_duplicate_traj_id_errors(self, pile, saved_store, tmp_path):
        trajs, screens = pile
        path = _copy_store(saved_store, tmp_path)
        store = TrajectoryStore.open(path)
        with pytest.raises(StoreError, match=trajs[3].traj_id):
            store.append([trajs[3]], screens)
        fresh = TrajectoryStore.create(tmp_path / "fresh")
        with pytest.raises(StoreError, match="already"):
            fresh.append([trajs[0], trajs[0]], screens)  # duplicate within one append
        for p in (path, tmp_path / "fresh"):
            s = TrajectoryStore.open(p)
            assert len(s.manifest["shards"]) == (1 if p == path else 0)
        assert load_trajectories(path)[0] == trajs

    def test_missing_screen_errors(self, pile, tmp_path):
        trajs, screens = pile
        ghost = make_step(trajs[0].steps[0].screen_id, "not-a-screen", done=True)
        bad = Trajectory("ghost", TASK, (ghost,), 0.0, Ending.AGENT_STOP)
        store = TrajectoryStore.create(tmp_path / "s", feature_dim=8)
        with pytest.raises(StoreError, match="not-a-screen"):
            store.append([bad], screens)
        assert TrajectoryStore.open(tmp_path / "s").manifest["shards"] == []
        assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [MANIFEST]

    def test_feature_dim_mismatch_errors(self, pile, saved_store, tmp_path):
        path = _copy_store(saved_store, tmp_path)
        other_t, other_s = random_pile(2, seed=9, feature_dim=4)
        with pytest.raises(StoreError, match="4-d"):
            TrajectoryStore.open(path).append(other_t, other_s)

    def test_refused_featured_append_leaves_featureless_store_usable(self, tmp_path):
        trajs, screens = random_pile(3, seed=0, horizon=4, feature_dim=4, n_screens=4)
        plain = ScreenTable()  # the same screens, images only
        for sid in screens.ids:
            plain.add(screens.image(sid), screen_id=sid)
        store = TrajectoryStore.create(tmp_path / "s")
        store.append(trajs[:2], plain)
        with pytest.raises(StoreError):
            store.append(trajs[2:], screens)
        assert TrajectoryStore.open(tmp_path / "s").feature_dim is None  # disk untouched
        assert store.load()[0] == trajs[:2]  # the same object still reads the store

    def test_create_refuses_existing_store_and_nonempty_folder(self, saved_store, tmp_path):
        with pytest.raises(StoreError, match="already holds"):
            TrajectoryStore.create(saved_store)
        assert TrajectoryStore.create(saved_store, exist_ok=True).manifest["shards"]
        (tmp_path / "busy").mkdir()
        (tmp_path / "busy" / "notes.txt").write_text("hi")
        with pytest.raises(StoreError, match="not empty"):
            TrajectoryStore.create(tmp_path / "busy")

    def test_empty_append_writes_nothing(self, tmp_path):
        store = TrajectoryStore.create(tmp_path / "s", feature_dim=8)
        assert store.append([], ScreenTable(8)) is None
        assert TrajectoryStore.open(tmp_path / "s").manifest["shards"] == []
        assert load_trajectories(tmp_path / "s")[0] == []


class TestStoreAtomicity:
    def test_leftover_tmp_and_unlisted_shard_are_ignored(self, pile, saved_store, tmp_path):
        trajs, screens = pile
        path = _copy_store(saved_store, tmp_path)
        # a crash after the rename but before the manifest: a full, unlisted shard
        shutil.copytree(path / "shard-00000", path / "shard-00001")
        # a crash mid-write: a half-written temporary folder
        tmp = path / ".tmp-shard-00001-abc123"
        (tmp / "steps").mkdir(parents=True)
        (tmp / "steps" / "data-00000-of-00001.arrow").write_bytes(b"half a file")
        loaded, table = load_trajectories(path)
        assert loaded == trajs  # no duplicates from the unlisted copy
        assert len(TrajectoryStore.open(path)) == len(trajs)

        new_t, new_s = random_pile(3, seed=5, horizon=4, feature_dim=8, n_screens=3)
        name = TrajectoryStore.open(path).append(new_t, new_s)
        assert name not in ("shard-00000", "shard-00001")
        assert TrajectoryStore.open(path).manifest["shards"] == ["shard-00000", name]
        assert load_trajectories(path)[0] == trajs + new_t
        assert (path / "shard-00001").is_dir()  # left alone
        assert not [p for p in path.iterdir() if p.name.startswith(".tmp-") and p != tmp]

    def test_failed_append_leaves_no_shard(self, pile, saved_store, tmp_path):
        trajs, screens = pile
        path = _copy_store(saved_store, tmp_path)
        before = sorted(p.name for p in path.iterdir())
        bad = Trajectory("bad", TASK, (make_step("zzz", "zzz", done=True),), 0.0,
                         Ending.AGENT_STOP)
        with pytest.raises(StoreError):
            TrajectoryStore.open(path).append([bad], screens)
        assert sorted(p.name for p in path.iterdir()) == before
        assert load_trajectories(path)[0] == trajs


def _forget_indexes(monkeypatch):
    """As in a fresh process: no store's ids are known yet."""
    import digirl_lite.data.store as store_mod

    monkeypatch.setattr(store_mod, "_INDEXES", store_mod.OrderedDict())


def _tables_only_of(monkeypatch, allowed: set[str]) -> list[tuple[str, str]]:
    """Make reading any other shard's table fail; return the (shard, table) reads."""
    reads: list[tuple[str, str]] = []
    real = TrajectoryStore._load_table

    def guarded(self, shard, table):
        reads.append((shard, table))
        if shard not in allowed:
            raise AssertionError(f"read {shard}/{table}")
        return real(self, shard, table)

    monkeypatch.setattr(TrajectoryStore, "_load_table", guarded)
    return reads


class TestStoreIndex:
    def _three_shards(self, tmp_path):
        path = tmp_path / "store"
        parts = [random_pile(4, seed=s, horizon=4, feature_dim=8, n_screens=5) for s in (1, 2, 3)]
        for trajs, screens in parts:
            TrajectoryStore.create(path, 8, exist_ok=True).append(trajs, screens)
        return path, parts

    @pytest.mark.slow
    @pytest.mark.parametrize("fresh_process", [False, True])
    def test_append_reads_no_earlier_shard_table(self, tmp_path, monkeypatch, fresh_process):
        path, parts = self._three_shards(tmp_path)
        if fresh_process:  # the ids come from each shard's ids.json
            _forget_indexes(monkeypatch)
        reads = _tables_only_of(monkeypatch, allowed={"shard-00003"})
        trajs, screens = random_pile(4, seed=4, horizon=4, feature_dim=8, n_screens=5)
        store = TrajectoryStore.open(path)  # reopened for each append, as the Trainer does
        assert store.append(trajs, screens) == "shard-00003"
        assert reads == [("shard-00003", "screens")]  # only the new shard (offload)
        with pytest.raises(StoreError, match="already"):  # known without reading tables
            TrajectoryStore.open(path).append(parts[0][0][:1], parts[0][1])
        monkeypatch.undo()
        everything = [t for p in parts for t in p[0]] + trajs
        assert load_trajectories(path)[0] == everything
        # the screens already stored were not written again
        written = set(shard_screen_ids(path / "shard-00003"))
        assert written == referenced_screens(trajs) - referenced_screens(everything[:12])

    @pytest.mark.slow
    def test_traj_ids_exact_after_reopen_and_across_objects(self, tmp_path, monkeypatch):
        path, parts = self._three_shards(tmp_path)
        want = {t.traj_id for p in parts for t in p[0]}
        a, b = TrajectoryStore.open(path), TrajectoryStore.open(path)
        assert a.traj_ids() == b.traj_ids() == want
        new, new_s = random_pile(2, seed=9, horizon=3, feature_dim=8, n_screens=3)
        a.append(new, new_s)
        want |= {t.traj_id for t in new}
        assert b.traj_ids() == want and new[0].traj_id in b  # b sees a's append
        more, more_s = random_pile(2, seed=10, horizon=3, feature_dim=8, n_screens=3)
        b.append(more, more_s)  # b appends after a: a's shard stays listed
        want |= {t.traj_id for t in more}
        assert TrajectoryStore.open(path).manifest["shards"] == [
            f"shard-{i:05d}" for i in range(5)]
        _forget_indexes(monkeypatch)
        assert TrajectoryStore.open(path).traj_ids() == want == {
            t.traj_id for t in load_trajectories(path)[0]}
        assert a.stored_screen_ids() == set(load_trajectories(path)[1].ids)
        assert "nope" not in a and len(a) == len(want)

    @pytest.mark.slow
    @pytest.mark.parametrize("crash", ["before_rename", "before_manifest"])
    def test_traj_ids_exact_after_a_crashed_append(self, tmp_path, monkeypatch, crash):
        path, parts = self._three_shards(tmp_path)
        want = {t.traj_id for p in parts for t in p[0]}
        new, new_s = random_pile(3, seed=7, horizon=3, feature_dim=8, n_screens=3)
        store = TrajectoryStore.open(path)

        def die(*a, **k):
            raise KeyboardInterrupt("killed")

        if crash == "before_rename":
            monkeypatch.setattr("digirl_lite.data.store.os.rename", die)
        else:  # the shard is in place, the manifest does not list it yet
            monkeypatch.setattr(TrajectoryStore, "_write_manifest", die)
        with pytest.raises(KeyboardInterrupt):
            store.append(new, new_s)
        monkeypatch.undo()
        if crash == "before_manifest":
            assert (path / "shard-00003" / "ids.json").is_file()  # written, unlisted
        for s in (store, TrajectoryStore.open(path)):
            assert s.traj_ids() == want and new[0].traj_id not in s
        _forget_indexes(monkeypatch)
        assert TrajectoryStore.open(path).traj_ids() == want
        name = store.append(new, new_s)  # resume: the same trajectories, stored once
        assert name == ("shard-00003" if crash == "before_rename" else "shard-00004")
        assert TrajectoryStore.open(path).traj_ids() == want | {t.traj_id for t in new}
        assert load_trajectories(path)[0] == [t for p in parts for t in p[0]] + new

    @pytest.mark.slow
    def test_stores_without_ids_files_are_read_from_their_tables(self, tmp_path, monkeypatch):
        path, parts = self._three_shards(tmp_path)
        # as written before ids.json: no index files, no store or shard ids
        for shard in ("shard-00000", "shard-00001"):
            (path / shard / "ids.json").unlink()
        (path / "shard-00002" / "ids.json").write_text('{"traj_ids": ["x"], "screen_ids": []}')
        m = json.loads((path / MANIFEST).read_text())
        del m["store_id"], m["shard_uids"]
        (path / MANIFEST).write_text(json.dumps(m))
        _forget_indexes(monkeypatch)
        want = {t.traj_id for p in parts for t in p[0]}
        store = TrajectoryStore.open(path)
        assert store.traj_ids() == want  # the wrong ids.json is not believed
        assert store.stored_screen_ids() == set(load_trajectories(path)[1].ids)
        new, new_s = random_pile(2, seed=8, horizon=3, feature_dim=8, n_screens=3)
        store.append(new, new_s)
        assert json.loads((path / MANIFEST).read_text())["store_id"]  # given one now
        _tables_only_of(monkeypatch, allowed=set())
        assert TrajectoryStore.open(path).traj_ids() == want | {t.traj_id for t in new}

    def test_a_store_recreated_at_the_same_path_is_not_confused(self, tmp_path):
        trajs, screens = random_pile(4, seed=1, horizon=3, feature_dim=8, n_screens=4)
        path = tmp_path / "eval"
        TrajectoryStore.create(path, 8).append(trajs[:2], screens)
        assert TrajectoryStore.open(path).traj_ids() == {t.traj_id for t in trajs[:2]}
        shutil.rmtree(path)  # an evaluation redone after a crash
        TrajectoryStore.create(path, 8).append(trajs[2:], screens)
        assert TrajectoryStore.open(path).traj_ids() == {t.traj_id for t in trajs[2:]}


class TestStoreErrors:
    def test_folder_without_manifest(self, tmp_path):
        (tmp_path / "empty").mkdir()
        with pytest.raises(StoreError, match="not a digirl_lite trajectory store") as e:
            TrajectoryStore.open(tmp_path / "empty")
        assert str(tmp_path / "empty") in str(e.value)
        with pytest.raises(StoreError):
            load_trajectories(tmp_path / "does-not-exist")

    def test_wrong_schema_version(self, saved_store, tmp_path):
        path = _copy_store(saved_store, tmp_path)
        m = json.loads((path / MANIFEST).read_text())
        m["schema_version"] = SCHEMA_VERSION + 1
        (path / MANIFEST).write_text(json.dumps(m))
        with pytest.raises(StoreError, match="schema version") as e:
            load_trajectories(path)
        assert str(path) in str(e.value)
        assert str(SCHEMA_VERSION + 1) in str(e.value)

    def test_corrupt_json_manifest(self, saved_store, tmp_path):
        path = _copy_store(saved_store, tmp_path)
        (path / MANIFEST).write_text('{"format": "digirl_lite.trajectory_store", "shards": [')
        with pytest.raises(StoreError, match="corrupt") as e:
            TrajectoryStore.open(path)
        assert str(path / MANIFEST) in str(e.value)

    def test_manifest_of_another_format(self, tmp_path):
        (tmp_path / "s").mkdir()
        (tmp_path / "s" / MANIFEST).write_text(json.dumps([1, 2, 3]))
        with pytest.raises(StoreError, match="not a digirl_lite store manifest"):
            TrajectoryStore.open(tmp_path / "s")
        (tmp_path / "s" / MANIFEST).write_text(json.dumps(
            {"format": "digirl_lite.trajectory_store", "schema_version": SCHEMA_VERSION}))
        with pytest.raises(StoreError, match="shard list"):
            TrajectoryStore.open(tmp_path / "s")

    def test_deleted_steps_table(self, saved_store, tmp_path):
        path = _copy_store(saved_store, tmp_path)
        shutil.rmtree(path / "shard-00000" / "steps")
        with pytest.raises(StoreError) as e:
            load_trajectories(path)
        assert str(path / "shard-00000" / "steps") in str(e.value)

    def test_steps_table_replaced_by_garbage_file(self, saved_store, tmp_path):
        path = _copy_store(saved_store, tmp_path)
        shutil.rmtree(path / "shard-00000" / "steps")
        (path / "shard-00000" / "steps").write_bytes(b"\x00garbage" * 100)
        with pytest.raises(StoreError) as e:
            load_trajectories(path)
        assert str(path / "shard-00000" / "steps") in str(e.value)

    def test_steps_table_files_overwritten_with_garbage(self, saved_store, tmp_path):
        path = _copy_store(saved_store, tmp_path)
        files = [p for p in (path / "shard-00000" / "steps").iterdir() if p.is_file()]
        assert any(p.suffix == ".arrow" for p in files)
        for p in files:
            p.write_bytes(b"not arrow, not json " * 50)
        with pytest.raises(StoreError) as e:
            load_trajectories(path)
        assert str(path / "shard-00000" / "steps") in str(e.value)

    def test_arrow_data_overwritten_with_garbage(self, saved_store, tmp_path):
        path = _copy_store(saved_store, tmp_path)
        arrows = list((path / "shard-00000" / "steps").glob("*.arrow"))
        assert arrows
        for p in arrows:
            p.write_bytes(b"\xff" * 4096)
        with pytest.raises(StoreError) as e:
            load_trajectories(path)
        assert str(path / "shard-00000" / "steps") in str(e.value)

    def test_steps_table_of_another_shard(self, saved_store, tmp_path):
        path = _copy_store(saved_store, tmp_path)
        new_t, new_s = random_pile(2, seed=6, horizon=3, feature_dim=8, n_screens=2)
        TrajectoryStore.open(path).append(new_t, new_s)
        shutil.rmtree(path / "shard-00000" / "steps")
        shutil.copytree(path / "shard-00001" / "steps", path / "shard-00000" / "steps")
        with pytest.raises(StoreError) as e:
            load_trajectories(path)
        assert str(path / "shard-00000") in str(e.value)

    def test_missing_listed_shard(self, saved_store, tmp_path):
        path = _copy_store(saved_store, tmp_path)
        shutil.rmtree(path / "shard-00000")
        with pytest.raises(StoreError) as e:
            load_trajectories(path)
        assert str(path / "shard-00000") in str(e.value)


class TestExportParquet:
    def test_three_files_with_matching_row_counts(self, tmp_path):
        import pyarrow.parquet as pq

        trajs, screens = random_pile(12, seed=2, horizon=5, feature_dim=8, n_screens=8)
        more, more_s = random_pile(4, seed=3, horizon=5, feature_dim=8, n_screens=3)
        path = tmp_path / "store"
        save_trajectories(path, trajs, screens)
        save_trajectories(path, more, more_s)  # two shards
        written = TrajectoryStore.open(path).export_parquet(tmp_path / "pq")
        assert set(written) == {"trajectories", "steps", "screens"}
        for p in written.values():
            assert p.is_file() and p.suffix == ".parquet"
        all_t = trajs + more
        t_tab = pq.read_table(written["trajectories"])
        s_tab = pq.read_table(written["steps"])
        sc_tab = pq.read_table(written["screens"])
        assert t_tab.num_rows == len(all_t)
        assert s_tab.num_rows == sum(len(t) for t in all_t)
        assert sc_tab.num_rows == len(referenced_screens(all_t))
        assert t_tab.column("traj_id").to_pylist() == [t.traj_id for t in all_t]
        assert sorted(sc_tab.column("screen_id").to_pylist()) == sorted(
            referenced_screens(all_t))
        assert {"features", "image"} <= set(sc_tab.column_names)
        counts = Counter(s_tab.column("traj_id").to_pylist())
        assert all(counts[t.traj_id] == len(t) for t in all_t)

    def test_empty_store_exports_empty_tables(self, tmp_path):
        import pyarrow.parquet as pq

        TrajectoryStore.create(tmp_path / "s", feature_dim=4)
        written = TrajectoryStore.open(tmp_path / "s").export_parquet(tmp_path / "pq")
        assert [pq.read_table(written[k]).num_rows for k in ("trajectories", "steps",
                                                              "screens")] == [0, 0, 0]


# ========================================================================================
# ReplayBuffer
# ========================================================================================
def _ids(trajs) -> list[str]:
    return [t.traj_id for t in trajs]


class TestReplayBuffer:
    def test_capacity_evicts_oldest_first(self):
        buf = ReplayBuffer(capacity=3)
        a, b, c, d, e = (make_traj(x) for x in "abcde")
        assert buf.add([a, b]) == []
        evicted = buf.add([c, d, e])
        assert _ids(evicted) == ["a", "b"]
        assert _ids(buf) == ["c", "d", "e"] and len(buf) == 3
        # an evicted id may come back; it is now the newest
        assert _ids(buf.add([a])) == ["c"]
        assert _ids(buf) == ["d", "e", "a"]

    def test_bad_settings(self):
        with pytest.raises(ValueError):
            ReplayBuffer(capacity=0)
        with pytest.raises(ValueError):
            ReplayBuffer(val_fraction=1.0)
        with pytest.raises(ValueError):
            ReplayBuffer().trajectories("test")

    def test_screen_ids_follow_adds_and_evictions(self):
        def traj(tid: str, screens: list[str]) -> Trajectory:
            steps = [make_step(a, b, done=i == len(screens) - 2)
                     for i, (a, b) in enumerate(zip(screens, screens[1:]))]
            return Trajectory(tid, TASK, tuple(steps), 0.0, Ending.AGENT_STOP)

        buf = ReplayBuffer(capacity=2)
        a = traj("a", ["home", "a1", "home"])  # a screen used twice by one trajectory
        b = traj("b", ["home", "b1"])
        c = traj("c", ["c1", "c2"])
        infra = Trajectory("i", TASK, (), 0.0, Ending.INFRA, truncation_reason="no device")
        buf.add([a, b])
        assert set(buf.screen_ids()) == {"home", "a1", "b1"}
        assert buf.add([c]) == [a]
        assert set(buf.screen_ids()) == {"home", "b1", "c1", "c2"}  # b still uses home
        assert buf.add([infra]) == [b]
        assert set(buf.screen_ids()) == {"c1", "c2"}
        again = ReplayBuffer.from_state_dict(buf.state_dict(), [a, b, c, infra])
        assert set(again.screen_ids()) == {"c1", "c2"}

    def test_duplicate_id_errors(self):
        buf = ReplayBuffer(capacity=10)
        buf.add([make_traj("a"), make_traj("b")])
        with pytest.raises(ValueError, match="'a'"):
            buf.add([make_traj("a", n_steps=2)])
        assert _ids(buf) == ["a", "b"] and len(buf.trajectories("all")[0]) == 1

    def test_split_is_a_pure_function_of_seed_and_id(self):
        trajs = [make_traj(f"t{i}") for i in range(300)]
        others = [make_traj(f"other{i}") for i in range(100)]
        one = ReplayBuffer(capacity=1000, seed=3)
        one.add(trajs)
        two = ReplayBuffer(capacity=1000, seed=3)
        two.add(others[:50] + trajs[::-1] + others[50:])
        three = ReplayBuffer.from_state_dict(one.state_dict(), trajs[::-1])
        small = ReplayBuffer(capacity=50, seed=3)  # most of them evicted along the way
        small.add(others + trajs)
        for t in trajs:
            s = split_of(t.traj_id, seed=3)
            assert one.split(t) == two.split(t) == three.split(t) == s
        assert set(_ids(one.trajectories("val"))) == (
            set(_ids(two.trajectories("val"))) - {t.traj_id for t in others})
        assert set(_ids(small.trajectories("val"))) == {
            t.traj_id for t in trajs[-50:] if split_of(t.traj_id, seed=3) == "val"}
        # train and val partition the (usable) buffer
        tr, va = set(_ids(one.trajectories("train"))), set(_ids(one.trajectories("val")))
        assert not tr & va and tr | va == set(_ids(trajs))

    def test_val_fraction_about_twenty_percent(self):
        ids = [f"traj-{i}" for i in range(2000)]
        frac = np.mean([split_of(i) == "val" for i in ids])
        assert 0.17 <= frac <= 0.23
        frac_half = np.mean([split_of(i, val_fraction=0.5) == "val" for i in ids])
        assert 0.45 <= frac_half <= 0.55
        assert all(split_of(i, val_fraction=0.0) == "train" for i in ids)

    def test_other_seed_changes_assignment(self):
        ids = [f"traj-{i}" for i in range(2000)]
        s0 = [split_of(i, seed=0) for i in ids]
        s1 = [split_of(i, seed=1) for i in ids]
        assert s0 != s1
        changed = sum(a != b for a, b in zip(s0, s1))
        assert changed > 200  # independent draws: ~2 * 0.2 * 0.8 * 2000 = 640
        assert 0.17 <= s1.count("val") / 2000 <= 0.23
        buf0, buf1 = ReplayBuffer(seed=0), ReplayBuffer(seed=1)
        t = [make_traj(i) for i in ids[:200]]
        buf0.add(t)
        buf1.add(t)
        assert [buf0.split(x) for x in t] != [buf1.split(x) for x in t]

    def test_usable_only_excludes_infra_and_unjudged(self):
        ok = make_traj("ok", 2)
        win = make_traj("win", 2, Ending.SUCCESS)
        infra = make_traj("infra", 2, Ending.INFRA)
        unj = make_traj("unj", 2, unjudged=True)
        buf = ReplayBuffer(capacity=10)
        buf.add([ok, infra, unj, win])
        assert _ids(buf.trajectories("all")) == ["ok", "win"]
        assert _ids(buf.trajectories("all", usable_only=False)) == ["ok", "infra", "unj", "win"]
        drawn = {r.trajectory.traj_id for r in buf.sample_steps(500, split="all")}
        assert drawn == {"ok", "win"}
        drawn_t = {t.traj_id for t in buf.sample_trajectories(100, "all", replace=True)}
        assert drawn_t == {"ok", "win"}
        c = buf.counts()
        assert (c["total"], c["success"], c["infra_truncated"], c["with_unjudged"]) == (4, 1, 1, 1)
        assert c["train"] + c["val"] == 4

    def test_sample_steps_valid_and_uniform_over_steps(self):
        short, long = make_traj("short", 1), make_traj("long", 3)
        buf = ReplayBuffer(capacity=10, seed=0)
        buf.add([short, long])
        refs = buf.sample_steps(8000, split="all")
        assert len(refs) == 8000
        for r in refs:
            assert r.trajectory in (short, long)
            assert 0 <= r.index < len(r.trajectory.steps)
        freq = Counter((r.trajectory.traj_id, r.index) for r in refs)
        assert set(freq) == {("short", 0), ("long", 0), ("long", 1), ("long", 2)}
        for key, n in freq.items():
            assert abs(n / 8000 - 0.25) < 0.03, (key, n)

    def test_sample_steps_respects_split_and_empty_pool(self):
        buf = ReplayBuffer(capacity=100, seed=0)
        trajs = [make_traj(f"t{i}", 2) for i in range(40)]
        buf.add(trajs)
        for split in ("train", "val"):
            want = {t.traj_id for t in trajs if buf.split(t) == split}
            assert want
            got = {r.trajectory.traj_id for r in buf.sample_steps(400, split=split)}
            assert got <= want
        assert ReplayBuffer().sample_steps(5) == []
        assert ReplayBuffer().sample_trajectories(5) == []

    def test_sample_trajectories_without_replacement(self):
        buf = ReplayBuffer(capacity=100, seed=0)
        buf.add([make_traj(f"t{i}") for i in range(30)])
        pool = _ids(buf.trajectories("all"))
        got = _ids(buf.sample_trajectories(10, split="all"))
        assert len(got) == len(set(got)) == 10 and set(got) <= set(pool)
        assert sorted(_ids(buf.sample_trajectories(1000, split="all"))) == sorted(pool)

    def test_state_dict_round_trip_continues_sampling(self):
        trajs = [make_traj(f"t{i}", 1 + i % 4) for i in range(60)]
        buf = ReplayBuffer(capacity=50, val_fraction=0.25, seed=7)
        buf.add(trajs)
        buf.sample_steps(33)  # advance the generator
        state = copy.deepcopy(buf.state_dict())
        json.dumps(state)  # a checkpoint can store it as JSON
        expected_steps = [(r.trajectory.traj_id, r.index) for r in buf.sample_steps(200)]
        expected_trajs = _ids(buf.sample_trajectories(5))

        rebuilt = ReplayBuffer.from_state_dict(state, list(reversed(trajs)))
        assert (rebuilt.capacity, rebuilt.val_fraction, rebuilt.seed) == (50, 0.25, 7)
        assert _ids(rebuilt) == _ids(buf) == _ids(trajs[10:])
        got_steps = [(r.trajectory.traj_id, r.index) for r in rebuilt.sample_steps(200)]
        assert got_steps == expected_steps
        assert _ids(rebuilt.sample_trajectories(5)) == expected_trajs
        # a fresh buffer with the same seed but without the state draws differently
        fresh = ReplayBuffer(capacity=50, val_fraction=0.25, seed=7)
        fresh.add(trajs)
        assert [(r.trajectory.traj_id, r.index) for r in fresh.sample_steps(200)] != (
            expected_steps)

    def test_from_state_dict_with_missing_trajectories(self):
        buf = ReplayBuffer(capacity=10)
        buf.add([make_traj("a"), make_traj("b")])
        with pytest.raises(KeyError, match="'b'"):
            ReplayBuffer.from_state_dict(buf.state_dict(), [make_traj("a")])


def _sampled_traj(traj_id: str) -> Trajectory:
    """A trajectory whose steps carry the tokens and log-probabilities they were drawn with."""
    from dataclasses import replace

    t = make_traj(traj_id, n_steps=3, ending=Ending.SUCCESS)
    steps = tuple(replace(s, action_token_ids=(5 + i, 9, 1), policy_version=2,
                          action_log_probs=(-0.25, -1.5, -0.0078125 * (i + 1)))
                  for i, s in enumerate(t.steps))
    return replace(t, steps=steps)


def test_steps_keep_their_sampled_tokens_and_log_probs_through_the_store(tmp_path):
    """Issue 17's old log-probabilities: stored per step (tokens int64, log-probs float32,
    exact for what float32 sampling wrote) and read back; a store written before the
    columns existed reads as no tokens and version -1, not as an error."""
    import datasets

    trajs = [_sampled_traj("a"), make_traj("b", n_steps=2)]
    screens = ScreenTable()
    for t in trajs:
        for s in t.steps:
            for sid in (s.screen_id, s.next_screen_id):
                if sid not in screens:
                    screens.add(Image.new("RGB", (8, 8)), screen_id=sid)
    save_trajectories(tmp_path / "st", trajs, screens)
    back, _ = load_trajectories(tmp_path / "st", with_images=False)
    by_id = {t.traj_id: t for t in back}
    assert by_id["a"].steps == trajs[0].steps
    assert by_id["a"].steps[2].action_log_probs == (-0.25, -1.5, -0.0234375)
    assert all(s.action_token_ids == () and s.action_log_probs == () for s in by_id["b"].steps)
    # the same store as an older version wrote it: without the three step columns
    (shard,) = [p for p in (tmp_path / "st").iterdir() if p.is_dir()]
    old = datasets.load_from_disk(str(shard / "steps")).remove_columns(
        ["policy_version", "action_token_ids", "action_log_probs"])
    old.save_to_disk(str(tmp_path / "old_steps"))
    del old
    shutil.rmtree(shard / "steps")
    shutil.move(str(tmp_path / "old_steps"), str(shard / "steps"))
    files = sorted(p for p in (tmp_path / "st").rglob("*"))
    back, _ = load_trajectories(tmp_path / "st", with_images=False)
    assert all(s.action_token_ids == () and s.policy_version == -1
               for t in back for s in t.steps)
    assert sorted(p for p in (tmp_path / "st").rglob("*")) == files  # reading wrote nothing
    with pytest.raises(ValueError, match="2 action log-probabilities for 3 action tokens"):
        Step.from_text(task=TASK, prompt="p", action_text=TAP, reward=0.0, done=False,
                       screen_id="s", next_screen_id="t", action_token_ids=(1, 2, 3),
                       action_log_probs=(-1.0, -2.0))


def test_a_sampled_action_is_a_string_that_takes_its_extras_onto_the_step():
    """SampledAction passes for its text everywhere (and pickles, for worker processes and
    Ray actors); the episode recorder stores its tokens and log-probabilities."""
    import pickle

    from digirl_lite.envs.sim import SimPhoneEnv
    from digirl_lite.rollout import SampledAction, run_episode

    home = format_action(Action.key(ActionType.PRESS_HOME))
    a = SampledAction(home, [3, 4, 1], [-0.5, -0.25, -0.125])
    assert a == home and isinstance(a, str) and json.dumps(a) == json.dumps(home)
    b = pickle.loads(pickle.dumps(a))
    assert (b, b.token_ids, b.log_probs) == (home, (3, 4, 1), (-0.5, -0.25, -0.125))

    class Agent:
        def act(self, obs):
            return SampledAction(home, [3, 4, 1], [-0.5, -0.25, -0.125])

    env = SimPhoneEnv("webshop_test", horizon=2)
    t = run_episode(env, Agent(), ScreenTable(), traj_id="x", task=env.tasks[0], seed=0)
    assert len(t.steps) == 2
    for s in t.steps:
        assert type(s.action_text) is str and s.action_text == home
        assert s.action_token_ids == (3, 4, 1) and s.action_log_probs == (-0.5, -0.25, -0.125)
