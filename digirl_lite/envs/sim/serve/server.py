"""The phone over HTTP: :class:`SimPhoneServer` answers the WebDriver / Appium requests of
one simulated phone in this process, every answer and every error a W3C JSON object
(:mod:`digirl_lite.envs.sim.serve` has the protocol's whole story)."""

from __future__ import annotations

import json
import logging
import re
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from digirl_lite.envs.sim.env import Faults, SimPhoneEnv
from digirl_lite.envs.sim.serve.phone import CRASH_DOWN_S, _Phone
from digirl_lite.envs.sim.serve.wire import W3CError, w3c_error
from digirl_lite.envs.sim.world import HEIGHT, WIDTH, Surprises

__all__ = ["SimPhoneServer", "MAX_BODY_BYTES"]

MAX_BODY_BYTES = 1 << 20
"""The largest request body the phone reads (1 MiB): the largest a client sends, a typed
text or a W3C action chain, is a few kB; a larger ``Content-Length`` is refused (413)
before the body is read, so a client cannot make the phone hold gigabytes."""

log = logging.getLogger("digirl_lite.envs.sim.serve")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client pools its connections
    disable_nagle_algorithm = True  # no 40 ms delayed-ACK stall between header and body
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        super().finish()

    def do_GET(self) -> None:  # noqa: N802 - the names http.server dispatches to
        self._answer("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._answer("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._answer("DELETE")

    def _answer(self, method: str) -> None:
        try:
            body = self._body()
            path = urlsplit(self.path).path.rstrip("/") or "/"
            status, payload = 200, {"value": self.server.phone.handle(method, path, body)}
        except W3CError as e:
            status, payload = e.status, w3c_error(e.error, e.message)
        except Exception as e:  # a bug must reach the client as a W3C error, not a hang
            # the traceback to the phone's log only: it is no business of the client's
            log.exception("simulated phone: %s %s failed", method, self.path)
            status, payload = 500, w3c_error("unknown error", f"the simulated phone failed "
                                             f"({type(e).__name__}); its log has the details")
        self._send(status, payload)

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache")
        if self.close_connection:  # a body left unread: the next bytes are not a request
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, headers too long, a method
        with no ``do_`` handler) as W3C errors too, not its HTML page."""
        error = ("unknown method" if code == 501 else "invalid argument" if code < 500
                 else "unknown error")
        self.close_connection = True
        self._send(code, w3c_error(error, message or explain or self.responses.get(
            code, ("error",))[0]))

    def _content_length(self) -> int:
        """The body's length in bytes, checked before any of it is read: refused (the
        connection closed) when it is not one non-negative number, the body is chunked, or
        it is over the server's ``max_body_bytes``."""
        values = [v.strip() for v in self.headers.get_all("Content-Length") or []]
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            self.close_connection = True
            raise W3CError("invalid argument", "chunked request bodies are not supported: "
                                               "send a Content-Length")
        if not values:
            return 0
        if len(set(values)) > 1 or not re.fullmatch(r"[0-9]{1,19}", values[0]):
            self.close_connection = True
            shown = ", ".join(repr(v[:40]) for v in values)
            raise W3CError("invalid argument", f"Content-Length must be one non-negative "
                                               f"integer, got {shown}")
        n, limit = int(values[0]), self.server.max_body_bytes
        if n > limit:
            self.close_connection = True
            raise W3CError("invalid argument", f"request body of {n} bytes refused: the "
                                               f"limit is {limit} bytes", status=413)
        return n

    def _body(self) -> dict:
        raw = self.rfile.read(self._content_length())
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise W3CError("invalid argument", f"the request body is not JSON: {e}") from e
        if not isinstance(body, dict):
            raise W3CError("invalid argument", "the request body must be a JSON object")
        return body

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a fleet's phones answer thousands of requests a minute."""


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # close() ends the kept-alive connections itself

    def __init__(self, address: tuple[str, int], phone: _Phone,
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.phone = phone
        self.max_body_bytes = max_body_bytes
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer (killed, timed out) is not news."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class SimPhoneServer:
    """One simulated phone on ``http://host:port`` (in this process).

    Args:
        port: TCP port (0: a free one; see :attr:`url`).
        host: address to bind (loopback by default: the protocol has no authentication).
        world: ``SimPhoneEnv``'s task list (``"webshop"``, ``"general"``, their ``_test``
            lists or a task file): where ``setTask`` without a task draws from.
        seed: seeds the phone's generator (surprises, faults) until ``setTask`` reseeds it.
        day: drift day (1 = the layout demonstrations were recorded on).
        surprises, faults: :class:`Surprises` / :class:`Faults` or dicts of their fields.
        crash_down_s: how long a crashed phone answers only errors.
        width, height: screenshot size (the gesture space stays 1080 x 2280).
        screen_cache: screens kept drawn and encoded (as ``SimPhoneEnv``'s render cache).
        max_body_bytes: the largest request body read; a larger one is refused (413)
            unread.
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", world: str = "webshop",
                 seed: int | None = 0, day: int = 1,
                 surprises: Surprises | dict | None = None, faults: Faults | dict | None = None,
                 crash_down_s: float = CRASH_DOWN_S, width: int = WIDTH, height: int = HEIGHT,
                 screen_cache: int = 8, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        if crash_down_s < 0:
            raise ValueError(f"crash_down_s must be non-negative, got {crash_down_s}")
        if max_body_bytes < 0:
            raise ValueError(f"max_body_bytes must be non-negative, got {max_body_bytes}")
        env = SimPhoneEnv(world, day=day, surprises=surprises, faults=faults, seed=seed,
                          width=width, height=height, render_cache=screen_cache)
        phone = _Phone(env, world, seed, crash_down_s, screen_cache)
        self._httpd = _HTTPServer((host, port), phone, max_body_bytes)
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        """Answer requests in this thread until :meth:`close` (from another thread)."""
        self._httpd.serve_forever(poll_interval=0.05)

    def start(self) -> SimPhoneServer:
        """Serve in a daemon thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.serve_forever, daemon=True,
                                            name=f"digirl-sim-phone {self.url}")
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and drop every open connection (clients see a lost device)."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
        with self._httpd.connections_lock:
            for conn in list(self._httpd.connections):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:  # already closed by the client
                    pass
        self._httpd.server_close()

    def __enter__(self) -> SimPhoneServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
