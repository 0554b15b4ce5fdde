"""The env factory's WorldInfo: what the trainer needs of a world (drift days, the pile key's
world entries, the screen features' width), filled in by the simulator and by Android, equal
to what the trainer computed itself before (so pile keys and reset options stay as they were).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from digirl_lite.envs.base import WorldInfo
from digirl_lite.envs.setup import world_info


def _cfg(**kw):
    base = dict(env="sim", android={}, day=1, days_per_iteration=0.0, sim_surprises={},
                sim_faults={}, sim_layout="older", phrasing_share=0.0, train_phrasings="base")
    return SimpleNamespace(**{**base, **kw})


def _old_world_entries(c) -> tuple:
    """The world's entries of the trainer's pile key as it wrote them itself."""
    devices = () if c.env == "sim" else (c.env, c.android)
    devices += () if c.day == 1 else (("day", c.day),)
    devices += (("surprises", sorted(c.sim_surprises.items())),) if c.sim_surprises else ()
    devices += (("faults", sorted(c.sim_faults.items())),) if c.sim_faults else ()
    devices += (("layout", c.sim_layout),) if c.sim_layout != "older" else ()
    devices += (("phrasing", c.phrasing_share),) if c.phrasing_share else ()
    devices += ((("phrasings", c.train_phrasings),)
                if c.phrasing_share and c.train_phrasings != "base" else ())
    return devices


@pytest.mark.parametrize("kw", [
    {},
    {"day": 4},
    {"sim_surprises": {"popup": 0.2, "blank": 0.0}, "sim_faults": {"crash": 0.01}},
    {"sim_layout": "current", "phrasing_share": 0.5},
    {"phrasing_share": 0.5, "train_phrasings": "wide", "day": 2},
    {"env": "android", "android": {"devices": ["http://127.0.0.1:4723"]}},
])
def test_the_pile_key_entries_are_the_trainers_own(kw):
    c = _cfg(**kw)
    info = world_info(c)
    assert isinstance(info, WorldInfo) and info.env == c.env
    assert info.pile_key == _old_world_entries(c)


def test_drift_days_and_reset_options():
    sim, android = world_info(_cfg()), world_info(_cfg(env="android"))
    for first, per, k in [(1, 0.0, 5), (1, 0.5, 0), (1, 0.5, 3), (3, 0.5, 7), (2, 1 / 3, 3),
                          (1, 0.1, 30), (5, 2.0, -1)]:
        # the trainer's phone_day: day + floor(max(k, 0) * days_per_iteration + 1e-9)
        assert sim.day(first, per, k) == first + math.floor(max(k, 0) * per + 1e-9)
        assert android.day(first, per, k) == first
    assert sim.reset_options(3) == {"day": 3}
    assert android.reset_options(3) == {}
    assert sim.drift and not android.drift


def test_feature_width():
    from digirl_lite.vision.sim_encoder import SIM_FEATURE_DIM

    assert world_info(_cfg()).feature_dim == SIM_FEATURE_DIM
    assert world_info(_cfg(env="android")).feature_dim is None
