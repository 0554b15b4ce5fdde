"""Import and export of DigiRL's released trajectory files (pickle / torch.save layout).

The files are built here by hand in the released layout (a list of trajectories, each a list
of step dicts with two-frame ``image_features``), written with ``pickle.dump`` and with
``torch.save``.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from digirl_lite.actions import Action, ActionType, format_action
from digirl_lite.data import Ending, Source, screen_id_of_features
from digirl_lite.data.released import UnsafeFileError, export_released, import_released
from digirl_lite.data.synthetic import random_pile
from digirl_lite.filters import mc_returns
from digirl_lite.prompts import build_prompt

D = 8  # floats per frame in these tests (1408 in the real files)
HORIZON = 4

TAP = format_action(Action.tap(x=0.5, y=0.62))
TAP2 = format_action(Action.tap(x=0.25, y=0.1))
TYPE = format_action(Action.type_text("bose soundsport free"))
ENTER = format_action(Action.key(ActionType.PRESS_ENTER))
STOP = format_action(Action.key(ActionType.STATUS_TASK_COMPLETE))
IMPOSSIBLE = format_action(Action.key(ActionType.TASK_IMPOSSIBLE))


def _frames(names: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(D).astype(np.float32) for n in names}


# one shared frame pool: "H" is the home screen every episode starts on; "a" appears twice
FRAMES = _frames("Habcdefgxy")

# (task written in the prompt, frames s_0..s_T, actions, rewards, extra "task" key or None)
SPEC = [
    ("Go to walmart.com", "Habc", [TAP, TYPE, ENTER], [0.0, 0.0, 1.0], None),       # success
    ("What's the news in India?", "Hde", [TAP, STOP], [0.0, 0.0], None),           # agent stop
    ("Go to ebay.com, search for 'apple airpods'", "Hfgxy", [TAP, TAP2, TAP, TAP2],
     [0.0, 0.0, 0.0, 0.0], None),                                                  # budget (H=4)
    ("prompt goal", "Ha", [IMPOSSIBLE], [0.0], "the task key wins"),                # task key
]
ENDINGS = [Ending.SUCCESS, Ending.AGENT_STOP, Ending.BUDGET, Ending.AGENT_STOP]


def released_data(tensor: bool = False, next_features: bool = True) -> list[list[dict]]:
    """SPEC in the released layout: image_features = [previous frame | current frame]."""
    if tensor:
        import torch

        conv = torch.from_numpy
    else:
        def conv(a):
            return a

    data = []
    for ti, (task, frames, actions, rewards, task_key) in enumerate(SPEC):
        f = [FRAMES[c] for c in frames]
        g = mc_returns(rewards)
        rows = []
        for h, act in enumerate(actions):
            prev = f[max(h - 1, 0)]
            d = {
                "observation": build_prompt(task, actions[h - 1] if h else None),
                "next_observation": build_prompt(task, act),
                "image_features": conv(np.concatenate([prev, f[h]]).astype(np.float32)),
                "action": act,
                "reward": rewards[h],
                "done": h == len(actions) - 1,
                "mc_return": float(g[h]),
                "trajectory_reward": float(sum(rewards)),
                "image_path": f"/data/traj{ti}/step{h}.png",
            }
            if next_features:
                d["next_image_features"] = conv(
                    np.concatenate([f[h], f[h + 1]]).astype(np.float32))
            if task_key is not None:
                d["task"] = task_key
            rows.append(d)
        data.append(rows)
    return data


def write(data, path: Path) -> Path:
    if path.suffix == ".pt":
        import torch

        torch.save(data, path)
    else:
        with open(path, "wb") as f:
            pickle.dump(data, f)
    return path


class _MkdirOnLoad:
    """Unpickling this creates a folder: stands in for a malicious payload."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


# ========================================================================================
# Refusing to unpickle
# ========================================================================================
@pytest.mark.parametrize("suffix", [".pkl", ".pt"])
def test_refuses_without_allow_pickle(tmp_path, suffix):
    path = write(released_data(), tmp_path / f"pile{suffix}")
    with pytest.raises(UnsafeFileError, match="allow_pickle") as e:
        import_released(path, feature_dim=D)
    assert str(path) in str(e.value)
    assert isinstance(e.value, PermissionError)


@pytest.mark.parametrize("suffix", [".pkl", ".pt"])
def test_refusal_runs_no_code_from_the_file(tmp_path, suffix):
    marker = tmp_path / "pwned"
    path = write([[_MkdirOnLoad(str(marker))]], tmp_path / f"evil{suffix}")
    assert not marker.exists()
    with pytest.raises(UnsafeFileError):
        import_released(path)
    with pytest.raises(UnsafeFileError):
        import_released(path, allow_pickle=False, feature_dim=D, load_images=True)
    assert not marker.exists()
    # positive control: the payload is live, and it is the refusal that kept it from running
    with pytest.raises(ValueError, match="trajectory 0, step 0"):
        import_released(path, allow_pickle=True)
    assert marker.is_dir()


# ========================================================================================
# Importing
# ========================================================================================
@pytest.fixture(params=[("pkl", False), ("pt", False), ("pt", True)],
                ids=["pickle-numpy", "torch-numpy", "torch-tensors"])
def imported(request, tmp_path):
    suffix, tensor = request.param
    path = write(released_data(tensor=tensor), tmp_path / f"webshop.{suffix}")
    trajs, screens = import_released(path, allow_pickle=True, feature_dim=D, horizon=HORIZON)
    return trajs, screens


def test_trajectories_and_steps(imported):
    trajs, _ = imported
    assert len(trajs) == len(SPEC)
    assert [t.traj_id for t in trajs] == [f"webshop-{i}" for i in range(len(SPEC))]
    for t, (task, frames, actions, rewards, _) in zip(trajs, SPEC):
        assert len(t) == len(actions) == len(frames) - 1
        assert [s.action_text for s in t.steps] == actions
        assert all(s.action.is_valid for s in t.steps)
        assert [s.reward for s in t.steps] == rewards
        assert [s.done for s in t.steps] == [False] * (len(actions) - 1) + [True]
        assert [s.mc_return for s in t.steps] == list(mc_returns(rewards))
        assert t.steps[0].prompt == build_prompt(task)
        assert all(s.verdict is None for s in t.steps)
        assert t.source is Source.OFFLINE and t.iteration == -1 and t.horizon == HORIZON
        assert t.is_usable
    assert [s.mc_return for s in trajs[0].steps] == [0.25, 0.5, 1.0]
    assert trajs[0].steps[1].action == Action.type_text("bose soundsport free")


def test_tasks_from_prompt_or_task_key(imported):
    trajs, _ = imported
    assert [t.task for t in trajs[:3]] == [s[0] for s in SPEC[:3]]
    assert all(s.task == trajs[0].task for s in trajs[0].steps)
    assert trajs[3].task == "the task key wins"


def test_endings(imported):
    trajs, _ = imported
    assert [t.ending for t in trajs] == ENDINGS
    assert [t.final_reward for t in trajs] == [1.0, 0.0, 0.0, 0.0]
    assert trajs[0].is_success and not any(t.is_success for t in trajs[1:])


def test_budget_ending_depends_on_horizon(tmp_path):
    path = write(released_data(), tmp_path / "p.pkl")
    trajs, _ = import_released(path, allow_pickle=True, feature_dim=D, horizon=10)
    # 4 steps of a 10-step budget, no success, no stop: the reference env only ends that
    # way on an exception, so it is an infrastructure truncation, not an agent failure
    assert trajs[2].ending is Ending.INFRA
    assert "4 of 10 steps" in trajs[2].truncation_reason
    assert trajs[2].horizon == 10
    assert [t.ending for t in trajs[:2]] == ENDINGS[:2]


def test_screens_dedup_and_last_frame(imported):
    trajs, screens = imported
    distinct = {c for _, frames, _, _, _ in SPEC for c in frames}
    assert len(screens) == len(distinct)
    assert screens.feature_dim == D
    home = screen_id_of_features(FRAMES["H"])
    assert {t.steps[0].screen_id for t in trajs} == {home}
    # the same features anywhere -> the same screen id ("a" is in trajectories 0 and 3)
    assert trajs[0].steps[0].next_screen_id == trajs[3].steps[0].next_screen_id
    for t, (_, frames, _, _, _) in zip(trajs, SPEC):
        prev, cur = t.state_frames()
        assert cur == [screen_id_of_features(FRAMES[c]) for c in frames]
        # the current frame is the second half of image_features, not the first
        np.testing.assert_array_equal(screens.features(cur),
                                      np.stack([FRAMES[c] for c in frames]))
        # and the two-frame state rebuilds the file's image_features
        want = np.stack([np.concatenate([FRAMES[frames[max(h - 1, 0)]], FRAMES[frames[h]]])
                         for h in range(len(frames))])
        np.testing.assert_array_equal(screens.stack(prev, cur), want)
    assert screens.source_path(trajs[0].steps[1].screen_id) == "/data/traj0/step1.png"


def test_next_screen_ids_chain(imported):
    trajs, _ = imported
    for t, (_, frames, _, _, _) in zip(trajs, SPEC):
        for a, b in zip(t.steps, t.steps[1:]):
            assert a.next_screen_id == b.screen_id
        assert t.steps[-1].next_screen_id == screen_id_of_features(FRAMES[frames[-1]])
        assert t.steps[-1].next_screen_id != t.steps[-1].screen_id


def test_without_next_image_features_chains_from_next_step(tmp_path):
    path = write(released_data(next_features=False), tmp_path / "p.pkl")
    trajs, screens = import_released(path, allow_pickle=True, feature_dim=D, horizon=HORIZON)
    for t, (_, frames, _, _, _) in zip(trajs, SPEC):
        ids = [s.screen_id for s in t.steps]
        assert ids == [screen_id_of_features(FRAMES[c]) for c in frames[:-1]]
        assert [s.next_screen_id for s in t.steps[:-1]] == ids[1:]
    assert len(screens) == len({c for _, f, _, _, _ in SPEC for c in f[:-1]})


def test_single_frame_features_and_id_prefix(tmp_path):
    data = released_data()
    for traj in data:
        for d in traj:
            d["image_features"] = d["image_features"][D:]  # one frame: d floats
            d["next_image_features"] = d["next_image_features"][D:]
    path = write(data, tmp_path / "p.pkl")
    trajs, screens = import_released(path, allow_pickle=True, feature_dim=D, horizon=HORIZON,
                                     id_prefix="general", source=Source.ONLINE)
    assert [t.traj_id for t in trajs] == [f"general-{i}" for i in range(len(SPEC))]
    assert all(t.source is Source.ONLINE for t in trajs)
    _, cur = trajs[0].state_frames()
    np.testing.assert_array_equal(screens.features(cur), np.stack([FRAMES[c] for c in "Habc"]))


def test_load_images_reads_existing_pngs(tmp_path):
    from PIL import Image

    data = released_data()
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 256, size=(6, 4, 3), dtype=np.uint8)
    png = tmp_path / "shot.png"
    Image.fromarray(arr).save(png)
    data[0][1]["image_path"] = str(png)  # exists; every other path does not
    path = write(data, tmp_path / "p.pkl")
    trajs, screens = import_released(path, allow_pickle=True, feature_dim=D, horizon=HORIZON,
                                     load_images=True)
    sid = trajs[0].steps[1].screen_id
    np.testing.assert_array_equal(np.asarray(screens.image(sid)), arr)
    assert screens.source_path(sid) == str(png)
    assert screens.image(trajs[0].steps[2].screen_id) is None  # missing file: no image
    plain, plain_screens = import_released(path, allow_pickle=True, feature_dim=D,
                                           horizon=HORIZON)
    assert plain_screens.image(plain[0].steps[1].screen_id) is None  # not asked for
    assert plain == trajs


# ========================================================================================
# Exporting
# ========================================================================================
@pytest.fixture(scope="module")
def pile():
    trajs, screens = random_pile(30, seed=3, horizon=6, feature_dim=D, n_screens=10,
                                 infra_rate=0.2, invalid_rate=0.2)
    assert any(t.is_infra_truncated for t in trajs)
    assert any(s.action.action_type is ActionType.INVALID for t in trajs for s in t.steps)
    return trajs, screens


@pytest.mark.parametrize("suffix", [".pkl", ".pt"])
def test_export_then_import_round_trip(pile, tmp_path, suffix):
    trajs, screens = pile
    kept = [t for t in trajs if not t.is_infra_truncated]
    path = export_released(trajs, screens, tmp_path / "out" / f"pile{suffix}")
    assert path.is_file()
    back, table = import_released(path, allow_pickle=True, feature_dim=D, horizon=6)
    assert len(back) == len(kept) < len(trajs)  # infrastructure truncations skipped
    for a, b in zip(back, kept):
        assert [s.action_text for s in a.steps] == [s.action_text for s in b.steps]
        assert [s.action for s in a.steps] == [s.action for s in b.steps]
        assert [s.reward for s in a.steps] == [s.reward for s in b.steps]
        assert [s.mc_return for s in a.steps] == [s.mc_return for s in b.steps]
        assert [s.done for s in a.steps] == [s.done for s in b.steps]
        assert [s.prompt for s in a.steps] == [s.prompt for s in b.steps]
        assert (a.task, a.final_reward, a.ending) == (b.task, b.final_reward, b.ending)
        np.testing.assert_array_equal(table.stack(*a.state_frames()),
                                      screens.stack(*b.state_frames()))
        for sa, sb in zip(a.steps, b.steps):
            if sb.action.action_type is ActionType.INVALID:
                assert sa.action.invalid_reason == sb.action.invalid_reason


def test_export_writes_the_released_layout(pile, tmp_path):
    trajs, screens = pile
    kept = [t for t in trajs if not t.is_infra_truncated]
    path = export_released(trajs, screens, tmp_path / "pile.pkl")
    with open(path, "rb") as f:
        data = pickle.load(f)
    assert isinstance(data, list) and len(data) == len(kept)
    for rows, t in zip(data, kept):
        assert isinstance(rows, list) and len(rows) == len(t)
        prev, cur = t.state_frames()
        stacked = screens.stack(prev, cur)
        for h, (d, s) in enumerate(zip(rows, t.steps)):
            assert {"observation", "next_observation", "image_features", "next_image_features",
                    "action", "reward", "done", "mc_return", "trajectory_reward",
                    "image_path"} <= set(d)
            assert d["image_features"].shape == (2 * D,)
            np.testing.assert_array_equal(d["image_features"], stacked[h])
            np.testing.assert_array_equal(d["next_image_features"], stacked[h + 1])
            assert d["observation"] == s.prompt and d["action"] == s.action_text
            assert d["trajectory_reward"] == t.final_reward
        np.testing.assert_array_equal(rows[0]["image_features"][:D],
                                      rows[0]["image_features"][D:])  # first frame repeated


def test_export_import_keeps_unjudged_trajectories_unusable(tmp_path):
    trajs, screens = random_pile(40, seed=8, horizon=6, feature_dim=D, infra_rate=0.0,
                                 unjudged_rate=0.3)
    unusable = [t.traj_id for t in trajs if not t.is_usable]
    assert unusable
    back, _ = import_released(export_released(trajs, screens, tmp_path / "p.pkl"),
                              allow_pickle=True, feature_dim=D, horizon=6)
    assert [t.is_usable for t in back] == [t.is_usable for t in trajs]


def test_export_of_only_infra_is_an_empty_list(pile, tmp_path):
    trajs, screens = pile
    infra = [t for t in trajs if t.is_infra_truncated]
    path = export_released(infra, screens, tmp_path / "infra.pt")
    import torch

    assert torch.load(path, weights_only=False) == []
    back, table = import_released(path, allow_pickle=True, feature_dim=D)
    assert back == [] and len(table) == 0


# ========================================================================================
# Files of another layout
# ========================================================================================
def _import(tmp_path, data, name="bad.pkl"):
    return import_released(write(data, tmp_path / name), allow_pickle=True, feature_dim=D,
                           horizon=HORIZON)


def test_top_level_dict_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="expected a list of trajectories, got dict"):
        _import(tmp_path, {"trajectories": released_data()})


def test_trajectory_that_is_not_a_list(tmp_path):
    data = released_data()
    data[2] = {"steps": data[2]}
    with pytest.raises(ValueError, match=r"trajectory 2: expected a list of step dicts"):
        _import(tmp_path, data)


def test_step_that_is_not_a_dict(tmp_path):
    data = released_data()
    data[1][1] = list(data[1][1].items())
    with pytest.raises(ValueError, match=r"trajectory 1, step 1: expected a dict, got list"):
        _import(tmp_path, data)


@pytest.mark.parametrize("key", ["observation", "action", "reward", "done", "image_features"])
def test_missing_key_names_trajectory_and_step(tmp_path, key):
    data = released_data()
    del data[2][3][key]
    with pytest.raises(ValueError, match=r"trajectory 2, step 3: missing keys") as e:
        _import(tmp_path, data)
    assert key in str(e.value)
    assert "bad.pkl" in str(e.value)


@pytest.mark.parametrize("field", ["image_features", "next_image_features"])
@pytest.mark.parametrize("n", [D - 1, D + 1, 3 * D])
def test_wrong_feature_length_names_trajectory_and_step(tmp_path, field, n):
    data = released_data()
    data[1][1][field] = np.zeros(n, dtype=np.float32)
    with pytest.raises(ValueError, match=rf"trajectory 1, step 1: image features have {n} "):
        _import(tmp_path, data)


def test_real_feature_size_needs_feature_dim(tmp_path):
    path = write(released_data(), tmp_path / "p.pkl")  # 2 x 8 floats, default feature_dim 1408
    with pytest.raises(ValueError, match="trajectory 0, step 0.*feature_dim"):
        import_released(path, allow_pickle=True)
