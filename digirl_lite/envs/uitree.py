"""The phone's UI tree (accessibility tree), one form for every phone (issue 30, item 1).

A device over Appium answers ``GET /session/{id}/source`` with UiAutomator2's XML layout::

    <hierarchy rotation="0" width="1080" height="2280">
      <node index="0" text="" resource-id="" class="android.widget.FrameLayout"
            clickable="false" focused="false" bounds="[0,0][1080,2280]" ...>
        <node text="Search" resource-id="search_box" class="android.widget.EditText"
              clickable="true" focused="true" bounds="[60,400][1020,520]" .../>

:func:`parse_source` reads that layout (a real device's, nested any depth, or the simulated
phone's) into :class:`UINode` records, in document order; :func:`to_source` writes nodes back
in that layout (the simulated phone serves its screen this way); :func:`tree_text` is the
compact text an agent's prompt gets, one line per node. The simulator builds its nodes from
its screen's elements (:func:`digirl_lite.envs.sim.world.ui_nodes`), overlays and drift
included.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import quoteattr

__all__ = ["UINode", "UITreeError", "parse_source", "to_source", "tree_text", "parse_tree_text",
           "BOUNDS_RE"]

BOUNDS_RE = re.compile(r"\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]")


class UITreeError(ValueError):
    """A page source that is not a UiAutomator2 layout (says what and where)."""


@dataclass(frozen=True)
class UINode:
    """One element on screen. ``bounds`` = (x0, y0, x1, y1) in screen pixels."""

    id: str
    cls: str
    text: str
    bounds: tuple[int, int, int, int]
    clickable: bool = False
    focused: bool = False

    @property
    def center(self) -> tuple[float, float]:
        x0, y0, x1, y1 = self.bounds
        return ((x0 + x1) / 2.0, (y0 + y1) / 2.0)


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def parse_source(xml: str) -> list[UINode]:
    """The nodes of a UiAutomator2 page source, in document order (the screen's container
    nodes included); nodes without readable bounds are skipped. A node's ``text`` is its
    ``text``, else its ``content-desc``.

    Raises:
        UITreeError: not XML, or no ``hierarchy`` / ``node`` root (with the parser's
            line and column).
    """
    if not isinstance(xml, str) or not xml.strip():
        raise UITreeError("empty page source")
    try:
        root = ET.fromstring(xml.encode("utf-8") if xml.lstrip().startswith("<?xml")
                             else xml)
    except ET.ParseError as e:
        line, col = e.position
        raise UITreeError(f"page source is not XML (line {line}, column {col}): "
                          f"{xml[:120]!r}") from None
    if root.tag not in ("hierarchy", "node"):
        raise UITreeError(f"page source root is <{root.tag}>, not <hierarchy> (UiAutomator2)")
    out = []
    for el in root.iter("node"):
        m = BOUNDS_RE.fullmatch((el.get("bounds") or "").strip())
        if m is None:
            continue
        out.append(UINode(
            id=el.get("resource-id") or "",
            cls=el.get("class") or "",
            text=el.get("text") or el.get("content-desc") or "",
            bounds=tuple(int(v) for v in m.groups()),  # type: ignore[arg-type]
            clickable=_flag(el.get("clickable")),
            focused=_flag(el.get("focused"))))
    return out


def to_source(nodes: Sequence[UINode], width: int, height: int,
              package: str = "com.digirl.sim") -> str:
    """``nodes`` as UiAutomator2 writes a screen: a ``hierarchy`` holding one full-screen
    ``FrameLayout`` whose children are the nodes, in order."""
    def node(i: int, n: UINode) -> str:
        x0, y0, x1, y1 = n.bounds
        attrs = {"index": str(i), "text": n.text, "resource-id": n.id, "class": n.cls,
                 "package": package, "content-desc": "", "checkable": "false",
                 "checked": "false", "clickable": str(n.clickable).lower(), "enabled": "true",
                 "focusable": str(n.clickable or n.focused).lower(),
                 "focused": str(n.focused).lower(), "scrollable": "false",
                 "long-clickable": "false", "password": "false", "selected": "false",
                 "bounds": f"[{x0},{y0}][{x1},{y1}]", "displayed": "true"}
        return "<node " + " ".join(f"{k}={quoteattr(v)}" for k, v in attrs.items()) + " />"

    root = UINode("", "android.widget.FrameLayout", "", (0, 0, width, height))
    head = node(0, root)[:-3] + ">"
    body = "".join(node(i, n) for i, n in enumerate(nodes))
    return ("<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>"
            f'<hierarchy index="0" class="hierarchy" rotation="0" width="{width}" '
            f'height="{height}">{head}{body}</node></hierarchy>')


def tree_text(nodes: Sequence[UINode], max_nodes: int = 80) -> str:
    """One line per node an agent can act on or read (a clickable one, or one with text):
    ``[id] Class "text" (x0,y0,x1,y1) clickable focused``; at most ``max_nodes`` lines."""
    lines = []
    for n in nodes:
        if not (n.clickable or n.text):
            continue
        cls = n.cls.rsplit(".", 1)[-1]
        flags = " ".join(f for f, on in (("clickable", n.clickable), ("focused", n.focused))
                         if on)
        text = f' "{n.text}"' if n.text else ""
        lines.append(f"[{n.id}] {cls}{text} ({','.join(map(str, n.bounds))})"
                     + (f" {flags}" if flags else ""))
    if len(lines) > max_nodes:
        lines = lines[:max_nodes] + [f"... {len(lines) - max_nodes} more"]
    return "\n".join(lines)


_TREE_LINE = re.compile(r'^\[(?P<id>[^\]]*)\] (?P<cls>\S+)(?: "(?P<text>.*)")? '
                        r"\((?P<b>-?\d+,-?\d+,-?\d+,-?\d+)\)(?P<flags>(?: \w+)*)$")


def parse_tree_text(text: str) -> list[UINode]:
    """:func:`tree_text`'s lines read back into nodes (``cls`` is the short class name the
    text keeps); lines that are not node lines (``... N more``) are skipped."""
    out = []
    for line in (text or "").splitlines():
        m = _TREE_LINE.match(line.strip())
        if m is None:
            continue
        flags = m["flags"].split()
        out.append(UINode(m["id"], m["cls"], m["text"] or "",
                          tuple(int(v) for v in m["b"].split(",")),  # type: ignore[arg-type]
                          "clickable" in flags, "focused" in flags))
    return out
