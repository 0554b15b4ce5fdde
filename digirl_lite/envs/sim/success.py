"""Ground truth on the simulated phone: is a task done on a state (:func:`is_success`), did
the episode reach its first milestone, and if not done, why (:func:`failure_cause`).

These read the state as seen on screen; the environment reports them in ``info``, so no
evaluation or agent holds simulator code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from digirl_lite.envs.sim.catalog import SITES
from digirl_lite.envs.sim.state import PhoneState

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.envs.sim.tasks import Task

__all__ = ["FAILURE_CAUSES", "failure_cause", "reached_first_milestone", "same_query",
           "is_success"]


FAILURE_CAUSES = ("popup_not_closed", "voice_not_left", "blank_page", "mistyped",
                  "wrong_result", "wrong_place", "stopped_early", "stuck")
"""Why an episode that did not succeed failed, from the phone's last state
(:func:`failure_cause`): the decisions (a pop-up not closed, voice input not left, the wrong
result opened, stopping too early, wandering or stuck) against mistyped text."""


def failure_cause(state: PhoneState, task: Task, typed: tuple[str, ...] = (),
                  stopped: bool = False) -> str | None:
    """Why ``task`` is not done on ``state`` (None when it is): the phone's last state,
    ``typed`` every query the episode submitted, ``stopped`` whether the agent ended the
    episode itself. Checked in this order: an overlay still up (a pop-up, voice input), a
    blank page, a submitted query that is not the task's (mistyped: a wrong product or a
    cut span), a product page that is not the first entry (an ad's or another row's), the
    agent's own stop, a page that is not the task's site (or app), else stuck."""
    from digirl_lite.envs.sim.tasks import normalize_query

    if is_success(state, task):
        return None
    if state.overlay == "popup":
        return "popup_not_closed"
    if state.overlay == "voice":
        return "voice_not_left"
    if state.loading:
        return "blank_page"
    sites = {SITES[s].domain for s in SITES}
    if task.query and any(not same_query(q, task) and normalize_query(q) not in sites
                          for q in typed):
        return "mistyped"
    p = state.page
    if task.kind == "webshop" and p.site == task.site and p.kind == "shop_product":
        return "wrong_result"
    if stopped:
        return "stopped_early"
    if not reached_first_milestone(state, task):
        return "wrong_place"
    return "stuck"


# ---------------------------------------------------------------------------------------
# Ground truth
# ---------------------------------------------------------------------------------------
def reached_first_milestone(state: PhoneState, task: Task) -> bool:
    """Is ``state`` at the task's first milestone: the shop's site (Web Shopping), Google's
    results or a result opened from them (search), the app (open app)? An episode that
    never got there failed as "never_reached_site" (``digirl_lite.train.evaluate``); the
    environment answers it (``info["reached_first_milestone"]``), so the evaluation holds
    no simulator code (issue 32)."""
    p = state.page
    if task.kind == "webshop":
        return p.site == task.site
    if task.kind == "search":
        return p.kind in ("google_results", "web_result")
    return p.app == task.app


def same_query(typed: str, task: Task) -> bool:
    """Does the query ``typed`` ask what ``task`` asks? A General search: the same content
    words (:func:`~digirl_lite.envs.sim.phrasings.general_content_words`, the words less
    question words, articles and asking verbs), which is how the held-out phrasings define
    the same search and how a judge reading the results page reads it: "look up the capital
    of Croatia" and "What is the capital of Croatia?" ask the same. Web Shopping: the same
    words (:func:`~digirl_lite.envs.sim.tasks.normalize_query`), since a shop's results
    depend on every word."""
    from digirl_lite.envs.sim.tasks import normalize_query

    if task.kind == "search":
        from digirl_lite.envs.sim.phrasings import general_content_words

        return general_content_words(typed) == general_content_words(task.query or "")
    return normalize_query(typed) == normalize_query(task.query or "")


def is_success(state: PhoneState, task: Task) -> bool:
    """The task's success predicate on the simulator's state, as seen on screen.

    Web Shopping: level 1, any page of the right site; level 2, that site's results for the
    task's query; level 3, the product page of the first entry of those results (as
    displayed). Search: Google's results for a query with the task's content words
    (:func:`same_query`), or a result opened from them. Open app: that app in the
    foreground. Nothing counts while a pop-up, voice input or a blank page hides the screen.
    """
    if state.loading or state.overlay in ("popup", "voice"):
        return False
    p = state.page
    if task.kind == "open_app":
        return p.app == task.app
    if task.kind == "search":
        return p.kind in ("google_results", "web_result") and same_query(p.query or "", task)
    if task.kind == "webshop":
        if p.site != task.site:
            return False
        if task.level == 1:
            return True
        same = same_query(p.query or "", task)
        if task.level == 2:
            return p.kind == "shop_results" and same
        return (p.kind == "shop_product" and same and bool(p.order)
                and p.item == p.order[0])
    raise ValueError(f"unknown task kind {task.kind!r}")
