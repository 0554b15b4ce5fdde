"""Task instructions as people write them, parsed into what the simulated phone can check.

The DigiRL paper (Section 5) trains and evaluates on two subsets of Android in the Wild (AitW):

* **Web Shopping** - three levels of one instruction, e.g. ``Go to costco.com`` (level 1),
  ``Go to costco.com, search for "bose soundsport free"`` (level 2) and ``..., and select the
  first entry`` (level 3). Horizon H = 20.
* **General** - questions answered by searching Google, opening apps, and much the simulator
  does not model (installing apps, alarms, media, app settings). Horizon H = 10.

``parse_task`` turns one instruction into a :class:`Task` or raises
:class:`UnsupportedTaskError` naming what is not simulated; ``load_tasks`` does that for a task
file (one instruction per line, the layout of the reference code's ``*_tasks.txt`` lists).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from digirl_lite.envs.sim.catalog import APPS, SITES, app_from_name, site_from_domain

__all__ = [
    "UnsupportedTaskError",
    "SimPhase",
    "Task",
    "KINDS",
    "parse_task",
    "normalize_query",
    "load_task_file",
    "load_tasks",
    "task_with_phases",
]

KINDS = ("webshop", "search", "open_app")

# DigiRL paper, Section 5 / Appendix: Web Shopping H = 20, General H = 10.
WEBSHOP_HORIZON = 20
GENERAL_HORIZON = 10


class UnsupportedTaskError(ValueError):
    """A well-formed instruction the simulator does not model; the message says what."""


N_RESULTS = 8  # rows of a results list (world.N_RESULTS; world imports this module)


@dataclass(frozen=True)
class SimPhase:
    """A declarative setup or teardown of the simulated phone (spec/DARWIN.md A.3): where
    the phone is put, directly, without gestures or surprises
    (:func:`digirl_lite.envs.sim.world.apply_phase`).

    All fields optional; an empty phase leaves the phone where it is.

    Attributes:
        app: open this app (a key of ``catalog.APPS``; ``"chrome"``: Google's home page).
        site: open this shop's home page in Chrome (its cookie banner already answered).
        query: with ``site``, that shop's results for ``query``; without, Google's results.
        item: with ``site`` and ``query``, the product page of that result row (0-based).
        typed: text typed into the page's search box, the keyboard open, not submitted.
        forget_sites: clear the sites seen (their cookie banners show again), as clearing
            Chrome's data does; applied first.
        home: go to the home screen (state kept), before the rest.
    """

    app: str | None = None
    site: str | None = None
    query: str | None = None
    item: int | None = None
    typed: str | None = None
    forget_sites: bool = False
    home: bool = False

    def __post_init__(self) -> None:
        if self.app is not None and self.app not in APPS:
            raise ValueError(f"SimPhase.app {self.app!r} is not a key of catalog.APPS")
        if self.site is not None and self.site not in SITES:
            raise ValueError(f"SimPhase.site {self.site!r} is not a key of catalog.SITES")
        if self.app is not None and (self.site or self.query):
            raise ValueError("SimPhase: an app, or a site / a Google query, not both")
        if self.query is not None and not self.query.strip():
            raise ValueError("SimPhase.query is empty")
        if self.item is not None and (self.site is None or self.query is None
                                      or not 0 <= self.item < N_RESULTS):
            raise ValueError(f"SimPhase.item {self.item!r}: a result row in 0..{N_RESULTS - 1}"
                             f" of a shop's results (needs site and query)")
        if self.typed is not None and (self.item is not None or not (
                self.site or self.query or self.app == "chrome")):
            raise ValueError("SimPhase.typed needs a page with a search box (chrome, a site "
                             "or results)")

    @property
    def moves(self) -> bool:
        """Whether this phase puts the phone on a page (else it only resets or forgets)."""
        return bool(self.app or self.site or self.query)

    @classmethod
    def from_dict(cls, d: Any, where: str = "phase") -> SimPhase:
        if isinstance(d, SimPhase):
            return d
        if not isinstance(d, dict):
            raise ValueError(f"{where}: a JSON object of SimPhase fields, got {d!r}")
        try:
            return cls(**d)
        except TypeError as e:
            raise ValueError(f"{where}: {e}") from None
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


@dataclass(frozen=True)
class Task:
    """One parsed instruction.

    Attributes:
        text: the instruction exactly as given.
        kind: ``"webshop"``, ``"search"`` or ``"open_app"``.
        level: Web Shopping level (1: go to the site, 2: and search, 3: and select the first
            entry); 0 for other kinds.
        site: Web Shopping site, a key of ``catalog.SITES``; None otherwise.
        query: Web Shopping (level >= 2): the product as written, quotes stripped; search: the
            text to type into Google; None otherwise.
        app: ``open_app``: a key of ``catalog.APPS``; None otherwise.
        setup: where the phone is put before the agent's first observation (None: the
            home screen); :mod:`digirl_lite.envs.lifecycle`.
        teardown: applied after the episode (None: nothing).
    """

    text: str
    kind: str
    level: int = 0
    site: str | None = None
    query: str | None = None
    app: str | None = None
    setup: SimPhase | None = None
    teardown: SimPhase | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "webshop":
            if self.level not in (1, 2, 3):
                raise ValueError(f"webshop level must be 1, 2 or 3, got {self.level}")
            if self.site not in SITES:
                raise ValueError(f"site {self.site!r} is not a key of catalog.SITES")
            if (self.query is None) != (self.level == 1):
                raise ValueError(f"webshop level {self.level} with query {self.query!r}")
            if self.app is not None:
                raise ValueError("a webshop task has no app")
        else:
            if self.level != 0 or self.site is not None:
                raise ValueError(f"a {self.kind} task has level 0 and no site")
            if self.kind == "search" and (not self.query or self.app is not None):
                raise ValueError("a search task has a non-empty query and no app")
            if self.kind == "open_app" and (self.app not in APPS or self.query is not None):
                raise ValueError(f"app {self.app!r} is not a key of catalog.APPS")

    @property
    def horizon(self) -> int:
        """Step budget H: 20 for Web Shopping, 10 for General (DigiRL paper, Section 5)."""
        return WEBSHOP_HORIZON if self.kind == "webshop" else GENERAL_HORIZON


# --------------------------------------------------------------------------------------------
# Web Shopping
# --------------------------------------------------------------------------------------------

_GO_TO = re.compile(r"^go\s*to\s+(?P<domain>[^\s,;]+)(?P<rest>.*)$", re.I | re.S)
_SEARCH = re.compile(r"^\s*[,;]?\s*(?:and\s+)?(?:then\s+)?search\s*for\b\s*(?P<product>.*)$",
                     re.I | re.S)
# "and select the first entry" and the ways people say it.
_SELECT = (
    r"(?:select|click|click\s+on|tap|tap\s+on|open|choose|pick|go\s+with|grab)\s+"
    r"(?:the\s+)?(?:first|top|1st)\s+(?:entry|item|result|product|listing|one|link|hit|option|"
    r"match)"
)
_TAIL_L3 = re.compile(rf"^\s*[,;]?\s*(?:and\s+)?(?:then\s+)?{_SELECT}\s*[.!]?\s*$", re.I | re.S)
_TAIL_L2 = re.compile(r"^\s*[.!]?\s*$", re.S)
# Opening quote -> the characters that may close it (people and autocorrect mix them).
_QUOTES = {'"': '"”', "'": "'’", "“": "”\"", "‘": "’'", "”": "”\"", "’": "’'"}
_UNQUOTED = re.compile(
    rf"^(?P<product>.*?)(?P<select>\s*[,;]?\s*(?:and\s+)?(?:then\s+)?{_SELECT})?\s*[.!]?\s*$",
    re.I | re.S,
)


def _supported_domains() -> str:
    return ", ".join(s.domain for s in SITES.values())


def _parse_webshop(text: str, m: re.Match[str]) -> Task:
    raw_domain = m.group("domain")
    rest = m.group("rest")
    domain = raw_domain.rstrip(".!")
    site = site_from_domain(domain)
    if site is None:
        # Name the whole destination ("the settings", not "the").
        where = re.split(r"\s*[,;]\s*|\s+and\s+", (raw_domain + rest).strip(), maxsplit=1)[0]
        raise UnsupportedTaskError(
            f"site {where.rstrip('.!')!r} is not one of {_supported_domains()} (in {text!r})"
        )
    if _TAIL_L2.match(rest):
        return Task(text, "webshop", level=1, site=site)
    s = _SEARCH.match(rest)
    if s is None:
        raise UnsupportedTaskError(
            f"only going to a site, searching it and selecting the first entry are simulated; "
            f"not {rest.strip(' ,')!r} (in {text!r})"
        )
    product = s.group("product")
    if product[:1] in _QUOTES:
        closers = _QUOTES[product[0]]
        # The tail after the closing quote never holds a quote, so the closing quote is the
        # last quote of the clause: products may hold quotes of their own (men's 13" laptop).
        end = max(product.rfind(c) for c in closers)
        if end <= 0:
            raise ValueError(f"unclosed quote in search query of {text!r}")
        query = product[1:end].strip()
        tail = product[end + 1:]
        if _TAIL_L2.match(tail):
            level = 2
        elif _TAIL_L3.match(tail):
            level = 3
        else:
            raise UnsupportedTaskError(
                f"only going to a site, searching it and selecting the first entry are "
                f"simulated; not {tail.strip(' ,')!r} (in {text!r})"
            )
    else:
        u = _UNQUOTED.match(product)
        assert u is not None  # the pattern matches any string
        query = u.group("product").strip()
        level = 3 if u.group("select") else 2
    if not query:
        raise ValueError(f"empty search query in {text!r}")
    return Task(text, "webshop", level=level, site=site, query=query)


# Web Shopping as people phrase it apart from AitW's "Go to <site>, search for ..." (issue 32,
# item 5): "look up sony wh-1000xm4 on costco.com and open the top result", "take me to
# ebay.com", "search walmart.com for 'fire 7'", "at bestbuy.com, find me a ... then pick the
# first one", lower case, and a typo in the words around the product ("serach", "frist").
_DOMAIN = (r"(?P<domain>(?:https?://)?(?:www\.)?[a-z0-9][a-z0-9-]*(?:\.[a-z0-9-]+)*"
           r"\.(?:com|net|org|io|us|co\.uk)/?)")
_HAS_DOMAIN = re.compile(rf"(?:^|[\s,;:]){_DOMAIN}(?=$|[\s,;:.!?])", re.I)
_PRE = r"^(?:(?:hey|ok|okay)[,\s]+)?(?:(?:please|pls|can\s+you|could\s+you|would\s+you)\s+)?"
_VISIT = (r"(?:take\s+me\s+to|pull\s+up|bring\s+up|visit|open(?:\s+up)?|go\s*to|head\s+"
          r"(?:over\s+)?to|navigate\s+to|i\s+want\s+to\s+go\s+to|get\s+me\s+to)")
_FIND = (r"(?:look\s*up|look\s+for|search\s+for|search|find(?:\s+me)?|shop\s+for|"
         r"i\s+need|i\s+want|i(?:['’]m|\s+am)\s+looking\s+for|get\s+me|show\s+me|check)")
_TAIL = rf"(?P<select>\s*[,;]?\s*(?:and\s+)?(?:then\s+)?{_SELECT})?\s*[.!?]?$"
_FREE_L1 = re.compile(rf"{_PRE}{_VISIT}\s+(?:the\s+)?{_DOMAIN}"
                      r"(?:\s+(?:please|pls|now|for\s+me))?\s*[.!?]?$", re.I | re.S)
_FREE_L23 = tuple(re.compile(p, re.I | re.S) for p in (
    # look up <product> on <site> [and open the first result]
    rf"{_PRE}{_FIND}\s+(?P<product>.+?)\s*,?\s+(?:on|at|from|in|over\s+at|via)\s+{_DOMAIN}"
    rf"{_TAIL}",
    # at <site>, look up <product> ...
    rf"{_PRE}(?:on|at|over\s+at)\s+{_DOMAIN}\s*[,:;]?\s*(?:please\s+)?{_FIND}\s+"
    rf"(?P<product>.+?){_TAIL}",
    # search <site> for <product> ...
    rf"{_PRE}search\s+{_DOMAIN}\s+for\s+(?P<product>.+?){_TAIL}",
    # open <site> and look up <product> ...
    rf"{_PRE}{_VISIT}\s+{_DOMAIN}\s*[,;]?\s*(?:and\s+|then\s+|and\s+then\s+)?{_FIND}\s+"
    rf"(?P<product>.+?){_TAIL}",
))
_ARTICLE = re.compile(r"^(?:a|an|the|some)\s+", re.I)
# The words around a product that a typo may hit; a word of 4+ letters one edit (insert,
# delete, substitute, swap two neighbours) from one of these is read as it.
TYPO_KEYWORDS = ("search", "select", "first", "entry", "result", "listing", "product", "look",
             "find", "open", "click", "choose", "pick", "need", "want", "show", "visit", "please",
             "then", "take", "bring", "pull", "option", "item", "head", "shop", "match")


def _one_edit(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` differ by one insertion, deletion, substitution or swap."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    return any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


def _fix_typos(text: str) -> str:
    """``text`` with each unquoted word one edit from a keyword (:data:`TYPO_KEYWORDS`) read as
    the keyword, its case and punctuation kept; words with digits, dots or hyphens (model
    numbers, domains) and quoted products are left alone."""
    out, quote = [], None
    for tok in text.split(" "):
        core = tok.strip(",;:.!?")
        if quote is None and tok[:1] in _QUOTES:
            quote = tok[0]
        if (quote is None and len(core) >= 4 and core.isalpha()
                and core.lower() not in TYPO_KEYWORDS):
            hit = next((k for k in TYPO_KEYWORDS if _one_edit(core.lower(), k)), None)
            if hit is not None:
                tok = tok.replace(core, hit.capitalize() if core[:1].isupper() else hit, 1)
        if quote is not None and any(c in _QUOTES[quote] for c in tok[1:]):
            quote = None  # the closing quote (a product's inner quote ends it early: harmless)
        out.append(tok)
    return " ".join(out)


def _product(raw: str, text: str) -> str | None:
    """The product of a free-form Web Shopping instruction: quotes stripped, else a leading
    article ("find me a ..."); None when words follow its closing quote (``"tv", and add it
    to cart``: a request beyond the first entry, not this phrasing)."""
    p = raw.strip().rstrip(",;")
    if p[:1] in _QUOTES:
        closers = _QUOTES[p[0]]
        end = max(p.rfind(c) for c in closers)
        if end <= 0:
            raise ValueError(f"unclosed quote in search query of {text!r}")
        if p[end + 1:].strip(" ,;.!?"):
            return None
        p = p[1:end]
    else:
        p = _ARTICLE.sub("", p)
    p = p.strip()
    if not p:
        raise ValueError(f"empty search query in {text!r}")
    return p


def _parse_webshop_free(text: str, t: str) -> Task | None:
    """``t`` (``text`` with its whitespace collapsed) as a free-form Web Shopping
    instruction, or None when no phrasing of this form matches."""
    for fixed in dict.fromkeys((t, _fix_typos(t))):  # as written first, then typos read
        m = _FREE_L1.match(fixed)
        if m is not None:
            return Task(text, "webshop", level=1, site=_known_site(m["domain"], text))
        for pattern in _FREE_L23:
            m = pattern.match(fixed)
            if m is not None and (query := _product(m["product"], text)) is not None:
                return Task(text, "webshop", level=3 if m["select"] else 2,
                            site=_known_site(m["domain"], text), query=query)
    return None


def _known_site(domain: str, text: str) -> str:
    site = site_from_domain(domain.rstrip(".!"))
    if site is None:
        raise UnsupportedTaskError(
            f"site {domain.rstrip('.!')!r} is not one of {_supported_domains()} (in {text!r})")
    return site


# --------------------------------------------------------------------------------------------
# General: open an app, search Google, or say what is not simulated
# --------------------------------------------------------------------------------------------

OPEN_VERBS = r"(?:open|launch|start|run|fire\s+up|switch\s+to)"
"""The verbs a General instruction opens an app with (a regex group; the phrasings' too)."""
_OPEN = re.compile(rf"^{OPEN_VERBS}\s+(?P<target>.+)$", re.I | re.S)
_CHROME_TABS = re.compile(r"^(?:a\s+)?new\b.*\b(?:tab|window)s?\b", re.I | re.S)

# Activities the simulator does not model, checked in order before the search rule.
_UNSUPPORTED: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.I | re.S), msg)
    for p, msg in (
        (r"^(?:install|download)\b", "installing apps is not simulated"),
        (r"^(?:uninstall|delete|remove|update)\b", "changing installed apps is not simulated"),
        (r"^(?:set|create|add|make)\s+(?:an?\s+|the\s+)?alarm", "alarms are not simulated"),
        (r"^(?:set|start|create)\s+(?:an?\s+|the\s+)?timer", "timers are not simulated"),
        (r"^(?:set|create|add|make)\s+(?:an?\s+|the\s+)?(?:reminder|event|appointment)s?\b",
         "calendar events and reminders are not simulated"),
        (r"^(?:play|pause|stop|watch|listen)\b", "playing media is not simulated"),
        (r"^check\s*the\s+settings\b", "app settings are not simulated"),
        (r"^(?:turn\s+(?:on|off)|toggle|enable|disable|mute|unmute)\b",
         "device and notification settings are not simulated"),
        (r"^(?:check|read|show\s+me|open)\s+my\s+(?:gmail|e-?mails?|inbox|mail|messages)\b",
         "reading the user's email and messages is not simulated"),
        (r"^(?:check|show\s+me|open|read)\s+my\b",
         "the user's own data on the phone (notifications, accounts, files) is not simulated"),
        (r"^(?:call|dial|text|send|message|email|reply)\b",
         "calls and messages to people are not simulated"),
        (r"^(?:take|record|capture)\s+(?:an?\s+|the\s+)?(?:photo|picture|pic|selfie|video|"
         r"screenshot)", "the camera is not simulated"),
        (r"^(?:buy|order|add\s+\S.*\s+to\s+(?:my\s+|the\s+)?cart)\b",
         "buying is not simulated (Web Shopping tasks stop at the first entry)"),
        (r"^(?:navigate|drive)\b", "navigation in Maps is not simulated"),
    )
)

# Instructions answered by searching Google; group "query" is what to type when the verb says
# so explicitly ("Search for X", "Google X", "Look up X"), else the whole instruction is typed.
_SEARCH_EXPLICIT = re.compile(
    r"^(?:search\s*for|search|google|look\s*up)\b[\s:,]*(?P<query>.*)$", re.I | re.S
)
_SEARCH_QUESTION = re.compile(
    r"^(?:what(?:['’]?s)?|how|where|who|whose|when|which|why|is|are|can|do|does|did|will|"
    r"tell\s+me|show\s+me|find|list|define)\b",
    re.I,
)


def _strip_quotes(s: str) -> str:
    s = s.strip()
    if len(s) >= 2 and s[0] in _QUOTES and s[-1] in _QUOTES[s[0]]:
        s = s[1:-1].strip()
    return s


def _app_label(target: str) -> str:
    """``"the Reddit app"`` -> ``"Reddit"``: the name as written, for error messages."""
    t = target.strip().rstrip("?.!").strip()
    t = re.sub(r"^the\s+", "", t, flags=re.I)
    t = re.sub(r"\s+(?:app|application)$", "", t, flags=re.I)
    return t


def _parse_open(text: str, target: str) -> Task:
    if _CHROME_TABS.match(target) or re.search(r"\b(?:incognito|private)\b", target, re.I):
        raise UnsupportedTaskError(f"Chrome tabs are not simulated (in {text!r})")
    head, sep, tail = _split_and(target)
    name = head.strip().rstrip("?.!").strip()
    app = app_from_name(name)
    if app is None:
        raise UnsupportedTaskError(
            f"app {_app_label(name)!r} is not on the simulated phone "
            f"(it has {', '.join(a.label for a in APPS.values())}; in {text!r})"
        )
    if sep:
        raise UnsupportedTaskError(
            f"only opening {APPS[app].label} is simulated, not {tail.strip().rstrip('?.!')!r} "
            f"(in {text!r})"
        )
    return Task(text, "open_app", app=app)


def _split_and(target: str) -> tuple[str, str, str]:
    """``"the calendar and show me this week's events"`` -> (head, "and", rest)."""
    parts = re.split(r"\s+(and|then|to)\s+", target, maxsplit=1, flags=re.I)
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    return target, "", ""


def parse_task(text: str) -> Task:
    """Parse one instruction into a :class:`Task`.

    Args:
        text: the instruction, e.g. ``Go to ebay.com, search for 'apple airpods', and select the
            first entry``, ``What's the news in India?`` or ``Open the clock``.

    Returns:
        The task; ``Task.text`` is ``text`` unchanged.

    Raises:
        UnsupportedTaskError: a form the simulator does not model (an unknown site or app,
            installing apps, alarms, media, ...); the message says which.
        ValueError: a Web Shopping instruction that is malformed (unclosed quote, empty query).
    """
    if not isinstance(text, str):
        raise TypeError(f"instruction must be a str, got {type(text).__name__}")
    t = " ".join(text.split())
    if not t:
        raise UnsupportedTaskError("empty instruction")

    m = _GO_TO.match(t)
    if m is not None:
        # Matched again on the text as given: the product is kept as written, inner spaces too.
        m_raw = _GO_TO.match(text.strip())
        assert m_raw is not None
        try:
            return _parse_webshop(text, m_raw)
        except UnsupportedTaskError:
            free = _parse_webshop_free(text, t)  # "go to x.com and look up ...", typos
            if free is None:
                raise
            return free

    if _HAS_DOMAIN.search(t):
        free = _parse_webshop_free(text, t)
        if free is not None:
            return free

    o = _OPEN.match(t)
    if o is not None:
        return _parse_open(text, o.group("target"))

    for pattern, msg in _UNSUPPORTED:
        if pattern.match(t):
            raise UnsupportedTaskError(f"{msg} (in {text!r})")

    s = _SEARCH_EXPLICIT.match(t)
    if s is not None:
        query = _strip_quotes(s.group("query").rstrip().rstrip("?").rstrip())
        if not query:
            raise UnsupportedTaskError(f"nothing to search for in {text!r}")
        return Task(text, "search", query=query)
    if _SEARCH_QUESTION.match(t):
        return Task(text, "search", query=t.rstrip("?").rstrip())

    raise UnsupportedTaskError(f"instruction not recognised by the simulator: {text!r}")


_EDGE_CHARS = "?.!,;:'\"“”‘’` "


def normalize_query(s: str) -> str:
    """Canonical form for comparing what was typed with ``Task.query``.

    Lower-cases, collapses whitespace and strips surrounding quotes and punctuation
    (``?.!,;:'"`` and curly quotes): ``'  "Bose  SoundSport"? '`` -> ``"bose soundsport"``.
    """
    return " ".join(s.lower().split()).strip(_EDGE_CHARS)


# --------------------------------------------------------------------------------------------
# Task files
# --------------------------------------------------------------------------------------------


def _numbered_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    # utf-8-sig: UTF-8, and a byte-order mark left by some editors is dropped.
    with open(path, encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, start=1):
            s = line.strip()
            if s and not s.startswith("#"):
                yield lineno, s


def load_task_file(path: str | Path) -> list[str]:
    """Instructions of a task file: one per line, blank lines and ``#`` comments skipped.

    Raises:
        ValueError: a line holds a task with phases (a JSON object): those are the
            simulator's (:func:`load_tasks`); a device's phases come from the config.
    """
    out = []
    for lineno, s in _numbered_lines(path):
        if s.startswith("{"):
            raise ValueError(f"{path}:{lineno}: a task with setup/teardown phases (a JSON "
                             "line) is the simulator's; a device's phases are android.setup "
                             "and android.teardown in the config")
        out.append(s)
    return out


def task_with_phases(d: Any) -> Task:
    """A task with phases from its JSON form ``{"task": instruction, "setup": {...},
    "teardown": {...}}`` (the phases: :class:`SimPhase` fields)."""
    if not isinstance(d, dict) or not isinstance(d.get("task"), str):
        raise ValueError(f"a task with phases is a JSON object with a 'task' instruction, "
                         f"got {d!r}")
    unknown = sorted(set(d) - {"task", "setup", "teardown"})
    if unknown:
        raise ValueError(f"unknown keys {unknown} (a task with phases has 'task', 'setup', "
                         "'teardown')")
    return replace(parse_task(d["task"]),
                   setup=SimPhase.from_dict(d["setup"], "setup") if d.get("setup") else None,
                   teardown=SimPhase.from_dict(d["teardown"], "teardown")
                   if d.get("teardown") else None)


def load_tasks(path: str | Path, skip_unsupported: bool = False) -> list[Task]:
    """Parse every instruction of a task file.

    Args:
        path: a UTF-8 text file, one instruction per line (see :func:`load_task_file`),
            or a JSON object per line for a task with phases (:func:`task_with_phases`).
        skip_unsupported: drop lines that raise :class:`UnsupportedTaskError` (other errors
            still raise).

    Raises:
        UnsupportedTaskError | ValueError: the error of the first failing line, its message
            prefixed with ``path:lineno``.
    """
    tasks = []
    for lineno, s in _numbered_lines(path):
        try:
            tasks.append(task_with_phases(_json_line(s)) if s.startswith("{")
                         else parse_task(s))
        except UnsupportedTaskError as e:
            if skip_unsupported:
                continue
            raise UnsupportedTaskError(f"{path}:{lineno}: {e}") from e
        except ValueError as e:
            raise ValueError(f"{path}:{lineno}: {e}") from e
    return tasks


def _json_line(s: str) -> Any:
    try:
        return json.loads(s)
    except json.JSONDecodeError as e:
        raise ValueError(f"a line starting with '{{' is a task with phases in JSON: {e}") \
            from None
