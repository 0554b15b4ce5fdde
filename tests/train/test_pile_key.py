"""The pile's cache key, now built from the env factory's WorldInfo
(:func:`digirl_lite.train.pile.pile_key`), is byte for byte the key the trainer wrote when it
spelled out the simulator's entries itself: users' cached piles (``pile-<key>``) and the
results under ``benchmarks/results`` that name them keep pointing at the same piles.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from digirl_lite.envs.setup import world_info
from digirl_lite.train.config import DigiRLConfig, load_config, sim_quick
from digirl_lite.train.pile import pile_key

CONFIGS = Path(__file__).resolve().parents[2] / "recipes" / "configs"

# Computed by the old code at commit c24995a (StartingPolicyAndPile.pile_key, whose body
# wrote the device and simulator entries itself), called on a stand-in trainer holding only
# the config: SimpleNamespace(cfg=c, sft_key=lambda: sft_key(c), _cache_key=content_key).
OLD_KEYS = {
    "sim_quick": "39fd72085177",
    "paper_setting_webshop": "a07ac2bc6d55",
    "paper_setting_general": "caebca26c5d2",
    "sim_quick_drift": "b7b933217f3d",
    "android": "0a7a3dc0ff1a",
}


def _config(name: str) -> DigiRLConfig:
    if name == "sim_quick":
        return sim_quick()
    if name.startswith("paper_setting_"):
        # the third design's file (the fourth changed General's; these keys are the third's)
        return load_config(CONFIGS / "paper_setting_v3.json", world=name.rpartition("_")[2])
    if name == "sim_quick_drift":  # every simulator entry of the key that has a value
        return sim_quick(day=3, days_per_iteration=0.5, sim_faults={"crash": 0.01},
                         phrasing_share=0.5, train_phrasings="wide")
    return DigiRLConfig(env="android", android={"devices": ["http://127.0.0.1:4723"]},
                        starting_policy="shipped")


@pytest.mark.slow  # the first key loads the policy package (torch) for the SFT key: ~5 s
@pytest.mark.parametrize("name", sorted(OLD_KEYS))
def test_the_pile_key_is_the_old_one(name):
    cfg = _config(name)
    assert pile_key(cfg, world_info(cfg)) == OLD_KEYS[name]
