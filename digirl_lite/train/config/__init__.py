"""Configuration of a DigiRL run (spec/DIGIRL.md section 7), with named presets.

:class:`DigiRLConfig` is one flat dataclass (``cfg.field``; one JSON object of fields, as
config files and checkpoints hold it) made of field groups, one module each, each with its
checks:

- :mod:`.run`: task set, seed, algorithm, judge, budget, device;
- :mod:`.fleet`: the phones (simulated or Android) and the fleet;
- :mod:`.policy`: the policy and how it samples actions;
- :mod:`.sft`: the starting policy and its supervised fine-tuning;
- :mod:`.simulator`: the simulated phone (phrasings, drift, surprises, layout, faults);
- :mod:`.evaluation`: what is evaluated when, by which judge;
- :mod:`.learning`: the critics, the filters and the actor;
- :mod:`.on_policy`: PPO and GRPO;
- :mod:`.claw`: Darwin-Claw around the learning policy.

:mod:`.core` composes them; :mod:`.presets` holds the presets and config files. A field's
default is its paper's, released code's or this project's value, presets only override;
``docs/config.md`` gives the measurements behind the defaults that are this project's.
"""

from __future__ import annotations

from digirl_lite.errors import ConfigError
from digirl_lite.train.config.core import (
    OWN_DEFAULT,
    DigiRLConfig,
    effective_fields,
    unread,
    with_algorithm,
)
from digirl_lite.train.config.evaluation import EVAL_ONLY
from digirl_lite.train.config.fleet import ASYNC_FLEETS, LEARNER_MODES
from digirl_lite.train.config.presets import (
    PRESETS,
    SHIPPED_SPLITS,
    load_config,
    sim_quick,
    sim_webshop,
)
from digirl_lite.train.config.presets import _config_fields as _config_fields  # tests
from digirl_lite.train.config.run import WORLDS
from digirl_lite.train.config.sft import SFT_PHONES

__all__ = ["ConfigError", "DigiRLConfig", "load_config", "sim_webshop", "sim_quick",
           "with_algorithm", "effective_fields", "unread", "EVAL_ONLY", "OWN_DEFAULT",
           "WORLDS", "LEARNER_MODES", "SFT_PHONES", "ASYNC_FLEETS", "SHIPPED_SPLITS",
           "PRESETS"]
