"""Web Shopping instructions phrased as people write them, in two disjoint sets of phrasings.

AitW's lists, and the simulator's, phrase every Web Shopping task one way: ``Go to <site>,
search for "<product>", and select the first entry``. People do not: "look up sony wh-1000xm4
on costco.com and open the top result", "take me to ebay.com", lower case, a typo. Two sets of
templates, written apart (issue 32, item 5):

* :data:`TRAIN_PHRASINGS`: what the training may see (``phrasing_share`` rephrases that share
  of the demonstrations', the pile's and the online phase's train tasks with them);
* :data:`HELD_OUT_PHRASINGS`: what only the held-out split ``webshop_unseen_phrasings`` uses
  (:func:`rephrase`; ``recipes/make_task_sets.py``). No template, verb or "first entry"
  wording of one set is in the other;
* :data:`FINAL_PHRASINGS`: the final split ``webshop_final_phrasings``, written after every
  design choice the held-out split served, for a claim measured once.

Every phrasing is one :func:`~digirl_lite.envs.sim.tasks.parse_task` reads back to the same
site, level and product: :func:`rephrase` checks it.

General has one held-out set (issue 47, item 1): :data:`GENERAL_HELD_OUT_PHRASINGS`, which
only the split ``general_unseen_phrasings`` uses (:func:`rephrase_general`: the same app, or a
search with the same content words, read back).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from digirl_lite.envs.sim.catalog import SITES
from digirl_lite.envs.sim.tasks import (
    OPEN_VERBS,
    TYPO_KEYWORDS,
    Task,
    UnsupportedTaskError,
    parse_task,
)

__all__ = ["Phrasings", "TRAIN_PHRASINGS", "WIDE_TRAIN_PHRASINGS", "TRAIN_PHRASING_SETS",
           "HELD_OUT_PHRASINGS", "FINAL_PHRASINGS", "rephrase", "rephrase_tasks",
           "rephrase_train_tasks", "add_typo",
           "GeneralPhrasings", "GENERAL_HELD_OUT_PHRASINGS", "GENERAL_TRAIN_PHRASINGS",
           "GENERAL_TRAIN_PHRASING_SETS", "GENERAL_FUNCTION_WORDS",
           "general_content_words", "rephrase_general", "train_phrasing_templates"]


@dataclass(frozen=True)
class Phrasings:
    """Templates per level (``{d}``: the site's domain, ``{q}``: the product) and how the
    rest of an instruction varies.

    Attributes:
        level1: go to the site.
        level2: search it for the product.
        select: what level 3 adds after a level-2 phrasing ("and select the first entry").
        quote_p: chance the product is quoted ('...' or "...").
        article_p: chance an unquoted product gets "a " before it ("find me a ...").
        lower_p: chance the whole instruction is lower case (else its first letter capital).
        typo_p: chance one word around the product carries a typo (:func:`add_typo`).
    """

    level1: tuple[str, ...]
    level2: tuple[str, ...]
    select: tuple[str, ...]
    quote_p: float
    article_p: float
    lower_p: float
    typo_p: float


TRAIN_PHRASINGS = Phrasings(
    level1=("Go to {d}", "Open {d}", "Visit {d}", "Head to {d}"),
    level2=("Go to {d}, search for {q}", "Search {d} for {q}", "Search for {q} on {d}",
            "Look for {q} at {d}", "Open {d} and search for {q}", "On {d}, search for {q}",
            "Shop for {q} on {d}", "Visit {d} and look for {q}"),
    select=(", and select the first entry", " and click the first result",
            ", then tap the first item", " and choose the first listing",
            ", select the first product"),
    quote_p=0.5, article_p=0.0, lower_p=0.4, typo_p=0.25,
)

WIDE_TRAIN_PHRASINGS = Phrasings(
    level1=TRAIN_PHRASINGS.level1 + ("Navigate to {d}", "Head over to {d}", "hey, visit {d}",
                                     "Would you go to {d}", "ok, navigate to {d} now",
                                     "Open {d} for me"),
    level2=TRAIN_PHRASINGS.level2 + (
        "Search for {q} in {d}", "Look for {q} via {d}", "Shop for {q} from {d}",
        "Search for {q} at {d}", "Check {q} on {d}", "hey, search for {q} on {d}",
        "ok, shop for {q} at {d}", "Please search for {q} in {d}",
        "Would you look for {q} on {d}", "Navigate to {d} and search for {q}",
        "Head over to {d} then look for {q}", "Go to {d} and shop for {q}",
        "Visit {d}, then search {q}", "On {d}: search for {q}", "On {d}, shop for {q}",
        "Open {d}, look for {q}"),
    select=TRAIN_PHRASINGS.select + (" then click on the first link", " and tap the 1st hit",
                                     ", choose the first item", " and select the 1st listing"),
    quote_p=0.4, article_p=0.3, lower_p=0.4, typo_p=0.25,
)
"""More of people's ways than :data:`TRAIN_PHRASINGS` (``train_phrasings`` "wide"): 24
searches and 10 site visits, with prefixes ("hey", "ok", "please", "would you"), more
prepositions ("in", "via", "from") and articles ("search for a ..."). Written after the
held-out split had been measured, so kept apart from it by rule: no held-out template, verb
("look up", "find", "need", "show", "get", "take", "pull up", "bring up", "want"), "top" or
held-out "first entry" wording (``tests/sim/test_phrasings.py`` checks)."""

HELD_OUT_PHRASINGS = Phrasings(
    level1=("take me to {d}", "pull up {d} please", "bring up {d}", "i want to go to {d}",
            "could you open up {d}"),
    level2=("look up {q} on {d}", "find me {q} at {d}", "i need {q} from {d}",
            "show me {q} on {d}", "get me {q} from {d}", "at {d}, look up {q}",
            "can you find {q} on {d}", "i'm looking for {q} over at {d}"),
    select=(" and open the top result", " then pick the first one", ", go with the first option",
            " and grab the top match"),
    quote_p=0.3, article_p=0.3, lower_p=0.7, typo_p=0.4,
)

FINAL_PHRASINGS = Phrasings(
    level1=("get me to {d}", "hey, take me to {d}", "could you bring up {d} for me",
            "okay, pull up {d}", "pls open up {d} now"),
    level2=("hey, i want {q} from {d}", "pls check {q} over at {d}",
            "okay, find {q} via {d}", "could you show me {q} in {d}",
            "i am looking for {q} at {d}", "please get me {q} on {d}",
            "over at {d}: find me {q}", "on {d}, please show me {q}",
            "can you search {d} for {q}", "pull up {d} then look up {q}",
            "take me to {d} and find {q}", "get me to {d}, then show me {q}"),
    select=(" and tap on the top item", ", then click on the 1st result",
            " and pick the top listing", ", grab the first product"),
    quote_p=0.3, article_p=0.4, lower_p=0.6, typo_p=0.3,
)
"""What only the final split ``webshop_final_phrasings`` uses: 21 templates written at the
end of issue 32's item 5 (session 12), after every design choice the held-out split
``webshop_unseen_phrasings`` had served (the span benchmark's readers, the extractor's data,
the wide train phrasings were all chosen looking at that split). None of them is a template of
another set (``tests/sim/test_phrasings.py``); they recombine what the simulator's parser reads
(prefixes, verbs, prepositions, selections) in frames no other set has. Not among the main
job's ``eval_splits``: evaluate on it once, for a claim, and design on nothing it shows."""

TRAIN_PHRASING_SETS = {"base": TRAIN_PHRASINGS, "wide": WIDE_TRAIN_PHRASINGS}
"""What the config's ``train_phrasings`` may name."""

# The words a typo may hit: the parser's (it reads them back), less "then" and "want" (the
# shipped split was drawn without them).
_TYPO_WORDS = tuple(k for k in TYPO_KEYWORDS if k not in ("then", "want"))


def add_typo(word: str, rng: random.Random) -> str:
    """``word`` with one slip of the thumb: two letters swapped, one dropped, one doubled or
    one replaced by a neighbour on the keyboard."""
    rows = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
    i = rng.randrange(1, len(word) - 1)  # first and last letters kept: still readable
    kind = rng.randrange(4)
    if kind == 0:  # swap letters i and i + 1, both inside the word
        i = min(i, len(word) - 3)
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if kind == 1:
        return word[:i] + word[i + 1:]
    if kind == 2:
        return word[:i] + word[i] + word[i:]
    row = next((r for r in rows if word[i] in r), rows[0])
    j = row.find(word[i])
    near = [row[k] for k in (j - 1, j + 1) if 0 <= k < len(row)]
    return word[:i] + rng.choice(near) + word[i + 1:]


def _with_typo(text: str, rng: random.Random, product: str | None) -> str:
    """``text`` with a typo in one of its template words (never the product or the site)."""
    head, sep, tail = text.partition(product) if product else (text, "", "")
    words = head.split(" ") + ([sep] if sep else []) + (tail.split(" ") if sep else [])
    spots = [i for i, w in enumerate(words) if w.strip(",").lower() in _TYPO_WORDS
             and w != sep]
    if not spots:
        return text
    i = rng.choice(spots)
    core = words[i].strip(",")
    words[i] = words[i].replace(core, add_typo(core, rng), 1)
    if not sep:
        return " ".join(words)
    k = len(head.split(" "))
    return " ".join(words[:k]) + sep + " ".join(words[k + 1:])


def rephrase(task: Task | str, phrasings: Phrasings, rng: random.Random) -> str:
    """A Web Shopping ``task`` written with one of ``phrasings``' templates (its site, level
    and product unchanged: checked by parsing it back); other tasks are returned as given.

    Raises:
        ValueError: no phrasing drawn in 20 tries parsed back to the same task (a product
            the templates cannot hold).
    """
    t = task if isinstance(task, Task) else parse_task(task)
    if t.kind != "webshop":
        return t.text
    domain = SITES[t.site].domain
    for _ in range(20):
        q = t.query
        if q is not None:
            if rng.random() < phrasings.quote_p:
                mark = rng.choice(("'", '"'))
                q = f"{mark}{q}{mark}"
            elif rng.random() < phrasings.article_p:
                q = f"a {q}"
        if t.level == 1:
            text = rng.choice(phrasings.level1).format(d=domain)
        else:
            text = rng.choice(phrasings.level2).format(d=domain, q=q)
            if t.level == 3:
                text += rng.choice(phrasings.select)
        if rng.random() < phrasings.lower_p:
            text = text.lower()
            if q is not None:  # the product as written, whatever the case
                text = text.replace(q.lower(), q)
        else:
            text = text[:1].upper() + text[1:]
        if rng.random() < phrasings.typo_p:
            text = _with_typo(text, rng, q)
        try:
            back = parse_task(text)
        except (UnsupportedTaskError, ValueError):
            continue
        if (back.kind, back.site, back.level, back.query) == (t.kind, t.site, t.level, t.query):
            return text
    raise ValueError(f"no phrasing of {t.text!r} parsed back to the same task")


def rephrase_tasks(tasks: Sequence[str | Task], share: float, seed: int,
                   phrasings: Phrasings = TRAIN_PHRASINGS,
                   general: GeneralPhrasings | None = None) -> list:
    """``tasks`` (instructions, or parsed tasks: each comes back as it went in) with about
    ``share`` of the Web Shopping ones rephrased (:func:`rephrase`; a parsed task keeps its
    setup and teardown), deterministic from ``seed``; the order and the others unchanged.
    ``general``: General's app openings and searches too (:func:`rephrase_general`; a line
    none of its search templates writes stays as it is)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in [0, 1], got {share}")
    rng = random.Random(seed)
    out: list = []
    for task in tasks:
        if rng.random() >= share:
            out.append(task)
            continue
        t = task if isinstance(task, Task) else parse_task(task)
        if general is not None and t.kind in ("open_app", "search"):
            try:
                text = rephrase_general(t, general, rng)
            except ValueError:  # a line no template of the set writes
                text = t.text
        else:
            text = rephrase(t, phrasings, rng)
        if not isinstance(task, Task):
            out.append(text)
        else:
            out.append(replace(parse_task(text), setup=task.setup, teardown=task.teardown)
                       if text != task.text else task)
    return out


def rephrase_train_tasks(tasks: Sequence[str | Task], share: float, seed: int,
                         name: str = "base") -> list:
    """:func:`rephrase_tasks` with the train phrasing set ``name`` (``train_phrasings``):
    Web Shopping's :data:`TRAIN_PHRASING_SETS` entry, and General's
    :data:`GENERAL_TRAIN_PHRASING_SETS` entry where it has one (else General lines stay)."""
    return rephrase_tasks(tasks, share, seed, TRAIN_PHRASING_SETS[name],
                          GENERAL_TRAIN_PHRASING_SETS.get(name))


# --------------------------------------------------------------------------------------------
# General: the held-out phrasings of the test list (issue 47, item 1)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GeneralPhrasings:
    """General instructions written apart from the train list's templates.

    Attributes:
        open: opening an app (``{a}``: the app's name as the test line writes it).
        search: a train search template of ``recipes/make_task_sets.py`` (its ``{}`` slots,
            in order) -> the ways to write the same search (the same slots, in order).
        lower_p: chance the template's words start lower case ("look up ..."), else the
            first letter is capital; the names in the slots are kept as written.
    """

    open: tuple[str, ...]
    search: dict[str, tuple[str, ...]]
    lower_p: float


def _general_search(*pairs: tuple[tuple[str, ...], tuple[str, ...]]) -> dict:
    return {key: held for keys, held in pairs for key in keys}


GENERAL_HELD_OUT_PHRASINGS = GeneralPhrasings(
    open=("Start {a}", "Start the {a}", "Start the {a} app", "Start the {a} application"),
    search=_general_search(
        (("What's the news in {}?",),
         ("look up the news in {}", "tell me the news in {}", "can you show me the news in {}?")),
        (("What is the capital of {}?", "Google the capital of {}"),
         ("look up the capital of {}", "tell me the capital of {}", "which is the capital of {}?",
          "do you know the capital of {}?")),
        (("What's the population of {}?",),
         ("look up the population of {}", "tell me the population of {}",
          "do you know the population of {}?")),
        (("What's the weather like in {}?",),
         ("look up the weather in {}", "tell me the weather in {}", "show me the weather in {}")),
        (("Search for hotels in {}",),
         ("look up hotels in {}", "show me hotels in {}", "can you find hotels in {}?")),
        (("What time is it in {}?",),
         ("look up the time in {}", "tell me the time in {}", "do you know the time in {}?")),
        (("What's a good restaurant in {}?",),
         ("look up a good restaurant in {}", "tell me a good restaurant in {}",
          "can you show me a good restaurant in {}?")),
        (("How much does a 2 bedroom apartment rent for in {}?",),
         ("look up the rent for a 2 bedroom apartment in {}",
          "tell me the rent for a 2 bedroom apartment in {}",
          "show me 2 bedroom apartment rent in {}")),
        (("How much does a 3 bedroom apartment rent for in {}?",),
         ("look up the rent for a 3 bedroom apartment in {}",
          "tell me the rent for a 3 bedroom apartment in {}",
          "show me 3 bedroom apartment rent in {}")),
        (("Search for flights from {} to {}",),
         ("look up flights from {} to {}", "show me flights from {} to {}",
          "can you find flights from {} to {}?")),
        (("What's on the menu at {}?",),
         ("look up the menu at {}", "show me the menu at {}", "tell me what's on the menu at {}")),
        (("What time does {} close?",),
         ("look up what time {} will close", "tell me what time {} will close",
          "do you know what time {} will close?")),
        (("How do I get to the nearest {}?",),
         ("show me how to get to the nearest {}", "look up how to get to the nearest {}",
          "can you tell me how to get to the nearest {}?")),
        (("Find the nearest {}",),
         ("look up the nearest {}", "show me the nearest {}", "can you find the nearest {}?")),
        (("Where can I buy a nice {}?",),
         ("tell me where to buy a nice {}", "look up where to buy a nice {}",
          "show me where I can buy a nice {}")),
        (("Search for a new {}",),
         ("look up a new {}", "show me a new {}", "can you find me a new {}?")),
        (("Search for good {} restaurants",),
         ("look up good {} restaurants", "show me good {} restaurants",
          "can you find good {} restaurants?")),
        (("What's a good {} recipe for dinner?",),
         ("look up a good {} recipe for dinner", "show me a good {} recipe for dinner",
          "can you find a good {} recipe for dinner?")),
        (("What's the latest news in {}?",),
         ("look up the latest news in {}", "tell me the latest news in {}",
          "show me the latest news in {}")),
        (("How big is {}?",),
         ("look up how big {} is", "tell me how big {} is", "do you know how big {} is?")),
        (("How far away is {}?",),
         ("look up how far away {} is", "tell me how far away {} is",
          "do you know how far away {} is?")),
        (("What's the price of the {}?",),
         ("look up the price of the {}", "tell me the price of the {}",
          "show me the price of the {}")),
        (("How much does the {} cost?",),
         ("look up the cost of the {}", "tell me the cost of the {}",
          "do you know the cost of the {}?")),
    ),
    lower_p=0.6,
)
"""What only the held-out split ``general_unseen_phrasings`` uses (issue 47, item 1): the
General test list line by line in ways the train list never writes. The train list opens apps
with "Open" and "Launch" and asks with "What", "How", "Where", "Find", "Search for" and
"Google", always from a capital letter; these open with "Start" (the one other verb the parser
reads), search with "look up" (an explicit verb: its rest is the query) or ask with "tell me",
"show me", "can you", "do you know" and "which" (a question: the whole text is the query), and
most start lower case. ``tests/sim/test_generalization_splits.py`` checks that no train line starts
with one of these openers or matches one of these templates.

Each search template keeps its train template's *content words*
(:func:`general_content_words`: the query's words, lower case, less the function words of
:data:`GENERAL_FUNCTION_WORDS`): "What's the weather like in Edinburgh?" (a question, the whole
text typed) and "look up the weather in Edinburgh" (typed: "the weather in Edinburgh") both hold
{weather, edinburgh}. :func:`rephrase_general` checks it on every line it writes."""

GENERAL_TRAIN_PHRASINGS = GeneralPhrasings(
    open=("Open {a}", "Open the {a} app", "Launch the {a}", "Launch the {a} application",
          "Run {a}", "Run the {a} app", "Fire up {a}", "Fire up the {a} app", "Switch to {a}",
          "Switch to the {a} app"),
    search=_general_search(
        (("What's the news in {}?",),
         ("Search for the news in {}", "Google the news in {}", "What is the news in {}?",
          "Find the news in {}")),
        (("What is the capital of {}?", "Google the capital of {}"),
         ("Search for the capital of {}", "What's the capital of {}?", "Find the capital of {}",
          "Search the capital of {}")),
        (("What's the population of {}?",),
         ("Search for the population of {}", "Google the population of {}",
          "What is the population of {}?", "Find the population of {}")),
        (("What's the weather like in {}?",),
         ("Search for the weather in {}", "Google the weather in {}",
          "What is the weather in {}?", "How is the weather in {}?")),
        (("Search for hotels in {}",),
         ("Google hotels in {}", "Find hotels in {}", "Search hotels in {}")),
        (("What time is it in {}?",),
         ("Search for the time in {}", "Google the time in {}", "What's the time in {}?",
          "Find the time in {}")),
        (("What's a good restaurant in {}?",),
         ("Search for a good restaurant in {}", "Google a good restaurant in {}",
          "Find a good restaurant in {}", "Where is a good restaurant in {}?")),
        (("How much does a 2 bedroom apartment rent for in {}?",),
         ("Search for 2 bedroom apartment rent in {}",
          "Google the rent for a 2 bedroom apartment in {}",
          "What is the rent for a 2 bedroom apartment in {}?")),
        (("How much does a 3 bedroom apartment rent for in {}?",),
         ("Search for 3 bedroom apartment rent in {}",
          "Google the rent for a 3 bedroom apartment in {}",
          "What is the rent for a 3 bedroom apartment in {}?")),
        (("Search for flights from {} to {}",),
         ("Google flights from {} to {}", "Find flights from {} to {}",
          "Search flights from {} to {}")),
        (("What's on the menu at {}?",),
         ("Search for the menu at {}", "Google the menu at {}", "What is on the menu at {}?")),
        (("What time does {} close?",),
         ("Search for what time {} will close", "Google what time {} will close",
          "What time will {} close?")),
        (("How do I get to the nearest {}?",),
         ("Search for how to get to the nearest {}", "Google how to get to the nearest {}",
          "How can I get to the nearest {}?")),
        (("Find the nearest {}",),
         ("Search for the nearest {}", "Google the nearest {}", "Where is the nearest {}?")),
        (("Where can I buy a nice {}?",),
         ("Search for where to buy a nice {}", "Google where to buy a nice {}",
          "Where do I buy a nice {}?")),
        (("Search for a new {}",),
         ("Google a new {}", "Find a new {}", "Search a new {}")),
        (("Search for good {} restaurants",),
         ("Google good {} restaurants", "Find good {} restaurants", "Search good {} restaurants")),
        (("What's a good {} recipe for dinner?",),
         ("Search for a good {} recipe for dinner", "Google a good {} recipe for dinner",
          "Find a good {} recipe for dinner")),
        (("What's the latest news in {}?",),
         ("Search for the latest news in {}", "Google the latest news in {}",
          "What is the latest news in {}?")),
        (("How big is {}?",),
         ("Search for how big {} is", "Google how big {} is", "Find how big {} is")),
        (("How far away is {}?",),
         ("Search for how far away {} is", "Google how far away {} is",
          "Find how far away {} is")),
        (("What's the price of the {}?",),
         ("Search for the price of the {}", "Google the price of the {}",
          "What is the price of the {}?")),
        (("How much does the {} cost?",),
         ("Search for the cost of the {}", "Google the cost of the {}",
          "What does the {} cost?")),
    ),
    lower_p=0.3,
)
"""What the training may read of General written other ways (``phrasing_share`` and
``sft_phrasing_share`` on ``world`` "general"; :func:`rephrase_tasks` with ``general``): the
train list's apps opened with "Run", "Fire up" and "Switch to" as well as "Open" and
"Launch", with and without "the ... app", and its searches asked with "Search for", "Search",
"Google", "Find" or another question word than the train line's, some lower case. So the
policy sees that the verb varies and the app's name or the search's content words do not.
Kept apart from :data:`GENERAL_HELD_OUT_PHRASINGS` by rule: no held-out opener ("start",
"look up", "tell me", "show me", "can you", "do you know", "which") and no held-out template
(``tests/sim/test_generalization_splits.py`` checks). Every template keeps its train
template's content words and reads back to the same task (:func:`rephrase_general` checks
each line it writes)."""

GENERAL_TRAIN_PHRASING_SETS = {"base": GENERAL_TRAIN_PHRASINGS}
"""The General train phrasing sets ``train_phrasings`` may name on ``world`` "general"."""

GENERAL_FUNCTION_WORDS = frozenset(
    "a an the what what's which where when how is it in of for to from at on does do will i me "
    "you can tell show look up find get like much know".split())
"""The words a General query may gain or lose when rephrased: question words, articles,
prepositions, auxiliaries, pronouns and the asking verbs ("tell me", "do you know", "look up",
"find", "get to"). Every other word of a query is a content word."""

_GENERAL_OPEN = re.compile(rf"^{OPEN_VERBS}\s+(?:the\s+)?(?P<name>.+?)(?:\s+app)?$", re.I)


def general_content_words(query: str) -> frozenset[str]:
    """The content words of a General search ``query``: its words lower case, ``?.,!``
    stripped from their ends, less :data:`GENERAL_FUNCTION_WORDS`."""
    words = (w.strip("?.,!").lower() for w in query.split())
    return frozenset(w for w in words if w and w not in GENERAL_FUNCTION_WORDS)


def _template_regex(template: str) -> re.Pattern[str]:
    parts = [re.escape(p) for p in template.split("{}")]
    return re.compile("^" + "(.+?)".join(parts) + "$")


def rephrase_general(task: Task | str, phrasings: GeneralPhrasings,
                     rng: random.Random) -> str:
    """A General ``task`` (a line of the test list: an app opened with a train open template,
    or a search written with a train search template) written with ``phrasings``: the same
    app, or a search with the same content words (:func:`general_content_words`) and the
    slots' names as written; checked by parsing it back.

    Raises:
        ValueError: a line no template of ``phrasings.search`` writes, an app name not read
            back, or no draw in 20 tries parsed back to the same task.
    """
    t = task if isinstance(task, Task) else parse_task(task)
    text = " ".join(t.text.split())
    if t.kind == "open_app":
        m = _GENERAL_OPEN.match(text)
        if m is None:
            raise ValueError(f"not an app opened as the train list opens one: {t.text!r}")
        slots, templates = {"a": m["name"]}, phrasings.open
    elif t.kind == "search":
        found = [(k, m.groups()) for k in phrasings.search
                 if (m := _template_regex(k).match(text))]
        if len(found) != 1:
            raise ValueError(f"{len(found)} search templates write {t.text!r}, need one")
        key, names = found[0]
        templates = phrasings.search[key]
    else:
        raise ValueError(f"not a General task: {t.text!r}")
    for _ in range(20):
        template = rng.choice(templates)
        template = template[:1].lower() + template[1:] if rng.random() < phrasings.lower_p \
            else template[:1].upper() + template[1:]
        out = template.format(**slots) if t.kind == "open_app" else template.format(*names)
        try:
            back = parse_task(out)
        except (UnsupportedTaskError, ValueError):
            continue
        if back.kind != t.kind:
            continue
        if back.kind == "open_app" and back.app == t.app:
            return out
        if back.kind == "search" and \
                general_content_words(back.query) == general_content_words(t.query):
            return out
    raise ValueError(f"no phrasing of {t.text!r} parsed back to the same task")


def train_phrasing_templates(world: str, name: str) -> list[str]:
    """Every template of the train phrasing set ``name`` of ``world`` (its slots as written:
    ``{d}``, ``{q}``, ``{a}``, ``{}``); a set without an entry for ``world`` gives none."""
    if world == "general":
        g = GENERAL_TRAIN_PHRASING_SETS.get(name)
        if g is None:
            return []
        return [*g.open, *g.search, *(t for held in g.search.values() for t in held)]
    p = TRAIN_PHRASING_SETS[name]
    return [*p.level1, *p.level2, *p.select]
