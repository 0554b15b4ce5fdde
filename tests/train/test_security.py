"""What a run writes holds no credential, and the served phone tells its clients no more than
a W3C error (issue 32, item 6): :func:`digirl_lite.redaction.redact` on hand-made configs, a
real run's files, resume and grid results under redaction; the served phone's error answers,
its body limit and its refusal of a Content-Length that is not a number."""

from __future__ import annotations

import http.client
import json
import logging
import shutil
from pathlib import Path

import pytest

from digirl_lite.envs.sim import Surprises
from digirl_lite.envs.sim.serve import MAX_BODY_BYTES, SimPhoneServer
from digirl_lite.errors import ConfigError
from digirl_lite.redaction import REDACTED, is_secret_name, redact
from digirl_lite.train.config import sim_quick
from digirl_lite.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]

# -- redaction on hand-made configs ------------------------------------------------------------
SECRETS = ("S3CRET-URL", "S3CRET-ACCESS", "S3CRET-LT", "S3CRET-PW", "S3CRET-TOKEN",
           "S3CRET-JUDGE-URL", "sk-S3CRET-API", "S3CRET-QUERY")
ANDROID = {
    "devices": [
        {"server_url": "https://alice:S3CRET-URL@hub-cloud.browserstack.com/wd/hub",
         "capabilities": {"platformName": "Android",
                          "bstack:options": {"userName": "alice",
                                             "accessKey": "S3CRET-ACCESS"}}},
        {"server_url": "https://hub.lambdatest.com/wd/hub?accessKey=S3CRET-QUERY&build=7",
         "capabilities": {"lt:options": {"username": "bob", "accessKey": "S3CRET-LT"},
                          "appium:options": {"keystorePassword": "S3CRET-PW"}}},
        "http://127.0.0.1:4723",  # a bare URL, as android.devices also takes
    ],
    "options": {"settle_s": 0.0, "token": "S3CRET-TOKEN"},
    "setup": [{"key": 3}, {"tap": [540, 1200]}],  # a key code, not a credential
    "reset": "home",
}
JUDGE = {"judge": "oracle",  # the oracle reads none of it: a backend's settings, as saved
         "backend": {"backend": "openai", "model": "m", "max_tokens": 512,
                     "base_url": "https://carol:S3CRET-JUDGE-URL@judge.example.com/v1",
                     "api_key_env": "OPENAI_API_KEY", "api_key": "sk-S3CRET-API"}}


def _holds_secret(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def test_redact_url_user_info_keeps_scheme_host_port_and_path():
    assert redact("https://user:key@hub.example.com:443/wd/hub") == \
        f"https://{REDACTED}@hub.example.com:443/wd/hub"
    assert redact("http://token@10.0.0.2:4723") == f"http://{REDACTED}@10.0.0.2:4723"
    # a password with an unescaped @: everything before the host's @ goes
    assert redact("https://u:p@ss@host/x") == f"https://{REDACTED}@host/x"
    # inside a longer message (a device named in a log line), and more than one
    assert redact("device 0 (https://a:b@h1/wd) and ftp://c@h2") == \
        f"device 0 (https://{REDACTED}@h1/wd) and ftp://{REDACTED}@h2"
    for plain in ("http://127.0.0.1:4723", "https://host/path/a@b", "mailto:x@y.org",
                  "alice@example.com"):
        assert redact(plain) == plain
    # a secret query parameter keeps its name; the others are kept whole
    assert redact("https://h/wd/hub?accessKey=abc&build=7&token=t") == \
        f"https://h/wd/hub?accessKey={REDACTED}&build=7&token={REDACTED}"


@pytest.mark.parametrize("name, secret", [
    ("accessKey", True), ("api_key", True), ("apiKey", True), ("APIKey", True),
    ("apikey", True), ("browserstack.key", True), ("x-api-key", True), ("password", True),
    ("keystorePassword", True), ("token", True), ("authToken", True), ("secret", True),
    ("client_secret", True), ("Authorization", True), ("basic_auth", True), ("key", True),
    ("api_key_env", False), ("tokenEnv", False), ("max_tokens", False),
    ("max_new_tokens", False), ("eos_token_id", False), ("tokenizer", False),
    ("keyboard", False), ("unicodeKeyboard", False), ("keyAlias", False), ("udid", False),
    ("username", False), ("server_url", False), ("", False)])
def test_which_names_are_secrets(name, secret):
    assert is_secret_name(name) is secret


def test_redact_a_config_recursively_through_devices_and_capabilities():
    cfg = {"env": "android", "seed": 0, "android": ANDROID, "judge": JUDGE}
    before = json.dumps(cfg)
    out = redact(cfg)
    assert json.dumps(cfg) == before  # the input is not touched
    assert not _holds_secret(json.dumps(out))
    dev0, dev1, dev2 = out["android"]["devices"]
    assert dev0["server_url"] == f"https://{REDACTED}@hub-cloud.browserstack.com/wd/hub"
    assert dev0["capabilities"] == {"platformName": "Android", "bstack:options": {
        "userName": "alice", "accessKey": REDACTED}}
    assert dev1["server_url"] == \
        f"https://hub.lambdatest.com/wd/hub?accessKey={REDACTED}&build=7"
    assert dev1["capabilities"]["lt:options"] == {"username": "bob", "accessKey": REDACTED}
    assert dev1["capabilities"]["appium:options"] == {"keystorePassword": REDACTED}
    assert dev2 == "http://127.0.0.1:4723"
    assert out["android"]["options"] == {"settle_s": 0.0, "token": REDACTED}
    assert out["android"]["setup"] == [{"key": 3}, {"tap": [540, 1200]}]
    assert out["judge"]["backend"] == {
        "backend": "openai", "model": "m", "max_tokens": 512,
        "base_url": f"https://{REDACTED}@judge.example.com/v1",
        "api_key_env": "OPENAI_API_KEY",  # the variable's name is kept: it is no secret
        "api_key": REDACTED}
    assert redact(out) == out  # idempotent: a saved config compares with the live one


def test_redact_keeps_what_hides_nothing_and_hides_any_other_value():
    d = {"token": None, "password": "", "useToken": True, "key": 66, "secret": 1234,
         "accessKey": ["a", "b"], "credentials": {"user": "u", "pin": 1},
         "devices": ({"apiKey": "k"},)}
    assert redact(d) == {"token": None, "password": "", "useToken": True, "key": 66,
                         "secret": REDACTED, "accessKey": REDACTED, "credentials": REDACTED,
                         "devices": ({"apiKey": REDACTED},)}


# -- a real run's files ------------------------------------------------------------------------
SMALL = {"pile_size": 4, "eval_tasks": 2, "iterations": 1, "rollouts_per_iteration": 2,
         "n_envs": 2, "offline_critic_updates": 1, "critic_updates": 1,
         "offline_actor_updates": 1, "actor_updates": 1}


def _config(**kw):
    # the simulated phone runs (env "sim" reads no android section), but the config holds
    # a device farm's credentials exactly as an Android run's would, and they are saved
    return sim_quick(**{**SMALL, "android": ANDROID, "judge": JUDGE, **kw})


@pytest.fixture(scope="module")
def secret_run(tmp_path_factory):
    """A tiny run (starting policy, pile, offline phase, evaluations; no online phase) whose
    config holds credentials, and whose fleet saw a device named by a URL with user info."""
    out = tmp_path_factory.mktemp("secret_run") / "run"
    t = Trainer(_config(), out, cache_dir=None, progress=False)
    t._fleet_before = {"device_events": [  # what an earlier attempt's fleet recorded
        {"t": 0.0, "slot": 0, "event": "quarantined", "reason": "refused by hub",
         "device": "device 0 (https://alice:S3CRET-URL@hub-cloud.browserstack.com/wd/hub)"}]}
    t.log(stage="note", device=ANDROID["devices"][0]["server_url"])
    summary = t.run(online=False)
    t.close()
    return out, summary


@pytest.mark.slow
def test_a_runs_files_hold_no_credential(secret_run):
    out, _ = secret_run
    files = [p for p in out.rglob("*") if p.is_file()]
    written = {p.relative_to(out).as_posix() for p in files}
    assert {"summary.json", "metrics.jsonl", "fleet.json"} <= written
    states = sorted(out.glob("checkpoints/ckpt-*/state.json"))
    assert states, "no checkpoint was written"
    for p in files:  # every file, binary ones too
        leaked = _holds_secret(p.read_bytes().decode("latin-1"))
        assert not leaked, f"{p.relative_to(out)} holds {leaked}"
    summary = json.loads((out / "summary.json").read_text())
    for config in (summary["config"], *(json.loads(s.read_text())["config"] for s in states),
                   *(json.loads(s.read_text())["summary"]["config"] for s in states)):
        assert config["android"] == redact(ANDROID) and config["judge"] == redact(JUDGE)
        assert config["android"]["devices"][0]["server_url"] == \
            f"https://{REDACTED}@hub-cloud.browserstack.com/wd/hub"  # the host is kept
    events = summary["fleet"]["device_events"]
    assert events[0]["device"] == \
        f"device 0 (https://{REDACTED}@hub-cloud.browserstack.com/wd/hub)"
    assert "offline" in summary["stages"]  # a real run, not an empty file


@pytest.mark.slow
def test_resume_compares_the_redacted_config_and_needs_no_secret(secret_run):
    out, _ = secret_run
    again = Trainer(_config(), out, cache_dir=None, progress=False)
    assert again.load_checkpoint()  # the saved config, redacted, equals the live one
    assert again.phase == "eval:offline"
    # the credentials come from the live config: a rotated key changes nothing on disk
    rotated = json.loads(json.dumps(ANDROID))
    rotated["devices"][0]["capabilities"]["bstack:options"]["accessKey"] = "NEW-KEY"
    assert Trainer(_config(android=rotated), out, cache_dir=None,
                   progress=False).load_checkpoint()
    # what is not a secret is still compared: another hub is another run
    moved = json.loads(json.dumps(ANDROID))
    moved["devices"][0]["server_url"] = "https://alice:S3CRET-URL@elsewhere.example/wd/hub"
    with pytest.raises(ConfigError, match="android") as e:
        Trainer(_config(android=moved), out, cache_dir=None, progress=False).load_checkpoint()
    assert not _holds_secret(str(e.value))  # the refusal shows redacted values


@pytest.mark.slow
def test_a_checkpoint_saved_before_redaction_still_resumes(secret_run, tmp_path):
    out, _ = secret_run
    copy = tmp_path / "old"
    shutil.copytree(out, copy)
    root = copy / "checkpoints"
    state_path = root / (root / "latest").read_text().strip() / "state.json"
    state = json.loads(state_path.read_text())
    live = Trainer(_config(), copy, cache_dir=None, progress=False)
    state["config"] = json.loads(json.dumps(live.cfg.as_dict(), default=str))  # verbatim
    state_path.write_text(json.dumps(state))
    assert _holds_secret(state_path.read_text())
    assert live.load_checkpoint()


# -- grid result files ---------------------------------------------------------------------------
def test_grid_results_hold_no_credential_and_compare_redacted(tmp_path):
    from benchmarks import gridlib as grid
    (tmp_path / "grids").mkdir()
    (tmp_path / "grids" / "g.json").write_text(json.dumps(
        {"seeds": [0], "arms": [{"name": "a"}]}))
    job = grid.jobs_of(grid.load_spec(tmp_path / "grids" / "g.json"), runs_dir=tmp_path / "r",
                       results_dir=tmp_path / "res")[0]
    live = _config().as_dict()
    job.out.mkdir(parents=True)
    # a summary.json written before the trainer redacted: the config verbatim
    (job.out / "summary.json").write_text(json.dumps({"stages": {}, "config": live}))
    record = grid.result_record(job)
    assert not _holds_secret(json.dumps(record))
    assert record["config"] == redact(live)
    assert grid._diff_config(record["config"], live) == []  # the spec's config, live
    moved = json.loads(json.dumps(live))
    moved["android"]["devices"][0]["server_url"] = "https://alice:S3CRET-URL@elsewhere/wd"
    assert grid._diff_config(record["config"], moved) == ["android"]


# -- the served phone ------------------------------------------------------------------------------
@pytest.fixture
def phone():
    with SimPhoneServer(surprises=Surprises.none()) as server:
        yield server


def _conn(server: SimPhoneServer) -> http.client.HTTPConnection:
    host, port = server.url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=5)


def _send(server, method: str, path: str, headers: dict | list = (), body: bytes = b""
          ) -> tuple[int, dict, str, str | None]:
    """(status, parsed answer, raw answer, Connection header) of one request whose headers
    are sent exactly as given (no Content-Length added)."""
    c = _conn(server)
    try:
        c.putrequest(method, path, skip_accept_encoding=True)
        for k, v in (headers.items() if isinstance(headers, dict) else headers):
            c.putheader(k, v)
        c.endheaders(body or None)
        r = c.getresponse()
        raw = r.read().decode()
        return r.status, json.loads(raw), raw, r.getheader("Connection")
    finally:
        c.close()


def _still_serving(server) -> None:
    status, answer, _, _ = _send(server, "GET", "/status")
    assert status == 200 and answer["value"]["ready"] is True


def test_a_failure_inside_the_phone_answers_w3c_json_without_its_traceback(phone, caplog,
                                                                           monkeypatch):
    def broken(body):
        raise ZeroDivisionError("internal detail /home/secret/path.py")

    monkeypatch.setattr(phone._httpd.phone, "status", broken)
    with caplog.at_level(logging.ERROR, logger="digirl_lite.envs.sim.serve"):
        status, answer, raw, _ = _send(phone, "GET", "/status")
    assert status == 500
    assert set(answer) == {"value"}
    assert set(answer["value"]) == {"error", "message", "stacktrace"}
    assert answer["value"]["error"] == "unknown error" and answer["value"]["stacktrace"] == ""
    assert "ZeroDivisionError" in answer["value"]["message"]
    for told in ("Traceback", "serve.py", "internal detail", "/home/secret"):
        assert told not in raw
    # the traceback went to the server's log instead
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[0] is ZeroDivisionError]
    assert logged and "GET /status" in logged[0].getMessage()
    monkeypatch.undo()
    _still_serving(phone)


def test_a_body_over_the_limit_is_refused_unread_and_the_phone_goes_on(phone):
    assert MAX_BODY_BYTES == 1 << 20
    # the 2 MiB the header announces are never sent: an answer at all shows they were not read
    status, answer, _, connection = _send(
        phone, "POST", "/session",
        {"Content-Type": "application/json", "Content-Length": str(2 << 20)}, b'{"capab')
    assert status == 413 and connection == "close"
    assert answer == {"value": {"error": "invalid argument", "stacktrace": "",
                                "message": answer["value"]["message"]}}
    assert str(2 << 20) in answer["value"]["message"]
    _still_serving(phone)
    # a body within the limit is read as before
    status, answer, _, _ = _send(phone, "POST", "/session", {
        "Content-Type": "application/json", "Content-Length": "2"}, b"{}")
    assert status == 200 and answer["value"]["sessionId"]


def test_the_body_limit_is_configurable():
    body = b'{"capabilities": {}}'
    with SimPhoneServer(surprises=Surprises.none(), max_body_bytes=len(body)) as server:
        status, _, _, _ = _send(server, "POST", "/session", {
            "Content-Length": str(len(body))}, body)
        assert status == 200
        status, answer, _, _ = _send(server, "POST", "/session", {
            "Content-Length": str(len(body) + 1)}, body + b" ")
        assert status == 413 and answer["value"]["error"] == "invalid argument"
    with pytest.raises(ValueError, match="max_body_bytes"):
        SimPhoneServer(max_body_bytes=-1)


@pytest.mark.parametrize("headers", [
    [("Content-Length", "-1")], [("Content-Length", "abc")], [("Content-Length", "1_0")],
    [("Content-Length", "+2")], [("Content-Length", "99999999999999999999999")],
    [("Content-Length", "2"), ("Content-Length", "3")],
    [("Transfer-Encoding", "chunked")]])
def test_a_content_length_that_is_not_a_number_is_a_400(phone, headers):
    status, answer, raw, connection = _send(phone, "POST", "/session", headers, b"{}")
    assert status == 400 and connection == "close"
    assert answer["value"]["error"] == "invalid argument" and answer["value"]["stacktrace"] == ""
    assert "Traceback" not in raw
    _still_serving(phone)


def test_http_servers_own_refusals_are_w3c_json_too(phone):
    status, answer, raw, _ = _send(phone, "PUT", "/status", {"Content-Length": "0"})
    assert status == 501 and answer["value"]["error"] == "unknown method"
    assert "<html" not in raw.lower()
    _still_serving(phone)
