"""Trajectories, the screens they point to, their on-disk store, the replay buffer, and their
export to (and import from) TRL's multi-turn vision dataset (``images`` and ``messages``).

``import digirl_lite.data`` is light (numpy only); the store imports HF ``datasets`` when
first used.
"""

from digirl_lite.data.records import (
    Ending,
    ScreenTable,
    Source,
    Step,
    Trajectory,
    Verdict,
    screen_id_of_features,
    screen_id_of_image,
)
from digirl_lite.data.replay import ReplayBuffer, StepRef, split_of
from digirl_lite.data.store import (
    SCHEMA_VERSION,
    StoreError,
    TrajectoryStore,
    load_trajectories,
    save_trajectories,
)
from digirl_lite.data.trl_format import (
    MessagesFormatError,
    from_messages_dataset,
    to_messages_dataset,
)

__all__ = [
    "Ending", "ScreenTable", "Source", "Step", "Trajectory", "Verdict",
    "screen_id_of_features", "screen_id_of_image",
    "ReplayBuffer", "StepRef", "split_of",
    "SCHEMA_VERSION", "StoreError", "TrajectoryStore", "load_trajectories", "save_trajectories",
    "MessagesFormatError", "from_messages_dataset", "to_messages_dataset",
    "import_released", "export_released",
]


def __getattr__(name: str):
    # The released-format functions live in their own module (it may import torch).
    if name in ("import_released", "export_released"):
        from digirl_lite.data import released

        return getattr(released, name)
    raise AttributeError(f"module 'digirl_lite.data' has no attribute {name!r}")
