"""Build a judge from a plain config (what the trainer's config and checkpoints hold).

    make_judge({"judge": "oracle"})                                    # the default
    make_judge({"judge": "noisy_oracle", "false_success_rate": 0.028})
    make_judge({"judge": "paper", "examples": "data/judge_examples/webshop",
                "backend": {"backend": "gemini", "model": "gemini-1.5-pro"}})
    make_judge({"judge": "paper", "backend": {"backend": "openai", "model": "Qwen2-VL-7B",
                                              "base_url": "http://127.0.0.1:8000/v1",
                                              "api_key_env": None}})

Configs never hold API keys, only the names of the variables they are read from, so they
can be logged and saved. Every call returns a new judge: one per device.
"""

from __future__ import annotations

from typing import Any

__all__ = ["make_judge"]


def make_judge(config: dict[str, Any] | None = None):
    from digirl_lite.judge.backends import GeminiBackend, OpenAIBackend
    from digirl_lite.judge.base import NoisyOracleJudge, OracleJudge
    from digirl_lite.judge.guards import GuardedJudge
    from digirl_lite.judge.paper import FewShotSet, PaperJudge

    cfg = dict(config or {"judge": "oracle"})
    kind = cfg.pop("judge", "oracle")
    guarded = cfg.pop("guards", False) if kind != "paper" else None
    if kind == "oracle":
        judge = OracleJudge()
    elif kind == "noisy_oracle":
        judge = NoisyOracleJudge(**cfg)
    elif kind == "paper":
        b = dict(cfg.pop("backend", {}))
        name = b.pop("backend", "gemini")
        if name == "gemini":
            backend = GeminiBackend(**b)
        elif name == "openai":
            backend = OpenAIBackend(**b)
        else:
            raise ValueError(f"unknown judge backend {name!r} (gemini, openai)")
        examples = cfg.pop("examples", None)
        if isinstance(examples, list):  # a saved config lists the example images
            raise ValueError("give 'examples' as the few-shot folder, not a list of images")
        return PaperJudge(backend, FewShotSet.load(examples) if examples else None, **cfg)
    else:
        raise ValueError(f"unknown judge {kind!r} (oracle, noisy_oracle, paper)")
    return GuardedJudge(judge) if guarded else judge
