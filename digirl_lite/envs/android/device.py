"""One Android device over Appium (UiAutomator2), and the adb fallback.

:func:`perform` is the command layer: one :class:`~digirl_lite.actions.Gesture` becomes
driver calls (tap, swipe, Home/Enter keycodes 3 and 66, Back, typing into the focused
element). :class:`AppiumDevice` adds per-call timeouts and reconnects around it: a call that
fails for a transport reason reconnects (a new session) and is retried; when that fails
too the device is :class:`DeviceUnavailable`, which the environment turns into an
infrastructure truncation. :class:`Adb` types text when the focused element will not take
it: with an argument list, never a local shell, and quoted for the device's shell (``adb
shell`` joins its arguments and hands them to ``sh`` on the device).

Needs the ``android`` extra (``pip install 'digirl-lite[android]'``) for Appium.
"""

from __future__ import annotations

import base64
import io
import logging
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from digirl_lite.actions import Gesture

__all__ = ["AndroidConfig", "AppiumDevice", "Adb", "DeviceUnavailable", "DeviceRefused", "perform",
           "adb_input_text_args", "import_appium"]

log = logging.getLogger("digirl_lite.envs.android")

SWIPE_MS = 400
"""Duration of a swipe (the released code's Appium swipe used 400 ms)."""


class DeviceUnavailable(RuntimeError):
    """The device did not answer, even after reconnecting: an infrastructure failure."""


def import_appium():
    """``appium.webdriver`` and its options, or an error that names the extra to install."""
    try:
        from appium import webdriver
        from appium.options.android import UiAutomator2Options
        from appium.options.common import AppiumOptions
        from appium.webdriver.client_config import AppiumClientConfig
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the Android environment needs the Appium client: "
                          "pip install 'digirl-lite[android]'") from e
    return webdriver, UiAutomator2Options, AppiumOptions, AppiumClientConfig


@dataclass
class AndroidConfig:
    """How to reach one device.

    Attributes:
        server_url: the Appium server of this device (one server per device).
        udid: the device's adb serial, e.g. ``"emulator-5554"`` (None: the server picks).
        capabilities: extra capabilities; a ``platformName`` other than Android replaces the
            UiAutomator2 options (the tests use Appium's fake driver this way).
        call_timeout_s: limit of one HTTP call to the server.
        connect_retries: reconnect attempts before the device counts as unavailable.
        retry_wait_s: pause between attempts.
        settle_s: wait after an action before the screenshot (screens animate).
        blank_retries: retries of a blank screenshot (spec section 4: 5, ``blank_wait_s``
            apart).
        blank_wait_s: pause between blank-screen retries (5 s in the reference code).
        adb_path: adb binary for the typing fallback (None: no fallback).
        adb_timeout_s: limit of one adb call.
        ui_tree: read the page source (UiAutomator2 XML) after every screenshot, into
            ``info["ui_tree"]`` (issue 30; one more round trip a step).
    """

    server_url: str = "http://127.0.0.1:4723"
    udid: str | None = None
    capabilities: dict[str, Any] = field(default_factory=dict)
    call_timeout_s: float = 30.0
    connect_retries: int = 2
    retry_wait_s: float = 2.0
    settle_s: float = 2.0
    blank_retries: int = 5
    blank_wait_s: float = 5.0
    adb_path: str | None = None
    adb_timeout_s: float = 30.0
    ui_tree: bool = False

    def __post_init__(self) -> None:
        if self.call_timeout_s <= 0 or self.adb_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        if self.connect_retries < 0 or self.blank_retries < 0:
            raise ValueError("retries must be non-negative")


# -- adb ------------------------------------------------------------------------------------
def adb_input_text_args(text: str) -> list[str]:
    """The arguments after ``adb -s SERIAL shell`` that type ``text``.

    ``input text`` reads ``%s`` as a space, so spaces become ``%s``; the whole argument is
    then quoted for the device's ``sh``, so quotes, ``;``, ``$( )``, backticks, ``|`` and
    ``&`` arrive as characters, never as commands.
    """
    return ["input", "text", shlex.quote(text.replace(" ", "%s"))]


class Adb:
    """adb calls for one device, as argument lists (no local shell, a timeout on each).

    Args:
        adb_path: the adb binary.
        serial: the device (``-s``).
        timeout_s: limit of one call.
        run: ``subprocess.run`` (tests pass a recorder).
    """

    def __init__(self, adb_path: str, serial: str | None, timeout_s: float = 30.0,
                 run: Callable[..., Any] = subprocess.run) -> None:
        self.adb_path, self.serial, self.timeout_s, self._run = adb_path, serial, timeout_s, run

    def argv(self, *args: str) -> list[str]:
        return [self.adb_path, *(["-s", self.serial] if self.serial else []), *args]

    def __call__(self, *args: str) -> str:
        try:
            out = self._run(self.argv(*args), capture_output=True, text=True,
                            timeout=self.timeout_s, check=True)
        except (subprocess.SubprocessError, OSError) as e:
            raise DeviceUnavailable(f"adb {' '.join(args[:3])} failed: {e}"[:500]) from e
        return out.stdout

    def type_text(self, text: str) -> None:
        self("shell", *adb_input_text_args(text))

    def keyevent(self, keycode: int) -> None:
        self("shell", "input", "keyevent", str(int(keycode)))


# -- the command layer ------------------------------------------------------------------------
def perform(driver: Any, gesture: Gesture, adb: Adb | None = None) -> None:
    """Do ``gesture`` on the device behind ``driver`` (an Appium WebDriver).

    Pixels are rounded to integers; ``stop`` and ``invalid`` gestures do nothing (the
    episode logic handles them). Typing goes to the focused element; if there is none (or
    it refuses), ``adb`` types instead when given.
    """
    k = gesture.kind
    if k == "tap":
        x, y = gesture.start
        driver.tap([(round(x), round(y))])
    elif k == "swipe":
        (x0, y0), (x1, y1) = gesture.start, gesture.end
        driver.swipe(round(x0), round(y0), round(x1), round(y1), SWIPE_MS)
    elif k == "key":
        driver.press_keycode(int(gesture.keycode))
    elif k == "back":
        driver.back()
    elif k == "type":
        try:
            driver.switch_to.active_element.send_keys(gesture.text)
        except Exception as e:
            if adb is None:
                raise
            log.info("typing through adb (the focused element refused: %s)", type(e).__name__)
            adb.type_text(gesture.text)
    elif k not in ("stop", "invalid"):
        raise ValueError(f"unknown gesture kind {k!r}")


# -- the device -------------------------------------------------------------------------------
def _transport_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError, OSError]
    try:
        from selenium.common.exceptions import WebDriverException

        errors.append(WebDriverException)
    except ImportError:  # pragma: no cover
        pass
    try:
        from urllib3.exceptions import HTTPError

        errors.append(HTTPError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(errors)


class DeviceRefused(RuntimeError):
    """The device answered that it does not support a command (or refused its arguments)."""


def _is_refusal(e: BaseException) -> bool:
    """A W3C error that means "not supported / bad arguments", not a lost device."""
    names = ("UnknownMethodException", "UnknownCommandException",
             "InvalidArgumentException", "UnsupportedOperation", "JavascriptException")
    msg = str(getattr(e, "msg", "") or e).lower()
    return type(e).__name__ in names or "unknown method" in msg \
        or "unsupported operation" in msg or "invalid argument" in msg


class AppiumDevice:
    """An Appium session with timeouts and reconnects.

    Args:
        config: where the device is and how patient to be.
        connect: build the session now (else on first use).
    """

    def __init__(self, config: AndroidConfig, connect: bool = True) -> None:
        self.config = config
        self.driver: Any = None
        self.reconnects = 0
        self.sessions = 0  # sessions opened: one more than before means the old one was lost
        self._size: tuple[int, int] | None = None
        self._errors = _transport_errors()
        self.adb = Adb(config.adb_path, config.udid, config.adb_timeout_s) \
            if config.adb_path else None
        if connect:
            self.connect()

    def _options(self):
        _, UiAutomator2Options, AppiumOptions, _ = import_appium()
        caps = dict(self.config.capabilities)
        if str(caps.get("platformName", "Android")).lower() != "android":
            return AppiumOptions().load_capabilities(caps)
        opts = UiAutomator2Options()
        if self.config.udid:
            opts.udid = self.config.udid
        opts.new_command_timeout = 600
        return opts.load_capabilities(caps) if caps else opts

    def connect(self) -> None:
        """A new session (the old one is quit if it still answers)."""
        webdriver, _, _, AppiumClientConfig = import_appium()
        self.quit()
        client = AppiumClientConfig(self.config.server_url,
                                    timeout=self.config.call_timeout_s)
        self.driver = webdriver.Remote(self.config.server_url, options=self._options(),
                                       client_config=client)
        self.sessions += 1
        self._size = None

    def call(self, what: str, fn: Callable[[Any], Any]) -> Any:
        """``fn(driver)``, reconnecting and retrying after a transport failure.

        Raises:
            DeviceUnavailable: still failing after ``connect_retries`` reconnects.
        """
        last: BaseException | None = None
        for attempt in range(self.config.connect_retries + 1):
            try:
                if self.driver is None:
                    self.connect()
                return fn(self.driver)
            except self._errors as e:
                if _is_refusal(e):  # it answered: reconnecting would not change the answer
                    raise DeviceRefused(f"{what}: {self.config.server_url} refused: "
                                        f"{getattr(e, 'msg', None) or e}"[:500]) from e
                last = e
                self.driver = None
                if attempt < self.config.connect_retries:
                    log.warning("%s failed (%s); reconnecting (%d/%d)", what,
                                type(e).__name__, attempt + 1, self.config.connect_retries)
                    time.sleep(self.config.retry_wait_s)
                    self.reconnects += 1
        raise DeviceUnavailable(f"{what}: device {self.config.udid or self.config.server_url} "
                                f"unavailable after {self.config.connect_retries} reconnects: "
                                f"{type(last).__name__}: {str(last)[:300]}")

    def screenshot(self) -> Image.Image:
        png = self.call("screenshot", lambda d: d.get_screenshot_as_base64())
        return Image.open(io.BytesIO(base64.b64decode(png))).convert("RGB")

    def page_source(self) -> str:
        """The screen's UI tree as the server writes it (UiAutomator2: XML)."""
        return self.call("page source", lambda d: d.page_source)

    def window_size(self) -> tuple[int, int]:
        """(width, height) in pixels (asked once per session)."""
        if self._size is None:
            s = self.call("window size", lambda d: d.get_window_size())
            self._size = (int(s["width"]), int(s["height"]))
        return self._size

    def perform(self, gesture: Gesture) -> None:
        self.call(f"{gesture.kind} gesture", lambda d: perform(d, gesture, self.adb))

    def execute(self, script: str, args: dict[str, Any] | None = None) -> Any:
        """An Appium execute-script extension (``mobile: ...``, or the served simulated
        phone's ``digirl: setTask`` / ``digirl: isSuccess`` / ``digirl: info``).

        Raises:
            DeviceUnavailable: the device did not answer (after reconnects).
            DeviceRefused: it answered that it does not know ``script`` or refused ``args``.
        """
        return self.call(script, lambda d: d.execute_script(script, args or {}))

    def press_keys(self, keycodes: Sequence[int]) -> None:
        for code in keycodes:
            self.perform(Gesture("key", keycode=code))

    def quit(self) -> None:
        if self.driver is not None:
            try:
                self.driver.quit()
            except Exception:  # the session may already be gone with its server
                pass
        self.driver = None
