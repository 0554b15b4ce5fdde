"""The simulated phone's world: its state, what is on screen where, and how actions change it.

Everything here is a pure function of a frozen :class:`PhoneState` (and, for surprises, a
seeded generator), so an expert can plan on a copy, a copier can keep a belief, and a test
can check one transition at a time. Coordinates are pixels on a 1080 x 2280 screen.

Screens: the launcher (app icons, a Google search widget), Chrome (address bar; Google home,
Google results, a web result page; the six shops, each with a home page, a search box, a
results list and product pages), and a plain home screen for every other app.

Surprises (each with a probability in :class:`Surprises`): a pop-up over a page, a consent
banner, a tap on a search box that opens voice input instead, results in another order, a
page that loads blank (white) first, a sponsored row above a shop's results (off by
default). Drift: ``day`` moves and recolours elements.

The code lives by concern in the modules beside this one, and every name is importable from
here as before: :mod:`.state` (:class:`PhoneState`, :class:`Page`, :class:`Surprises`, the
resets and a task's phases), :mod:`.drift` (the days' redesigns and the catalogue's results),
:mod:`.screen` (the layout: elements, hit tests, the UI tree, the screen in words),
:mod:`.transitions` (what a gesture does, the surprises and recoveries one brought) and
:mod:`.success` (the success predicate, the first milestone, why an episode failed).
"""

from __future__ import annotations

from digirl_lite.envs.sim.drift import (
    DRIFT_FIRST_DAY,
    DRIFT_LAST_DAY,
    drift_day,
    drift_offset,
    launcher_order,
    results_for,
)
from digirl_lite.envs.sim.screen import (
    CONTENT_TOP,
    HEIGHT,
    KEYBOARD_TOP,
    RESULT_H,
    SCROLLABLE,
    STATUS_H,
    WIDTH,
    Element,
    describe,
    find,
    hit_test,
    is_tappable,
    layout,
    max_scroll,
    ui_nodes,
)
from digirl_lite.envs.sim.state import (
    LAYOUTS,
    Page,
    PhoneState,
    Surprises,
    apply_phase,
    initial_state,
    minimal_reset,
    phase_reached,
)
from digirl_lite.envs.sim.success import (
    FAILURE_CAUSES,
    failure_cause,
    is_success,
    reached_first_milestone,
    same_query,
)
from digirl_lite.envs.sim.tasks import N_RESULTS
from digirl_lite.envs.sim.transitions import (
    RECOVERIES,
    recoveries_between,
    surprises_between,
    transition,
)

__all__ = [
    "WIDTH", "HEIGHT", "LAYOUTS", "Surprises", "Page", "PhoneState", "Element",
    "initial_state", "minimal_reset", "apply_phase", "phase_reached", "layout", "hit_test",
    "transition", "is_success", "same_query", "reached_first_milestone", "results_for",
    "surprises_between", "find", "is_tappable", "ui_nodes", "RECOVERIES",
    "recoveries_between", "FAILURE_CAUSES", "failure_cause",
    "N_RESULTS",
]
__all__ += [  # importable from here before the split too
    "STATUS_H", "CONTENT_TOP", "KEYBOARD_TOP", "RESULT_H", "SCROLLABLE", "DRIFT_FIRST_DAY",
    "DRIFT_LAST_DAY", "drift_day", "drift_offset", "launcher_order", "max_scroll",
    "describe",
]
