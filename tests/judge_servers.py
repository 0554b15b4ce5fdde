"""Scriptable local HTTP servers speaking the Gemini ``generateContent`` and the OpenAI chat
completions protocols, for the judge-backend tests.

Each server listens on 127.0.0.1 (an ephemeral port) in a daemon thread. A test plans its
replies with :meth:`ScriptedServer.plan` (a status and a JSON body, raw bytes for a malformed
body, or a delay that forces a client timeout); with no plan left, the server answers with its
protocol's default well-formed reply. Every request is recorded (method, path, headers, raw
and parsed body) for assertions.
"""

from __future__ import annotations

import base64
import io
import json
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from PIL import Image

__all__ = ["Planned", "Recorded", "ScriptedServer", "GeminiServer", "OpenAIServer",
           "RoutedOpenAIServer", "gemini_reply", "openai_reply", "ServerCase", "request_parts",
           "decode_png"]


@dataclass
class Planned:
    """One planned response.

    status: HTTP status; body: a JSON-able object, or ``bytes`` sent as-is (malformed bodies);
    delay_s: seconds to wait before answering (longer than the client's timeout: a timeout);
    content_type: the Content-Type header sent.
    """

    status: int = 200
    body: Any = None
    delay_s: float = 0.0
    content_type: str = "application/json"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    raw: bytes
    json: Any = None

    def header(self, name: str) -> str | None:
        for k, v in self.headers.items():
            if k.lower() == name.lower():
                return v
        return None


def gemini_reply(text: str, prompt_tokens: int = 11, reply_tokens: int = 7) -> dict:
    return {
        "candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                        "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": prompt_tokens,
                          "candidatesTokenCount": reply_tokens,
                          "totalTokenCount": prompt_tokens + reply_tokens},
        "modelVersion": "gemini-test",
    }


def gemini_error(status: int, message: str = "planned error") -> dict:
    names = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
             404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
             503: "UNAVAILABLE"}
    return {"error": {"code": status, "message": message,
                      "status": names.get(status, "UNKNOWN")}}


def openai_reply(text: str, prompt_tokens: int = 13, reply_tokens: int = 5,
                 model: str = "qwen-vl") -> dict:
    return {
        "id": "chatcmpl-test", "object": "chat.completion", "created": 1700000000,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": reply_tokens,
                  "total_tokens": prompt_tokens + reply_tokens},
    }


def openai_error(status: int, message: str = "planned error") -> dict:
    return {"error": {"message": message, "type": "planned_error", "param": None,
                      "code": str(status)}}


class ScriptedServer:
    """A threaded HTTP server answering from a queue of planned responses."""

    #: the answer when nothing is planned (a well-formed reply of the protocol)
    default_text = "Q: q\nA: a\nStatus: success"

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._answered = 0  # replies sent, once any planned delay has passed
        self._plans: deque[Planned] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def _handle(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    parsed = json.loads(raw) if raw else None
                except ValueError:
                    parsed = None
                rec = Recorded(self.command, self.path, dict(self.headers.items()), raw, parsed)
                with server._lock:
                    server.requests.append(rec)
                    plan = server._plans.popleft() if server._plans else None
                if plan is None:  # the default: a body, or a whole Planned response
                    d = server.default_body(rec)
                    plan = d if isinstance(d, Planned) else Planned(200, d)
                if plan.delay_s:
                    # wake early when the server shuts down, so teardown stays fast
                    server._stop.wait(plan.delay_s)
                body = plan.body
                if body is None:
                    body = server.default_body(rec)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                with server._lock:  # counted before the write: a client never sees the reply
                    server._answered += 1  # of a request the count does not hold yet
                try:
                    self.send_response(plan.status)
                    self.send_header("Content-Type", plan.content_type)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout) and closed the socket
                    pass

            do_POST = _handle
            do_GET = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.timeout = 5
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    # -- protocol -------------------------------------------------------------------------
    def default_body(self, rec: Recorded) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    # -- scripting ------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def plan(self, *plans: Planned) -> ScriptedServer:
        with self._lock:
            self._plans.extend(plans)
        return self

    def reply(self, text: str, **kw: Any) -> ScriptedServer:
        return self.plan(Planned(200, self.reply_body(text, **kw)))

    def error(self, status: int, message: str = "planned error") -> ScriptedServer:
        return self.plan(Planned(status, self.error_body(status, message)))

    def sleep(self, seconds: float) -> ScriptedServer:
        return self.plan(Planned(200, None, delay_s=seconds))

    def malformed(self, data: bytes = b"{not json",
                  content_type: str = "application/json") -> ScriptedServer:
        return self.plan(Planned(200, data, content_type=content_type))

    def reply_body(self, text: str, **kw: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def error_body(self, status: int, message: str) -> Any:  # pragma: no cover
        raise NotImplementedError

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._plans)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    @property
    def answered(self) -> int:
        """Replies the server has sent or is sending; a request still held by its planned
        delay is not answered yet (a client that timed out on it gave up first)."""
        with self._lock:
            return self._answered

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> ScriptedServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class GeminiServer(ScriptedServer):
    def default_body(self, rec: Recorded) -> Any:
        return gemini_reply(self.default_text)

    def reply_body(self, text: str, **kw: Any) -> Any:
        return gemini_reply(text, **kw)

    def error_body(self, status: int, message: str) -> Any:
        return gemini_error(status, message)


class OpenAIServer(ScriptedServer):
    def default_body(self, rec: Recorded) -> Any:
        return openai_reply(self.default_text)

    def reply_body(self, text: str, **kw: Any) -> Any:
        return openai_reply(text, **kw)

    def error_body(self, status: int, message: str) -> Any:
        return openai_error(status, message)


class RoutedOpenAIServer(OpenAIServer):
    """An OpenAI-protocol server that answers each request by the model it names: one
    server for a prompted agent and an LLM proposer side by side (the DarwinX loop tests).
    ``routes``: model name -> ``(request) -> reply text``; a model with no route gets a
    404, as a server that does not serve it would."""

    def __init__(self, routes: dict[str, Any]) -> None:
        super().__init__()
        self.routes = dict(routes)

    def by_model(self, model: str) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if isinstance(r.json, dict)
                    and r.json.get("model") == model]

    def default_body(self, rec: Recorded) -> Any:
        model = rec.json.get("model") if isinstance(rec.json, dict) else None
        route = self.routes.get(model)
        if route is None:
            return Planned(404, openai_error(404, f"the model {model!r} does not exist"))
        return openai_reply(route(rec), model=model)


def wait_until(pred, timeout_s: float = 2.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


# -- reading requests back ------------------------------------------------------------------
def decode_png(b64: str, urlsafe: bool = False) -> Image.Image:
    """Strict base64 (OpenAI data: URIs); ``urlsafe``: also the URL-safe alphabet, which
    protobuf JSON accepts for ``bytes`` fields and google-genai sends."""
    if urlsafe:
        b64 = b64.replace("-", "+").replace("_", "/")
    raw = base64.b64decode(b64, validate=True)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", "image bytes are not a PNG"
    im = Image.open(io.BytesIO(raw))
    im.load()
    assert im.format == "PNG"
    return im


def request_parts(kind: str, rec: Recorded) -> list:
    """The prompt as sent: ("text", str) and ("image", PIL image) in order."""
    out: list = []
    body = rec.json
    assert isinstance(body, dict), f"request body is not JSON: {rec.raw[:200]!r}"
    if kind == "gemini":
        for content in body["contents"]:
            assert content.get("role", "user") == "user"
            for p in content["parts"]:
                if "text" in p:
                    out.append(("text", p["text"]))
                else:
                    d = p.get("inlineData") or p.get("inline_data")
                    assert d is not None, f"unexpected part {sorted(p)}"
                    assert (d.get("mimeType") or d.get("mime_type")) == "image/png"
                    out.append(("image", decode_png(d["data"], urlsafe=True)))
    else:
        msgs = body["messages"]
        assert len(msgs) == 1 and msgs[0]["role"] == "user"
        for p in msgs[0]["content"]:
            if p["type"] == "text":
                out.append(("text", p["text"]))
            else:
                assert p["type"] == "image_url"
                m = re.fullmatch(r"data:image/png;base64,(.+)", p["image_url"]["url"], re.S)
                assert m, p["image_url"]["url"][:60]
                out.append(("image", decode_png(m.group(1))))
    return out


class ServerCase:
    """One protocol ("gemini" or "openai") against its local ``server``, for tests that run
    once per protocol: the key variable it reads (set to ``secret``), its base URL (or a
    dead port's), and a request's prompt read back (:func:`request_parts`). Each test file
    subclasses it with what it builds (backends, configs)."""

    def __init__(self, kind: str, server: ScriptedServer, monkeypatch, secret: str) -> None:
        self.kind = kind
        self.server = server
        self.key_env = "GEMINI_API_KEY" if kind == "gemini" else "OPENAI_API_KEY"
        monkeypatch.setenv(self.key_env, secret)

    def url(self, port: int | None = None) -> str:
        base = self.server.url if port is None else f"http://127.0.0.1:{port}"
        return base if self.kind == "gemini" else base + "/v1"

    def parts(self, rec: Recorded) -> list:
        return request_parts(self.kind, rec)
