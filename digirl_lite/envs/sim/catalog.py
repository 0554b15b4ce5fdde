"""What the simulated phone holds: its shops and its apps (names, aliases, colours)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Site", "App", "SITES", "APPS", "TRAIN_SITES", "HELD_OUT_SITES", "site_from_domain",
           "app_from_name"]


@dataclass(frozen=True)
class Site:
    """A shop in the style of AitW Web Shopping."""

    key: str
    domain: str
    title: str
    color: tuple[int, int, int]


@dataclass(frozen=True)
class App:
    """A launcher app. ``aliases`` are lower-case names people use for it."""

    key: str
    label: str
    aliases: tuple[str, ...]
    color: tuple[int, int, int]


SITES: dict[str, Site] = {
    s.key: s
    for s in (
        Site("costco", "costco.com", "Costco", (0, 93, 170)),
        Site("walmart", "walmart.com", "Walmart", (0, 113, 220)),
        Site("ebay", "ebay.com", "eBay", (229, 50, 56)),
        Site("bestbuy", "bestbuy.com", "Best Buy", (0, 70, 190)),
        Site("target", "target.com", "Target", (204, 0, 0)),
        Site("newegg", "newegg.com", "Newegg", (245, 130, 31)),
        # held out: no train or test task names these (the unseen-products split's sites)
        Site("overstock", "overstock.com", "Overstock", (192, 24, 44)),
        Site("bhphoto", "bhphotovideo.com", "B&H Photo", (60, 60, 60)),
    )
}

TRAIN_SITES: tuple[str, ...] = ("costco", "walmart", "ebay", "bestbuy", "target", "newegg")
"""The shops the train and test lists use."""
HELD_OUT_SITES: tuple[str, ...] = ("overstock", "bhphoto")
"""Shops only the held-out split ``webshop_unseen_products`` names: the training never
sees them (issue 32, item 5)."""

APPS: dict[str, App] = {
    a.key: a
    for a in (
        App("chrome", "Chrome", ("chrome", "google chrome", "browser"), (66, 133, 244)),
        App("settings", "Settings", ("settings", "setting"), (96, 125, 139)),
        App("clock", "Clock", ("clock", "alarm clock"), (63, 81, 181)),
        App("youtube", "YouTube", ("youtube", "you tube"), (255, 0, 0)),
        App("maps", "Maps", ("maps", "google maps", "map"), (52, 168, 83)),
        App("playstore", "Play Store", ("play store", "google play store", "google play"),
            (1, 135, 95)),
        App("gmail", "Gmail", ("gmail", "mail", "email"), (234, 67, 53)),
        App("calendar", "Calendar", ("calendar", "google calendar"), (26, 115, 232)),
        App("camera", "Camera", ("camera",), (60, 64, 67)),
        App("photos", "Photos", ("photos", "google photos", "gallery"), (251, 188, 4)),
        App("files", "Files", ("files", "file manager", "files by google"), (0, 150, 136)),
        App("calculator", "Calculator", ("calculator",), (255, 112, 67)),
        App("messages", "Messages", ("messages", "sms", "messaging", "text messages"),
            (0, 137, 123)),
        App("contacts", "Contacts", ("contacts",), (3, 155, 229)),
        App("phone", "Phone", ("phone", "dialer"), (67, 160, 71)),
    )
}

_APP_ALIASES = {alias: a.key for a in APPS.values() for alias in a.aliases}


def site_from_domain(text: str) -> str | None:
    """``"costco.com"``, ``"www.costco.com"``, ``"https://costco.com/"`` or ``"costco"`` -> key."""
    t = text.strip().lower()
    for prefix in ("https://", "http://"):
        if t.startswith(prefix):
            t = t[len(prefix):]
    t = t.rstrip("/")
    if t.startswith("www."):
        t = t[4:]
    for s in SITES.values():
        if t in (s.domain, s.key):
            return s.key
    return None


def app_from_name(name: str) -> str | None:
    """An app key from how people name it (``"the clock"``, ``"SMS app"``), or None."""
    t = " ".join(name.strip().lower().replace("'s", "").split())
    for prefix in ("the ",):
        if t.startswith(prefix):
            t = t[len(prefix):]
    for suffix in (" app", " application"):
        if t.endswith(suffix):
            t = t[: -len(suffix)]
    return _APP_ALIASES.get(t.strip())
