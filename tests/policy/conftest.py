"""Fixtures the policy tests share: the simulator's tokenizer and the shipped Web Shopping
policy, each loaded once per module; the phone served over OpenEnv."""

from __future__ import annotations

import pytest
from needs import optional_import

from digirl_lite.paths import data_dir


@pytest.fixture(scope="module")
def tok():
    """The tokenizer the simulator's policies use (``data/tokenizer``)."""
    from digirl_lite.policy import SPTokenizer
    from digirl_lite.policy.tokenizer import SIM_TOKENIZER_FILE

    return SPTokenizer(data_dir() / "tokenizer" / SIM_TOKENIZER_FILE)


@pytest.fixture(scope="module")
def shipped():
    """The shipped SFT policy for simulated Web Shopping (``data/policies/sft-webshop``)."""
    from digirl_lite.policy import AutoUIPolicy

    return AutoUIPolicy.load(data_dir() / "policies" / "sft-webshop")


@pytest.fixture(scope="module")
def server():
    """The simulated phone served over OpenEnv (UI tree, no screenshot) on 127.0.0.1."""
    optional_import("openenv", 'pip install -e ".[openenv]"')
    from digirl_lite.envs.sim.openenv import LocalServer

    with LocalServer(["--ui-tree", "--no-screenshot", "--log-level", "warning"]) as srv:
        yield srv
