"""Shared test set-up: CI's no-skip rule, and fixtures built once per session.

Under ``CI=true`` a skip is a failure (tests marked ``gpu`` on a machine without CUDA aside):
CI installs everything the tests need (``.ci/run``), so a skip there would hide a test that did
not run. Collection skips (a module-level ``importorskip``) fail the same way. The terminal
summary lists how many tests of each outside-dependency marker passed, so the CI log shows the
android, chromium and AitW tests ran.
"""

from __future__ import annotations

import pytest
from needs import in_ci, network_off

#: markers whose passes the summary counts (tests that need something outside the package)
REPORTED = ("android", "chromium", "ray", "aitw", "gpu")


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _skip_reason(longrepr) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None and not _cuda():
        pytest.skip("needs a CUDA device (torch sees none)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not (in_ci() and rep.skipped) or hasattr(rep, "wasxfail"):
        return
    if item.get_closest_marker("gpu") is not None and not _cuda():
        return  # the one allowed skip: a GPU test on a machine without CUDA
    rep.outcome = "failed"
    rep.longrepr = (f"CI=true: skips fail the run, and this test skipped "
                    f"({_skip_reason(rep.longrepr)})")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    rep = outcome.get_result()
    if in_ci() and rep.skipped:
        rep.outcome = "failed"
        rep.longrepr = (f"CI=true: skips fail the run, and {collector.nodeid} skipped at "
                        f"collection ({_skip_reason(rep.longrepr)})")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    passed = [r for r in terminalreporter.stats.get("passed", []) if r.when == "call"]
    counts = {m: sum(1 for r in passed if m in r.keywords) for m in REPORTED}
    terminalreporter.write_sep("-", "tests with outside dependencies that passed")
    terminalreporter.write_line(
        ", ".join(f"{m}: {n}" for m, n in counts.items())
        + (" (CI=true: any skip fails the run)" if in_ci() else
           " (outside CI a missing dependency skips; see the skip reasons above)"))


# -- fixtures built once per session ------------------------------------------------------
@pytest.fixture(scope="session")
def minilm():
    """The real MiniLM text encoder (the critics' default), loaded once per session with the
    network off (:func:`needs.network_off`): it must load offline."""
    from digirl_lite.critics import MiniLMEncoder

    with pytest.MonkeyPatch.context() as mp:
        network_off(mp)
        return MiniLMEncoder(device="cpu")


@pytest.fixture(scope="session")
def tiny_blip2(tmp_path_factory):
    """(checkpoint dir, the Blip2Model it holds): a tiny random BLIP-2 (vision width 32) saved
    like Salesforce/blip2-opt-2.7b, built once per session (tests/tiny_models.py)."""
    from tiny_models import tiny_blip2_dir

    return tiny_blip2_dir(tmp_path_factory.mktemp("blip2"))


# -- fixtures shared by folders -----------------------------------------------------------
#: every variable a judge client reads for a key, an endpoint or logging
JUDGE_ENV_VARS = ("GEMINI_API_KEY", "GOOGLE_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL",
                  "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_LOCATION",
                  "OPENAI_LOG", "DIGIRL_JUDGE_KEY")


@pytest.fixture
def no_judge_keys(monkeypatch):
    """The test sees none of the judge clients' environment variables (a key or endpoint on
    the machine running the tests must not reach a test's client). Use with
    ``pytestmark = pytest.mark.usefixtures("no_judge_keys")``."""
    for k in JUDGE_ENV_VARS:
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
def openai_server():
    """A local OpenAI-protocol server (tests/judge_servers.py) on 127.0.0.1, stopped after
    the test."""
    from judge_servers import OpenAIServer

    with OpenAIServer() as s:
        yield s


@pytest.fixture
def make_trainer(tmp_path):
    """``make_trainer(cfg, out=tmp_path / "run")``: a Trainer as the tests build them, with no
    pile cache and no progress bars."""
    from digirl_lite.train import Trainer

    def make(cfg, out=None):
        return Trainer(cfg, tmp_path / "run" if out is None else out, cache_dir=None,
                       progress=False)

    return make
