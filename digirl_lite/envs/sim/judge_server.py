"""A judge server for served simulated phones: the OpenAI chat-completions protocol, verdicts
from the phones' own success checks, and faults on demand (issue 29's chaos run).

Why: the paper's judge over an OpenAI-compatible endpoint is the real path of a device
fleet (its retries, backoff, probe and stop rules), but a VLM behind it is slow, costly and
noisy. This server answers that path's requests as an always-right judge would, so a run
over served phones exercises every line of it with rewards as good as the environment's
own check, and it can drop, fail, delay or refuse requests to rehearse a judge's faults::

    python -m digirl_lite.envs.sim.judge_server --port 0 --phones URL1 URL2 ...
    # prints one line: digirl-truth-judge listening on http://127.0.0.1:PORT
    # judge config: {"judge": "paper", "backend": {"backend": "openai", "model": "truth",
    #                "base_url": "http://127.0.0.1:PORT/v1", "api_key_env": null}}

Each request is :class:`~digirl_lite.judge.paper.PaperJudge`'s prompt
(:func:`~digirl_lite.judge.paper.build_prompt_parts`): the task is read from its last text
part ("Task: ..."), the screenshot from its last image. The server asks every phone what it
is doing (``GET /digirl/state``, which takes no session and changes nothing); of the phones
on that task, the one whose last screenshot (``GET /digirl/state/screenshot``, shrunk as the
judge shrinks it) is the request's image gives the verdict, from its ``is_success``. The
screen is always compared, even when one phone is on the task: the request's own phone may
be down and another on the same task answer. A request no phone can be found for (its phone
is down, or moved on) is answered HTTP 503: a judge fault, never a guessed verdict. The
shipped example screen that :func:`~digirl_lite.envs.judges.probe_judge` sends gets a
well-formed "failure".

Faults (:class:`JudgeFaults`, changeable while serving): ``drop`` (share of requests whose
connection is closed with no answer), ``error`` (share answered HTTP 503), ``delay`` (share
held ``delay_s`` seconds first: past the client's timeout, a timeout), ``latency_s`` (added
to every answer); :meth:`TruthJudgeServer.down` closes the listening socket (connections are
refused) until :meth:`TruthJudgeServer.up`. Every answer is counted in :attr:`counts`.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import random
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from PIL import Image

__all__ = ["JudgeFaults", "TruthJudgeServer", "URL_LINE", "main"]

URL_LINE = "digirl-truth-judge listening on "
_TASK_RE = re.compile(r"Task: (.*?)\n", re.S)
_MATCH_MAE = 2.0  # mean absolute pixel difference under which two screens are the same


@dataclass
class JudgeFaults:
    """Which faults the server injects (shares of requests, drawn independently)."""

    drop: float = 0.0
    error: float = 0.0
    delay: float = 0.0
    delay_s: float = 5.0
    latency_s: float = 0.0


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A dropped connection (an injected fault, a client that gave up) is no news."""


def _reply(text: str, model: str) -> dict:
    return {"id": "chatcmpl-truth", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}


def _decode(b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")


def _read_request(body: Any) -> tuple[str, Image.Image]:
    """The task and the screenshot of a PaperJudge request; ValueError when it is not one."""
    try:
        content = body["messages"][-1]["content"]
        texts = [p["text"] for p in content if p.get("type") == "text"]
        urls = [p["image_url"]["url"] for p in content if p.get("type") == "image_url"]
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ValueError("not a chat completion request with text and image parts") from None
    m = _TASK_RE.search(texts[-1] + "\n") if texts else None
    if m is None or not urls or "base64," not in urls[-1]:
        raise ValueError("no 'Task: ...' text part or no base64 image in the request")
    return m.group(1).strip(), _decode(urls[-1].split("base64,", 1)[1])


class TruthJudgeServer:
    """The server (in a thread of this process). ``phones``: the served phones' URLs (the
    list may be changed while serving, e.g. a phone restarted on another port)."""

    def __init__(self, phones: Sequence[str], port: int = 0, host: str = "127.0.0.1",
                 faults: JudgeFaults | None = None, judge_width: int | None = 270,
                 seed: int = 0, phone_timeout_s: float = 5.0, model: str = "truth") -> None:
        self.phones = list(phones)
        self.host, self.port = host, port
        self.faults = faults or JudgeFaults()
        self.judge_width, self.model = judge_width, model
        self.phone_timeout_s = phone_timeout_s
        self.counts: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._probe_task: str | None = None
        self._connections: set[Any] = set()

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def is_up(self) -> bool:
        return self._httpd is not None

    def up(self) -> TruthJudgeServer:
        """Listen (again, on the same port once it had one)."""
        if self._httpd is not None:
            return self
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with server._lock:
                    server._connections.add(self.connection)

            def finish(self) -> None:
                with server._lock:
                    server._connections.discard(self.connection)
                super().finish()

            def do_POST(self) -> None:  # noqa: N802 - the name http.server dispatches to
                server._handle(self)

            def do_GET(self) -> None:  # noqa: N802
                server._send(self, 404, {"error": {"message": "POST /v1/chat/completions"}})

        httpd = _QuietServer((self.host, self.port), Handler)
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def down(self) -> None:
        """Stop listening and end the open connections: every request fails (refused, or
        its connection closed) until :meth:`up`."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
            with self._lock:
                conns = list(self._connections)
            for c in conns:  # kept-alive connections would still be served
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.counts["outages"] += 1

    close = down

    def __enter__(self) -> TruthJudgeServer:
        return self.up()

    def __exit__(self, *exc: Any) -> None:
        self.down()

    # -- answering ------------------------------------------------------------------------
    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def _draw(self) -> float:
        with self._lock:
            return self._rng.random()

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
        except OSError:  # the client gave up (a timeout) and closed the socket
            pass

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        raw = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        f = self.faults
        if f.latency_s:
            time.sleep(f.latency_s)
        if f.drop and self._draw() < f.drop:
            self._count("dropped")
            handler.close_connection = True
            try:  # no answer at all: the client sees the connection end
                handler.connection.shutdown(2)
            except OSError:
                pass
            return
        if f.error and self._draw() < f.error:
            self._count("errors")
            return self._send(handler, 503, {"error": {"message": "injected fault: the "
                                                       "judge is overloaded"}})
        if f.delay and self._draw() < f.delay:
            self._count("delayed")
            time.sleep(f.delay_s)
        if not handler.path.rstrip("/").endswith("/chat/completions"):
            return self._send(handler, 404, {"error": {"message": f"no route {handler.path}"}})
        try:
            task, image = _read_request(json.loads(raw))
        except ValueError as e:
            self._count("bad_requests")
            return self._send(handler, 400, {"error": {"message": str(e)}})
        verdict, why = self.verdict(task, image)
        if verdict is None:
            self._count("unplaced")
            return self._send(handler, 503, {"error": {"message": f"no phone shows this "
                                                       f"screen for {task!r}: {why}"}})
        self._count(verdict)
        text = (f"Q: What should I expect to see on the screenshot if I've done: {task}?\n"
                f"A: The phone's own check says {verdict}.\nStatus: {verdict}")
        self._send(handler, 200, _reply(text, self.model))

    def _get(self, url: str) -> Any:
        with urllib.request.urlopen(url, timeout=self.phone_timeout_s) as r:
            return json.loads(r.read())["value"]

    def _states(self) -> list[tuple[str, dict]]:
        out = []
        for url in list(self.phones):
            try:
                out.append((url, self._get(f"{url}/digirl/state")))
            except (OSError, ValueError, KeyError, urllib.error.URLError):
                continue  # a phone that is down holds no request's answer
        return out

    def verdict(self, task: str, image: Image.Image) -> tuple[str | None, str]:
        """``("success" | "failure", "")`` for the phone that shows ``image`` on ``task``,
        else ``(None, why)``."""
        on_task = [(u, s) for u, s in self._states() if s.get("task") == task
                   and s.get("success") is not None and s.get("screenshots")]
        if not on_task:
            if task == self.probe_task:
                return "failure", ""
            return None, "no phone that answers is on this task"
        want = np.asarray(image, dtype=np.int16)
        for url, state in on_task:
            try:
                png = self._get(f"{url}/digirl/state/screenshot")
            except (OSError, ValueError, KeyError, urllib.error.URLError):
                continue
            if png is None:
                continue
            shown = _decode(png)
            if self.judge_width is not None and shown.width > self.judge_width:
                h = round(shown.height * self.judge_width / shown.width)
                shown = shown.resize((self.judge_width, h), Image.BILINEAR)
            got = np.asarray(shown, dtype=np.int16)
            if got.shape == want.shape and np.abs(got - want).mean() < _MATCH_MAE:
                return ("success" if state["success"] else "failure"), ""
        return None, f"{len(on_task)} phones are on this task and none shows this screen"

    @property
    def probe_task(self) -> str:
        """The task of the shipped example screen the judge's probe sends."""
        if self._probe_task is None:
            from digirl_lite.judge.paper import FewShotSet
            from digirl_lite.paths import data_dir

            self._probe_task = FewShotSet.load(
                data_dir() / "judge_examples" / "webshop").examples[0].task
        return self._probe_task


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m digirl_lite.envs.sim.judge_server",
                                 description="Serve an always-right judge for served "
                                             "simulated phones (OpenAI chat protocol).")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--phones", nargs="+", required=True, help="the served phones' URLs")
    ap.add_argument("--judge-width", type=int, default=270)
    a = ap.parse_args(argv)
    server = TruthJudgeServer(a.phones, port=a.port, host=a.host,
                              judge_width=a.judge_width).up()
    print(f"{URL_LINE}{server.url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.down()


if __name__ == "__main__":
    main()
