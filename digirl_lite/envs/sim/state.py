"""The simulated phone's state: where it is, what covers the screen, and its surprises.

A frozen :class:`PhoneState` (with the :class:`Page` it shows) is all the world remembers, so
an expert can plan on a copy and a copier can keep a belief. :class:`Surprises` holds the
probabilities of a page load's surprises (:mod:`.transitions` draws them). A task's setup and
teardown are applied and checked here (:func:`apply_phase`, :func:`phase_reached`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from digirl_lite.envs.sim.tasks import N_RESULTS, SimPhase, Task, parse_task

__all__ = ["Surprises", "Page", "LAYOUTS", "PhoneState", "initial_state", "minimal_reset",
           "apply_phase", "phase_reached"]


@dataclass(frozen=True)
class Surprises:
    """Probabilities of the surprises, each drawn from the environment's seeded generator.

    Defaults are tuned so that the copier of clean demonstrations (``agents.Copier`` at its
    default slip rate) succeeds on about 15% of Web Shopping and 18% of General test tasks,
    failing mostly by not recovering from pop-ups and voice input, as the paper's AutoUI
    copier does (17.7% Web Shopping, 14.6% General).
    """

    popup: float = 0.5
    """A modal pop-up over a page when it loads: "sign up for deals" on a shop, "before you
    continue" on Google, "allow notifications?" in an app."""
    consent: float = 0.3
    """A cookie-consent banner at the bottom, on the first page of a site in an episode."""
    voice: float = 0.35
    """A tap on a search box opens voice input instead of the keyboard."""
    reorder: float = 0.25
    """A results list comes in another order (the first entry is another product)."""
    blank: float = 0.1
    """A page shows blank (white) for one step before it loads; the step's action is lost."""
    sponsored: float = 0.0
    """A sponsored row at the top of a shop's results list, drawn like a result (title,
    "Sponsored" and a price) where the first result would be, the real results one row lower.
    Tapping it opens the advertised product (another entry of the list, so a "select the
    first entry" task is not done there); BACK returns to the results without the ad (it
    shows once per search). A detour that a successful attempt can contain and recover from,
    the steps a step-level critic should grade down (issue 16, item 6: without it, successful
    attempts on this world hold almost no wasted steps). Off by default: the runs and the
    shipped starting policies of this project are on the world without it."""

    def __post_init__(self) -> None:
        for name in (f.name for f in fields(self)):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"Surprises.{name} must be a probability in [0, 1], got {p}")

    @classmethod
    def none(cls) -> Surprises:
        return cls(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)

    def scaled(self, factor: float) -> Surprises:
        """Every probability times ``factor`` (in [0, 1]): a calmer (or no) day."""
        if not 0.0 <= factor <= 1.0:
            raise ValueError(f"factor must be in [0, 1], got {factor}")
        return Surprises(*(getattr(self, f.name) * factor for f in fields(self)))


@dataclass(frozen=True)
class Page:
    """Where the phone is. ``order`` is the results' display order (catalogue indices);
    ``ad`` the catalogue index of a sponsored row's product above them (None: no ad)."""

    app: str = "launcher"
    kind: str = "launcher"
    site: str | None = None
    query: str | None = None
    item: int | None = None
    order: tuple[int, ...] = ()
    scroll: int = 0
    ad: int | None = None


LAYOUTS = ("older", "current")
"""The phone's designs of its dialogs (:attr:`PhoneState.layout`; issue 47). "older": the
layout the demonstrations were recorded on (a pop-up's X at its top right, "No thanks" below;
voice input's X at the top left; the cookie banner at the bottom). "current": today's live
phone, as AitW's recordings were older than the web DigiRL practises on: the pop-up lower on
the screen with its X at the top left, voice input's cancel at the bottom, and the cookie
banner at the top of the page, over a shop's search box (a tap there lands on the banner
until it is answered). BACK closes a pop-up and leaves voice input on both."""


@dataclass(frozen=True)
class PhoneState:
    page: Page = field(default_factory=Page)
    history: tuple[Page, ...] = ()
    focus: str | None = None
    typed: str = ""
    overlay: str | None = None  # "popup" | "consent" | "voice"
    loading: bool = False
    day: int = 1
    sites_seen: tuple[str, ...] = ()
    layout: str = "older"
    """One of :data:`LAYOUTS`: where the dialogs' buttons are."""

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")

    @property
    def clean(self) -> bool:
        """No surprise in the way (a consent banner only covers the bottom of the page)."""
        return self.overlay in (None, "consent") and not self.loading

    def task_succeeded(self, task: Any) -> bool:
        """Whether ``task`` (a :class:`~digirl_lite.envs.sim.tasks.Task` or its instruction)
        is done on this screen: what the oracle judges read
        (:class:`~digirl_lite.judge.oracle.CheckableState`)."""
        from digirl_lite.envs.sim.success import is_success  # it imports this module

        return is_success(self, task if isinstance(task, Task) else parse_task(task))


def initial_state(day: int = 1, layout: str = "older") -> PhoneState:
    """The saved phone every episode starts from: the launcher (spec section 1), with the
    dialogs of ``layout`` (:data:`LAYOUTS`)."""
    if day < 1:
        raise ValueError(f"day starts at 1, got {day}")
    return PhoneState(day=day, layout=layout)


def minimal_reset(state: PhoneState, day: int | None = None) -> PhoneState:
    """Darwin's minimal reset (spec/DARWIN.md A.2): the home screen, as HOME leaves it, with
    the state that persists kept (the sites seen: their cookie banners stay answered);
    ``day`` moves the phone to another drift day. :func:`initial_state` is the hard reset."""
    if day is not None and day < 1:
        raise ValueError(f"day starts at 1, got {day}")
    return PhoneState(day=state.day if day is None else day, sites_seen=state.sites_seen,
                      layout=state.layout)


def apply_phase(state: PhoneState, phase: SimPhase) -> PhoneState:
    """``state`` after the declarative ``phase`` (a task's setup or teardown): no gestures,
    no surprises; the page it opens has the launcher behind it (BACK returns there)."""
    seen = () if phase.forget_sites else state.sites_seen
    if phase.home:
        state = minimal_reset(state)
    state = replace(state, sites_seen=seen)
    if not phase.moves:
        return state
    if phase.app is not None:
        page = Page("chrome", "google_home") if phase.app == "chrome" else \
            Page(phase.app, "app_home")
    elif phase.site is None:
        page = Page("chrome", "google_results", query=phase.query)
    elif phase.query is None:
        page = Page("chrome", "shop_home", site=phase.site)
    else:
        order = tuple(range(N_RESULTS))
        page = Page("chrome", "shop_results", site=phase.site, query=phase.query, order=order)
        if phase.item is not None:
            page = replace(page, kind="shop_product", item=order[phase.item])
    if phase.site and phase.site not in seen:
        seen = seen + (phase.site,)
    focus = "search_box" if phase.typed is not None else None
    return PhoneState(page=page, history=(Page(),), focus=focus, typed=phase.typed or "",
                      day=state.day, sites_seen=seen, layout=state.layout)


def phase_reached(state: PhoneState, phase: SimPhase) -> bool:
    """The phase's success check: the phone is where ``phase`` puts it."""
    if phase.forget_sites and set(state.sites_seen) - ({phase.site} - {None}):
        return False
    if not phase.moves:
        return not phase.home or state.page.kind == "launcher"
    p = state.page
    if phase.app is not None:
        ok = p.app == phase.app and p.kind in ("google_home", "app_home")
    else:
        ok = p.site == phase.site and p.query == phase.query and p.item == phase.item
    if phase.typed is not None:
        ok = ok and state.focus == "search_box" and state.typed == phase.typed
    return ok and state.overlay is None and not state.loading
