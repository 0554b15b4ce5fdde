"""Build a judge from a plain config (what the trainer's config and checkpoints hold).

The factory sits above the judges of :mod:`digirl_lite.judge` (the paper's evaluator, its
backends and guards, the oracles of :mod:`digirl_lite.judge.oracle`) and imports no
environment, so every environment's factory can build its judge from a config.

    make_judge({"judge": "oracle"})                                    # the default
    make_judge({"judge": "env"})           # the environment's own success check
    make_judge({"judge": "noisy_oracle", "false_success_rate": 0.028})
    make_judge({"judge": "paper", "examples": "digirl_lite/assets/judge_examples/webshop",
                "backend": {"backend": "gemini", "model": "gemini-1.5-pro"}})
    make_judge({"judge": "paper", "backend": {"backend": "openai", "model": "Qwen2-VL-7B",
                                              "base_url": "http://127.0.0.1:8000/v1",
                                              "api_key_env": None}})

Configs never hold API keys, only the names of the variables they are read from, so they
can be logged and saved. Every call returns a new judge: one per device.
"""

from __future__ import annotations

from typing import Any

from digirl_lite.errors import ConfigError

__all__ = ["make_judge", "check_judge", "probe_judge", "JUDGES"]

JUDGES = ("oracle", "noisy_oracle", "env", "paper")
_EXTRA = {"gemini": "google.genai", "openai": "openai"}
_KEY_DEFAULT = {"gemini": "GEMINI_API_KEY", "openai": "OPENAI_API_KEY"}


def check_judge(config: dict[str, Any] | None, env: str = "sim",
                android_reset: str | None = None) -> None:
    """Raise :class:`~digirl_lite.errors.ConfigError` for a judge that cannot work, before
    any collection: an unknown kind, a missing client library (the ``judge`` extra), an API
    key variable that is not set, a missing few-shot folder, or a judge that needs state the
    environment does not have (the simulator's oracle on a device over Appium; the
    environment's own check on real devices, which have none)."""
    import importlib
    import os

    cfg = dict(config or {"judge": "oracle"})
    kind = cfg.get("judge", "oracle")
    if kind not in JUDGES:
        raise ConfigError(f"judge.judge: unknown judge {kind!r} (one of {JUDGES})")
    if env == "android" and kind in ("oracle", "noisy_oracle"):
        raise ConfigError(
            f"judge: {kind!r} reads the simulator's state, which a device over Appium does "
            "not send; use {\"judge\": \"env\"} (served simulated phones) or \"paper\"")
    if env == "android" and kind == "env" and android_reset == "snapshot":
        raise ConfigError(
            "judge: 'env' needs a device with its own success check (served simulated phones, "
            "android.reset 'home' or 'task'); emulators of real apps have none: use 'paper'")
    if kind != "paper":
        return
    b = dict(cfg.get("backend") or {})
    name = b.get("backend", "gemini")
    if name not in _EXTRA:
        raise ConfigError(f"judge.backend.backend: unknown backend {name!r} (gemini, openai)")
    try:
        importlib.import_module(_EXTRA[name])
    except ImportError:
        raise ConfigError(f"judge.backend: the {name} backend needs {_EXTRA[name]!r}, which "
                          "is not installed: pip install 'digirl-lite[judge]'") from None
    key_env = b.get("api_key_env", _KEY_DEFAULT[name])
    if key_env is not None and not os.environ.get(key_env):
        raise ConfigError(
            f"judge.backend.api_key_env: the environment variable {key_env} is not set (the "
            f"{name} judge reads its API key from there; for a local server that needs no "
            "key set \"api_key_env\": null)")
    if name == "openai" and not b.get("model"):
        raise ConfigError("judge.backend.model: the openai backend needs the served model's "
                          "name")
    examples = cfg.get("examples")
    if examples is not None:
        from pathlib import Path

        if not isinstance(examples, str):
            raise ConfigError("judge.examples: give the few-shot folder, not a list of images")
        d = Path(examples).expanduser()
        if not ((d / "labels.jsonl").is_file() or (d / "labels.csv").is_file()):
            raise ConfigError(f"judge.examples: {d} has no labels.jsonl or labels.csv")


def probe_judge(config: dict[str, Any] | None, timeout_s: float = 10.0) -> None:
    """One real request to a VLM judge (``"paper"``) before any collection (issue 29): the
    first shipped example screen and its task, zero-shot, with a ``timeout_s`` limit and no
    retry. A refused connection, an error status or a reply without a readable status is a
    :class:`~digirl_lite.errors.ConfigError` naming the endpoint and the answer, so a judge
    that is down stops the run in seconds instead of after minutes of backoff. The other
    judges need nothing probed."""
    from digirl_lite.judge.backends import BackendError
    from digirl_lite.judge.guards import shrink
    from digirl_lite.judge.paper import FewShotSet, build_prompt_parts, parse_status
    from digirl_lite.paths import data_dir

    cfg = dict(config or {"judge": "oracle"})
    if cfg.get("judge", "oracle") != "paper":
        return
    b = dict(cfg.get("backend") or {})
    b["timeout_s"] = min(float(b.get("timeout_s", timeout_s)), timeout_s)
    judge = make_judge({**cfg, "backend": b})
    backend = judge.backend
    where = backend.base_url or f"the {b.get('backend', 'gemini')} API"
    example = FewShotSet.load(data_dir() / "judge_examples" / "webshop").examples[0]
    parts = build_prompt_parts(example.task, shrink(example.image(), judge.judge_width), None)
    try:
        reply = backend.generate(parts)
    except BackendError as e:
        raise ConfigError(f"judge.backend: the judge at {where} failed its probe request (one "
                          f"shipped example screen, before any collection): {e}"[:800]) from None
    if parse_status(reply.text) is None:
        raise ConfigError(f"judge.backend: the judge at {where} answered its probe request "
                          "without a 'Status: success|failure' line: "
                          f"{(reply.text or '')[:300]!r}")


def make_judge(config: dict[str, Any] | None = None):
    from digirl_lite.judge.backends import make_backend
    from digirl_lite.judge.guards import GuardedJudge
    from digirl_lite.judge.oracle import EnvJudge, NoisyOracleJudge, OracleJudge
    from digirl_lite.judge.paper import FewShotSet, PaperJudge

    cfg = dict(config or {"judge": "oracle"})
    kind = cfg.pop("judge", "oracle")
    guarded = cfg.pop("guards", False) if kind not in ("paper", "env") else None
    if kind == "oracle":
        judge = OracleJudge()
    elif kind == "env":
        judge = EnvJudge()
    elif kind == "noisy_oracle":
        judge = NoisyOracleJudge(**cfg)
    elif kind == "paper":
        # gemini when the config names no backend (as check_judge reads it)
        backend = make_backend({"backend": "gemini", **dict(cfg.pop("backend", {}))})
        examples = cfg.pop("examples", None)
        if isinstance(examples, list):  # a saved config lists the example images
            raise ValueError("give 'examples' as the few-shot folder, not a list of images")
        return PaperJudge(backend, FewShotSet.load(examples) if examples else None, **cfg)
    else:
        raise ValueError(f"unknown judge {kind!r} (one of {JUDGES})")
    return GuardedJudge(judge) if guarded else judge
