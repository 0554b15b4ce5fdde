"""The simulated phone's pixels are part of its definition: the same state draws the same
screen on every install, or a run's numbers move with a library's version.

Pillow 13.0 shrinks a screen (BILINEAR, as a run records it) to other pixels than Pillow
10.1-12.3 do (measured: the same screens, 1,775 of 98,496 pixels differ at 216 x 456; the
full-size drawing is the same), and a run's trajectories follow its screens: the main job at one
commit gave 37.5% after the offline phase under Pillow 12.3 and 16.7% under 13.0, the same
machine and seed. ``pyproject.toml`` therefore pins ``pillow>=10.1,<13``, and this test holds
the screens of expert episodes (every surprise on, both worlds) to the digests recorded in
``data/fixtures/screen_golden.json``. A change meant to alter the drawing rewrites them:

    python tests/sim/test_screen_pixels.py --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "data" / "fixtures" / "screen_golden.json"
WORLDS = ("webshop", "general")
SURPRISES = {"popup": 1.0, "consent": 1.0, "voice": 1.0, "reorder": 1.0, "blank": 0.0,
             "sponsored": 1.0}


def screens(world: str, episodes: int = 2, steps: int = 8) -> dict[str, str]:
    """Digests of the screens (raw RGB bytes, full size), of the same screens shrunk as a
    run records them (``record_screen``: BILINEAR to ``RECORD_SIZE``, where Pillow 13 differs)
    and of the sim encoder's features of those, along the first ``episodes`` test tasks, the
    scripted expert acting (at most ``steps`` each)."""
    import numpy as np

    from digirl_lite.actions import format_action
    from digirl_lite.envs.sim import SimPhoneEnv
    from digirl_lite.envs.sim.agents import expert_action
    from digirl_lite.rollout.devices import shrink_obs
    from digirl_lite.rollout.episode import RECORD_SIZE
    from digirl_lite.vision import SimScreenEncoder

    env = SimPhoneEnv(f"{world}_test", surprises=SURPRISES, seed=0)
    enc = SimScreenEncoder(seed=0)
    pixels, shrunk, feats = hashlib.sha256(), hashlib.sha256(), hashlib.sha256()
    n = 0
    for k in range(episodes):
        obs, _ = env.reset(task=env.tasks[k], seed=k)
        for _ in range(steps):
            small = shrink_obs(obs, RECORD_SIZE).screenshot
            pixels.update(obs.screenshot.tobytes())
            shrunk.update(small.tobytes())
            feats.update(np.round(enc.encode(small), 5).tobytes())
            n += 1
            action = expert_action(env.state, env.task)
            obs, _, terminated, truncated, _ = env.step(format_action(action))
            if terminated or truncated:
                break
    return {"screens": str(n), "pixels": pixels.hexdigest(), "recorded": shrunk.hexdigest(),
            "features": feats.hexdigest()}


@pytest.mark.slow  # 23 screens drawn, shrunk and encoded (~0.8 s)
def test_the_phone_draws_the_recorded_screens():
    import PIL

    golden = json.loads(GOLDEN.read_text())
    for world in WORLDS:
        assert screens(world) == golden["worlds"][world], (
            f"{world}: the simulated phone draws other pixels than recorded under Pillow "
            f"{golden['pillow']} (this install: Pillow {PIL.__version__}); a run's numbers "
            "follow its screens, so results are not comparable across this change. Keep "
            "Pillow in pyproject.toml's range, or rewrite the golden if the drawing was "
            "meant to change")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: test_screen_pixels.py --write")
    import PIL

    GOLDEN.write_text(json.dumps({"pillow": PIL.__version__,
                                  "worlds": {w: screens(w) for w in WORLDS}}, indent=1) + "\n")
    print(GOLDEN.read_text())
