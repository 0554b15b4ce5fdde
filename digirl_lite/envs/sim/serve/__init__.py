"""The simulated phone as a device: one phone served over the W3C WebDriver / Appium protocol.

Why: the Android environment's own code (``AppiumDevice`` / ``AndroidEnv`` through
appium-python-client: HTTP, sessions, PNG screenshots, reconnects, fault handling) can then
be run, tested and timed without an emulator, and a seeded served phone shows the same
screens as the in-process :class:`~digirl_lite.envs.sim.env.SimPhoneEnv`::

    python -m digirl_lite.envs.sim.serve --port 0 --world webshop --seed 0
    # prints one line: digirl-sim-phone listening on http://127.0.0.1:PORT

    AndroidConfig(server_url=url, capabilities={"platformName": "Android",
                                                "appium:automationName": "UiAutomator2"})

The phone is a ``SimPhoneEnv`` whose state, surprises, faults and renderer the requests
drive through :meth:`SimPhoneEnv.apply_gesture` and :meth:`SimPhoneEnv.capture`, the same
methods its ``step`` uses; so the random draws come in ``step``'s order (crash, surprises,
latency per gesture; one blank-capture draw per screenshot, retried by the client as
``SimPhoneEnv`` retries in process) and the same seed and gestures give the same pixels.

Served (the calls of :func:`digirl_lite.envs.android.device.perform` and ``AppiumDevice`` as
appium-python-client 6 and Selenium 4 send them): ``GET /status``; ``POST /session``,
``DELETE /session/{id}``; ``GET .../screenshot`` (base64 PNG); ``GET .../source`` (the UI
tree, UiAutomator2's XML layout); ``GET .../window/rect`` and
the JSONWP ``GET .../window/{handle}/size``; ``POST .../actions`` (W3C pointer actions: a
down and up closer than ``TAP_MAX_SQUARED_PX`` is a tap, else a swipe from the down point to
the up point), ``DELETE .../actions``; the ``mobile: pressKey`` script that the client's
``press_keycode`` sends, and older clients' ``POST .../appium/device/press_keycode`` (3
HOME, 66 ENTER, 4 BACK); ``POST .../back``; ``GET .../element/active`` and
``POST .../element/{id}/value`` (typing).
Anything else is a W3C ``unknown command`` (404).

Vendor extension, through ``driver.execute_script(NAME, {...})`` (a real device has no such
thing; the environment's own judge and task set-up use it):

* ``"digirl: setTask"`` ``{"task": str | null, "seed": int | null}`` -> ``{"horizon": int,
  "task": str}``: reseed (when ``seed`` is given), set the task (null: drawn from the
  ``world``'s list, as ``SimPhoneEnv.reset(None, seed)``) and put the phone on the
  launcher of its day. An instruction the simulator does not model: ``invalid argument``.
* ``"digirl: isSuccess"`` ``{}`` -> ``{"success": bool, "reached_first_milestone": bool}``
  (``world.is_success`` on the current state; whether any state since the task was set
  reached its first milestone, ``world.reached_first_milestone``, which the evaluation's
  failure kinds read; ``invalid argument`` before any task was set).
* ``"digirl: info"`` ``{}`` -> ``{"world": str, "day": int, "seed": int | null,
  "task": str | null}``; ``seed`` is the one the generator was last seeded with.

For observers (a judge server that reads the ground truth, a dashboard), two session-less
reads that change nothing and never take the client's session:
``GET /digirl/state`` -> ``info``'s fields and ``"success"`` (null before any task),
``"session"`` (a client holds one) and ``"screenshots"`` (sent since the task was set);
``GET /digirl/state/screenshot`` -> the last screenshot sent since the task was set (base64
PNG), or null.

Where the served phone differs from the in-process one, or from a real device:

* Gestures arrive in integer pixels (``perform`` rounds); a tap lands within half a pixel
  of its in-process point, so only taps that close to an element's edge, swipes whose
  length rounds differently (the scroll moves one pixel more or less) and touch-lift pairs
  whose squared distance rounds across ``TAP_MAX_SQUARED_PX`` can differ.
* The ``blank`` surprise (a page that shows white while it loads) is near-white, so the
  client's blank-screen guard (``AndroidEnv``, spec section 4) waits and looks again; a
  second screenshot with no gesture in between shows the page loaded, as a real page would
  be by then. In process the agent sees the white page and its next action is swallowed
  while the page loads; over the wire that step is not lost.
* A crash takes the phone down for ``crash_down_s``: every request, new sessions
  included, answers HTTP 500 ``unknown error`` ("simulated device crash: ..."); it comes
  back on the launcher. ``SimPhoneEnv`` just ends the episode.
* A new session replaces the current one (Appium's ``--session-override``), so a client
  that lost its session (a crash, a killed client) can always reconnect.
* The active element is the focused field, or the screen itself when nothing has focus
  (Selenium: "the element with focus, or BODY"); typing into the screen changes nothing,
  as in process, instead of a ``no such element`` that the client would count as a lost
  device.

Every error is a W3C error object, ``{"value": {"error", "message", "stacktrace": ""}}``
with its HTTP status, and nothing else (issue 32): a bug in the phone answers 500 ``unknown
error`` naming the exception's type, its traceback goes to the server's log (the
``digirl_lite.envs.sim.serve`` logger; stderr by default), never to the client. A request
body over ``max_body_bytes`` (:data:`MAX_BODY_BYTES`) is refused with 413 before a byte of
it is read, and a ``Content-Length`` that is not one non-negative number (or a chunked body)
with 400; both close that connection (its unread body would be taken for the next request)
and the phone goes on serving.

The package, by concern: :mod:`.wire` (W3C errors, pointer actions, the script names),
:mod:`.phone` (the phone behind the protocol: routes, session, commands), :mod:`.server`
(HTTP, :class:`SimPhoneServer`), :mod:`.processes` (:func:`spawn_phones`), :mod:`.cli`
(``main``). Every name above is importable from here.
"""

from __future__ import annotations

from digirl_lite.envs.sim.serve.cli import main
from digirl_lite.envs.sim.serve.phone import encode_png
from digirl_lite.envs.sim.serve.processes import URL_LINE, PhoneProcess, spawn_phones
from digirl_lite.envs.sim.serve.server import MAX_BODY_BYTES, SimPhoneServer
from digirl_lite.envs.sim.serve.wire import (
    INFO,
    IS_SUCCESS,
    SET_TASK,
    W3CError,
    pointer_gestures,
    w3c_error,
)

__all__ = ["SimPhoneServer", "PhoneProcess", "spawn_phones", "W3CError", "w3c_error",
           "SET_TASK", "IS_SUCCESS", "INFO", "URL_LINE", "MAX_BODY_BYTES", "encode_png",
           "pointer_gestures", "main"]
