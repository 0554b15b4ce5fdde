"""Make the simulator's task sets: Web Shopping and General, train and test, from a seed.

The lists follow the shape of the AitW lists the DigiRL paper uses (Section 5): Web Shopping
instructions at three levels per product (go to a site; and search for the product; and select
the first entry), General questions answered by searching Google plus opening the phone's apps.
The vocabulary is made here, not copied from AitW. Train and test share no product and no
search topic (a city, a country, a shop, ...); open-app tasks may repeat across the split, the
phone has only a few apps. Beside the test lists, held-out splits: Web Shopping's unseen
products and phrasings (and a final phrasing split), General's unseen names (searches naming
only :data:`UNSEEN_NAMES`) and unseen phrasings (the test list in
:data:`~digirl_lite.envs.sim.phrasings.GENERAL_HELD_OUT_PHRASINGS`).

    .venv/bin/python recipes/make_task_sets.py --seed 0      # -> digirl_lite/assets/tasks
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from digirl_lite.envs.sim.catalog import APPS, HELD_OUT_SITES, SITES, TRAIN_SITES
from digirl_lite.envs.sim.phrasings import (
    FINAL_PHRASINGS,
    GENERAL_HELD_OUT_PHRASINGS,
    HELD_OUT_PHRASINGS,
    rephrase,
    rephrase_general,
)
from digirl_lite.envs.sim.tasks import parse_task
from digirl_lite.paths import data_dir

# Sizes: Web Shopping as AitW's webshop_train (146 products x 3 levels = 438 lines); the test
# list holds 60 products (180 lines), more than the paper's 96 evaluation lines.
WEBSHOP_TRAIN_PRODUCTS = 146
WEBSHOP_TEST_PRODUCTS = 60
GENERAL_TRAIN = (255, 45)  # (search lines, open-app lines)
GENERAL_TEST = (100, 20)
DOUBLE_QUOTE_P = 0.8  # AitW mixes quote styles: its train list uses "..", its test list '..'
KIND_WORD_P = 0.6  # how often the product kind is written ("sony wh-1000xm4 headphones")

# kind -> brand -> model names. A product is one (brand, model) pair, so a train product and a
# test product never differ only by the kind word.
PRODUCTS: dict[str, dict[str, list[str]]] = {
    "headphones": {
        "sony": ["wh-1000xm4", "wh-1000xm5", "wh-ch720n", "mdr-7506"],
        "bose": ["quietcomfort 45", "quietcomfort ultra", "700", "soundlink around-ear"],
        "sennheiser": ["momentum 4", "hd 450bt", "hd 560s", "accentum"],
        "jbl": ["tune 760nc", "live 660nc", "tour one m2"],
        "audio-technica": ["ath-m50x", "ath-m40x", "ath-m20x"],
    },
    "earbuds": {
        "jabra": ["elite 85t", "elite 7 pro", "elite 4 active"],
        "samsung": ["galaxy buds2 pro", "galaxy buds fe", "galaxy buds live"],
        "anker": ["soundcore liberty 4", "soundcore space a40", "soundcore life p3"],
        "skullcandy": ["indy evo", "sesh evo", "dime 3"],
    },
    "mouse": {
        "logitech": ["g pro", "g502 hero", "mx master 3s", "g305", "mx anywhere 3"],
        "razer": ["deathadder v3", "basilisk v3", "viper mini", "naga pro"],
        "steelseries": ["rival 3", "aerox 5", "prime mini"],
        "corsair": ["m65 rgb elite", "harpoon rgb", "katar pro"],
    },
    "keyboard": {
        "keychron": ["k2", "k8 pro", "q1", "v6"],
        "ducky": ["one 3 mini", "one 2 sf", "shine 7"],
        "steelseries": ["apex pro tkl", "apex 3", "apex 7"],
        "hyperx": ["alloy origins", "alloy elite 2", "alloy core rgb"],
    },
    "monitor": {
        "dell": ["s2721dgf", "u2723qe", "p2422h"],
        "lg": ["27gp850-b", "32un880-b", "24gn600-b"],
        "asus": ["tuf vg27aq", "proart pa278cv", "rog swift pg27aqdm"],
        "benq": ["ex2780q", "pd2705u", "gw2480"],
    },
    "laptop": {
        "lenovo": ["thinkpad x1 carbon", "ideapad slim 5", "legion 5 pro", "yoga 7i"],
        "hp": ["spectre x360", "envy 13", "pavilion 15", "omen 16"],
        "acer": ["swift 3", "aspire 5", "predator helios 300", "nitro 5"],
        "msi": ["stealth 15m", "katana 15", "prestige 14"],
    },
    "tablet": {
        "apple": ["ipad air", "ipad mini 6", "ipad pro 11"],
        "amazon": ["fire hd 10", "fire 7", "fire max 11"],
        "microsoft": ["surface go 3", "surface pro 9"],
    },
    "phone": {
        "google": ["pixel 7a", "pixel 8 pro", "pixel fold"],
        "motorola": ["moto g power", "edge plus", "razr plus"],
        "oneplus": ["11", "nord n30", "open"],
        "nothing": ["phone 2", "phone 1"],
    },
    "smartwatch": {
        "garmin": ["forerunner 255", "venu 2", "fenix 7", "instinct 2"],
        "fitbit": ["versa 4", "sense 2", "charge 6", "inspire 3"],
        "amazfit": ["gts 4", "bip 5", "gtr mini"],
    },
    "speaker": {
        "ultimate ears": ["boom 3", "wonderboom 3", "megaboom 3"],
        "marshall": ["emberton ii", "stanmore iii", "acton iii"],
        "sonos": ["era 100", "roam", "move 2"],
        "harman kardon": ["onyx studio 8", "aura studio 3"],
    },
    "tv": {
        "tcl": ["6-series 55", "4-series 43", "q7 65"],
        "hisense": ["u8h 65", "a6 50", "u7k 55"],
        "vizio": ["m-series 50", "v-series 43", "p-series quantum 65"],
    },
    "camera": {
        "canon": ["eos r50", "eos r6 mark ii", "powershot g7 x"],
        "nikon": ["z50", "z fc", "d7500"],
        "fujifilm": ["x-t30 ii", "x100v", "instax mini 12"],
        "gopro": ["hero 11 black", "hero 12 black", "max"],
    },
    "router": {
        "netgear": ["nighthawk ax12", "orbi rbk752", "nighthawk rax50"],
        "tp-link": ["archer ax55", "deco x20", "archer c80"],
        "eero": ["pro 6e", "6 plus"],
    },
    "ssd": {
        "samsung": ["970 evo plus", "990 pro", "t7 shield"],
        "crucial": ["p3 plus", "mx500", "x9 pro"],
        "western digital": ["sn850x", "blue sn570", "my passport"],
        "sandisk": ["extreme portable", "ultra 3d"],
    },
    "graphics card": {
        "nvidia": ["rtx 4070", "rtx 4060 ti", "rtx 3060"],
        "amd": ["radeon rx 7800 xt", "radeon rx 6700 xt", "radeon rx 7600"],
        "zotac": ["gaming rtx 4070 twin edge", "gaming rtx 3050"],
    },
    "controller": {
        "xbox": ["wireless", "elite series 2"],
        "8bitdo": ["pro 2", "ultimate", "sn30 pro"],
        "powera": ["enhanced wired", "fusion pro 3"],
    },
    "printer": {
        "brother": ["hl-l2350dw", "mfc-l3770cdw", "hl-l8360cdw"],
        "epson": ["ecotank et-2850", "workforce wf-2950", "expression home xp-4200"],
        "canon": ["pixma tr4720", "imageclass mf743cdw"],
    },
    "vacuum": {
        "dyson": ["v8", "v15 detect", "ball animal 3"],
        "shark": ["navigator lift-away", "rocket pro", "ai ultra"],
        "irobot": ["roomba 694", "roomba j7", "roomba combo i5"],
    },
    "drone": {
        "dji": ["mini 3 pro", "mini 4 pro", "air 3", "avata 2"],
        "autel": ["evo lite plus", "evo nano"],
    },
    "webcam": {
        "logitech": ["c920", "brio 4k", "streamcam"],
        "razer": ["kiyo pro", "kiyo x"],
        "elgato": ["facecam", "facecam mk.2"],
    },
    "e-reader": {
        "kobo": ["clara 2e", "libra 2", "sage"],
        "boox": ["note air 3", "palma"],
    },
    "coffee maker": {
        "keurig": ["k-elite", "k-mini", "k-supreme"],
        "breville": ["barista express", "bambino plus"],
        "nespresso": ["vertuo next", "essenza mini"],
    },
}

# The held-out split webshop_unseen_products (issue 32, item 5): kinds and brands no train or
# test product has, a quarter of them on shops no train or test task names (HELD_OUT_SITES).
UNSEEN_PRODUCTS: dict[str, dict[str, list[str]]] = {
    "air fryer": {"cosori": ["pro le 5", "turboblaze"], "ninja": ["af101", "foodi dualzone"],
                  "instant": ["vortex plus", "vortex mini"]},
    "blender": {"vitamix": ["e310", "a3500"], "nutribullet": ["pro 900", "blender combo"],
                "oster": ["pro 1200"]},
    "electric toothbrush": {"oral-b": ["io series 9", "pro 1000"],
                            "philips sonicare": ["4100", "diamondclean 9000"]},
    "guitar": {"fender": ["player stratocaster", "cd-60s"], "yamaha": ["fg800", "pacifica 112v"],
               "gibson": ["les paul standard"]},
    "stroller": {"uppababy": ["vista v2", "minu v2"], "graco": ["modes pramette"],
                 "bugaboo": ["fox 5"]},
    "mattress": {"casper": ["original", "wave hybrid"], "purple": ["restore plus"],
                 "tempur-pedic": ["tempur-adapt"]},
    "treadmill": {"nordictrack": ["commercial 1750", "t series 6.5s"], "sole": ["f80"],
                  "horizon": ["7.0 at"]},
    "sewing machine": {"singer": ["heavy duty 4423", "start 1304"], "janome": ["hd3000"],
                       "juki": ["hzl-f600"]},
    "electric bike": {"rad power": ["radrunner 3 plus"], "aventon": ["level.2", "pace 500.3"],
                      "lectric": ["xp 3.0"]},
    "projector": {"viewsonic": ["px701-4k"], "xgimi": ["horizon ultra", "mogo 2 pro"],
                  "optoma": ["uhd38x"]},
    "smart lock": {"august": ["wi-fi smart lock"], "schlage": ["encode plus"],
                   "yale": ["assure lock 2"]},
    "grill": {"weber": ["spirit ii e-310", "genesis e-325s"], "traeger": ["pro 575"],
              "char-broil": ["performance 4-burner"]},
}
UNSEEN_PRODUCT_COUNT = 48

# General: search templates, one topic slot each; a slot's pool is split between train and test.
TOPICS: dict[str, list[str]] = {
    "city": [
        "Boston", "Denver", "Phoenix", "Portland", "Nashville", "Houston", "Seattle", "Chicago",
        "Atlanta", "Miami", "Dallas", "Austin", "Minneapolis", "Baltimore", "Pittsburgh",
        "Cleveland", "Detroit", "Orlando", "Tampa", "Honolulu", "Anchorage", "Toronto",
        "Vancouver", "Montreal", "London", "Paris", "Berlin", "Madrid", "Lisbon", "Rome",
        "Vienna", "Prague", "Warsaw", "Dublin", "Edinburgh", "Amsterdam", "Brussels",
        "Copenhagen", "Stockholm", "Oslo", "Helsinki", "Athens", "Istanbul", "Cairo",
        "Nairobi", "Lagos", "Mumbai", "Delhi", "Bangkok", "Singapore", "Seoul", "Tokyo",
        "Osaka", "Beijing", "Shanghai", "Sydney", "Melbourne", "Auckland", "Lima", "Bogota",
    ],
    "country": [
        "Canada", "Brazil", "Argentina", "Chile", "Peru", "Colombia", "Venezuela", "Cuba",
        "Jamaica", "Iceland", "Ireland", "Norway", "Sweden", "Finland", "Denmark", "Poland",
        "Germany", "Austria", "Switzerland", "Italy", "Spain", "Portugal", "Greece", "Turkey",
        "Egypt", "Morocco", "Kenya", "Nigeria", "Ghana", "Ethiopia", "Israel", "Jordan",
        "Pakistan", "Nepal", "Vietnam", "Thailand", "Malaysia", "Indonesia", "the Philippines",
        "Australia", "New Zealand", "Fiji", "Mongolia", "Kazakhstan", "Ukraine", "Romania",
        "Hungary", "Croatia",
    ],
    "restaurant": [
        "Taco Bell", "Wendy's", "Chipotle", "Panera Bread", "Subway", "Five Guys",
        "Shake Shack", "Olive Garden", "Chick-fil-A", "Popeyes", "Domino's", "Pizza Hut",
        "Starbucks", "Dunkin'", "Arby's", "Sonic", "Applebee's", "Denny's", "IHOP",
        "In-N-Out", "Panda Express", "Jimmy John's", "Culver's", "Red Lobster",
    ],
    "store": [
        "Home Depot", "Walgreens", "CVS", "Kroger", "Whole Foods", "Trader Joe's", "IKEA",
        "Staples", "Apple Store", "T-Mobile store", "AT&T store", "Barnes & Noble",
        "GameStop", "Petco", "REI", "Dick's Sporting Goods", "Macy's", "Kohl's",
        "Office Depot", "Ace Hardware",
    ],
    "item": [
        "yoga mat", "rain jacket", "picnic blanket", "desk chair", "coffee mug", "backpack",
        "pair of sunglasses", "wool scarf", "water bottle", "hammock", "camping tent",
        "leather wallet", "table lamp", "throw pillow", "bath robe", "pair of hiking boots",
        "cutting board", "wall clock", "umbrella", "lunch box", "bike helmet", "suitcase",
    ],
    "cuisine": [
        "Thai", "Vietnamese", "Ethiopian", "Lebanese", "Peruvian", "Turkish", "Indian",
        "Mexican", "Italian", "Japanese", "Spanish", "Brazilian", "Moroccan", "Greek",
        "Korean", "Cuban",
    ],
    "field": [
        "quantum computing", "climate science", "robotics", "genetics", "neuroscience",
        "renewable energy", "oceanography", "archaeology", "particle physics", "virology",
        "materials science", "volcanology", "paleontology", "cybersecurity",
    ],
    "thing": [
        "the sun", "Jupiter", "Mars", "Saturn", "the Pacific Ocean", "Mount Everest",
        "the Amazon river", "the Sahara desert", "a blue whale", "Lake Superior",
        "the Grand Canyon", "Antarctica", "the Eiffel Tower", "a neutron star",
    ],
    "device": [
        "Samsung TV", "Sony TV", "Roku stick", "Kindle Paperwhite", "Nintendo Switch",
        "PlayStation 5", "Xbox Series X", "Apple Watch", "Instant Pot", "Peloton bike",
        "Ring doorbell", "Google Nest Hub",
    ],
}

SEARCH_TEMPLATES: list[tuple[str, str]] = [
    ("country", "What's the news in {}?"),
    ("country", "What is the capital of {}?"),
    ("country", "Google the capital of {}"),
    ("country", "What's the population of {}?"),
    ("city", "What's the weather like in {}?"),
    ("city", "Search for hotels in {}"),
    ("city", "What time is it in {}?"),
    ("city", "What's a good restaurant in {}?"),
    ("city", "How much does a 2 bedroom apartment rent for in {}?"),
    ("city", "How much does a 3 bedroom apartment rent for in {}?"),
    ("city2", "Search for flights from {} to {}"),
    ("restaurant", "What's on the menu at {}?"),
    ("restaurant", "What time does {} close?"),
    ("store", "How do I get to the nearest {}?"),
    ("store", "Find the nearest {}"),
    ("item", "Where can I buy a nice {}?"),
    ("item", "Search for a new {}"),
    ("cuisine", "Search for good {} restaurants"),
    ("cuisine", "What's a good {} recipe for dinner?"),
    ("field", "What's the latest news in {}?"),
    ("thing", "How big is {}?"),
    ("thing", "How far away is {}?"),
    ("device", "What's the price of the {}?"),
    ("device", "How much does the {} cost?"),
]

OPEN_TEMPLATES = ["Open the {}", "Open {}", "Open the {} app", "Launch {}", "Launch the {} app"]

# The held-out split general_unseen_names (issue 47, item 1): for every slot of TOPICS, names
# no train or test task has. Each name's words (its article aside) are in neither list, and at
# least one of them (here: every one) is a word the starting policy's demonstrations and copy
# drills cannot write (envs/sim/drills.py's _vary_query puts a word of a train query or a made-up
# one, four to eight letters or a model number, in a name's place): nine letters or more, or
# an apostrophe or hyphen (tests/sim/test_generalization_splits.py checks both).
UNSEEN_NAMES: dict[str, list[str]] = {
    "city": [
        "Johannesburg", "Philadelphia", "Albuquerque", "Indianapolis", "Guadalajara",
        "Casablanca", "Kathmandu", "Reykjavik", "Barcelona", "Frankfurt", "Marseille",
        "Ljubljana", "Montevideo", "Hyderabad", "Bangalore", "Hiroshima",
    ],
    "country": [
        "Madagascar", "Mozambique", "Bangladesh", "Uzbekistan", "Azerbaijan", "Luxembourg",
        "Guatemala", "Nicaragua", "Montenegro", "Lithuania",
    ],
    "restaurant": ["McDonald's", "Whataburger", "Bojangles", "Hardee's", "Zaxby's"],
    "store": ["Lowe's", "Nordstrom", "Bloomingdale's", "Albertsons", "Marshalls",
              "Sherwin-Williams"],
    "item": ["skateboard", "telescope", "harmonica", "typewriter", "wheelbarrow", "trampoline",
             "microscope"],
    "cuisine": ["Caribbean", "Taiwanese", "Cambodian", "Senegalese", "Scandinavian",
                "Mediterranean", "Polynesian", "Cantonese"],
    "field": ["astrophysics", "biochemistry", "epidemiology", "meteorology", "seismology",
              "cryptography", "linguistics"],
    "thing": ["Kilimanjaro", "Stonehenge", "the Colosseum", "the Serengeti", "Yellowstone",
              "Andromeda", "the Himalayas", "Greenland"],
    "device": ["Chromecast", "Chromebook", "Thermomix", "Tamagotchi", "Stairmaster",
               "Hoverboard"],
}
UNSEEN_NAMES_SIZE = (40, 8)  # (search lines, open-app lines): the test list's mix, 5 to 1


def _split(items: list, n_test: int, rng: random.Random) -> tuple[list, list]:
    items = sorted(items)
    rng.shuffle(items)
    return items[n_test:], items[:n_test]


def webshop_products(seed: int) -> tuple[list[str], list[str]]:
    """The train and test products (disjoint brand-model pairs), as written in instructions."""
    rng = random.Random(seed)
    pairs = sorted({(kind, brand, model) for kind, brands in PRODUCTS.items()
                    for brand, models in brands.items() for model in models})
    need = WEBSHOP_TRAIN_PRODUCTS + WEBSHOP_TEST_PRODUCTS
    if len(pairs) < need:
        raise ValueError(f"vocabulary has {len(pairs)} products, need {need}")
    rng.shuffle(pairs)
    names = []
    for kind, brand, model in pairs[:need]:
        names.append(f"{brand} {model} {kind}" if rng.random() < KIND_WORD_P
                     else f"{brand} {model}")
    return names[:WEBSHOP_TRAIN_PRODUCTS], names[WEBSHOP_TRAIN_PRODUCTS:]


def webshop_lines(products: list[str], rng: random.Random) -> list[str]:
    """Three lines per product on one random site, levels 1, 2, 3 together (as in AitW)."""
    domains = [SITES[k].domain for k in TRAIN_SITES]
    lines = []
    for product in products:
        domain = rng.choice(domains)
        q = '"' if rng.random() < DOUBLE_QUOTE_P else "'"
        lines += [
            f"Go to {domain}",
            f"Go to {domain}, search for {q}{product}{q}",
            f"Go to {domain}, search for {q}{product}{q}, and select the first entry",
        ]
    return lines


def general_topics(seed: int) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Each topic pool split 70/30 into train and test topics."""
    rng = random.Random(seed + 1)
    train, test = {}, {}
    for slot, pool in TOPICS.items():
        train[slot], test[slot] = _split(pool, max(2, round(0.3 * len(pool))), rng)
    return train, test


def _search_lines(topics: dict[str, list[str]], n: int, rng: random.Random) -> list[str]:
    lines: list[str] = []
    seen: set[str] = set()
    while len(lines) < n:
        slot, template = rng.choice(SEARCH_TEMPLATES)
        if slot == "city2":
            a, b = rng.sample(topics["city"], 2)
            line = template.format(a, b)
        else:
            line = template.format(rng.choice(topics[slot]))
        if line not in seen:
            seen.add(line)
            lines.append(line)
    return lines


def _app_names() -> dict[str, list[str]]:
    """How people call each app: its label and aliases (not "setting" beside "Settings")."""
    out = {}
    for a in APPS.values():
        names = [a.label] + [x for x in a.aliases if x != a.label.lower()
                             and x + "s" != a.label.lower()]
        out[a.key] = names
    return out


def _open_lines(n: int, rng: random.Random) -> list[str]:
    """Every app at least once (n >= number of apps), then random phrasings; no repeats."""
    names = _app_names()
    keys = sorted(names)
    lines: list[str] = []
    seen: set[str] = set()
    i = 0
    while len(lines) < n:
        key = keys[i] if i < len(keys) else rng.choice(keys)
        line = rng.choice(OPEN_TEMPLATES).format(rng.choice(names[key]))
        if line not in seen:
            seen.add(line)
            lines.append(line)
            i += 1
    return lines


def unseen_products_lines(seed: int) -> list[str]:
    """The held-out split ``webshop_unseen_products``: :data:`UNSEEN_PRODUCTS` in the test
    list's shape (three levels per product on one shop), every fourth product on a held-out
    shop (:data:`~digirl_lite.envs.sim.catalog.HELD_OUT_SITES`)."""
    rng = random.Random(seed + 32)
    pairs = sorted({(kind, brand, model) for kind, brands in UNSEEN_PRODUCTS.items()
                    for brand, models in brands.items() for model in models})
    if len(pairs) < UNSEEN_PRODUCT_COUNT:
        raise ValueError(f"UNSEEN_PRODUCTS has {len(pairs)} products, need "
                         f"{UNSEEN_PRODUCT_COUNT}")
    rng.shuffle(pairs)
    train_domains = [SITES[k].domain for k in TRAIN_SITES]
    held_domains = [SITES[k].domain for k in HELD_OUT_SITES]
    lines = []
    for i, (kind, brand, model) in enumerate(pairs[:UNSEEN_PRODUCT_COUNT]):
        product = f"{brand} {model} {kind}" if rng.random() < KIND_WORD_P else f"{brand} {model}"
        domain = rng.choice(held_domains if i % 4 == 3 else train_domains)
        q = '"' if rng.random() < DOUBLE_QUOTE_P else "'"
        lines += [f"Go to {domain}",
                  f"Go to {domain}, search for {q}{product}{q}",
                  f"Go to {domain}, search for {q}{product}{q}, and select the first entry"]
    return lines


def unseen_phrasings_lines(test_lines: list[str], seed: int) -> list[str]:
    """The held-out split ``webshop_unseen_phrasings``: line i is line i of the test list
    (same shop, product and level) written with :data:`HELD_OUT_PHRASINGS`, so its gap to
    the test list, task by task, is the phrasing's alone."""
    rng = random.Random(seed + 33)
    return [rephrase(line, HELD_OUT_PHRASINGS, rng) for line in test_lines]


def final_phrasings_lines(test_lines: list[str], seed: int) -> list[str]:
    """The final split ``webshop_final_phrasings``: line i is line i of the test list written
    with :data:`FINAL_PHRASINGS` (written after every design choice the held-out split served;
    evaluate on it once, for a claim)."""
    rng = random.Random(seed + 77)
    return [rephrase(line, FINAL_PHRASINGS, rng) for line in test_lines]


def general_unseen_names_lines(test_lines: list[str], seed: int) -> list[str]:
    """The held-out split ``general_unseen_names``: searches in the test list's templates
    (:data:`SEARCH_TEMPLATES`) naming only :data:`UNSEEN_NAMES`, and app opens in its open
    templates (the phone has few apps: these may open an app the test list opens, never with a
    line of it), shuffled; the test list's mix of the two."""
    rng = random.Random(seed + 47)
    n_search, n_open = UNSEEN_NAMES_SIZE
    searches = _search_lines(UNSEEN_NAMES, n_search, rng)
    names, taken = _app_names(), set(test_lines)
    opens: list[str] = []
    while len(opens) < n_open:
        key = rng.choice(sorted(names))
        line = rng.choice(OPEN_TEMPLATES).format(rng.choice(names[key]))
        if line not in taken:
            taken.add(line)
            opens.append(line)
    lines = searches + opens
    rng.shuffle(lines)
    return lines


def general_unseen_phrasings_lines(test_lines: list[str], seed: int) -> list[str]:
    """The held-out split ``general_unseen_phrasings``: line i is line i of the General test
    list (the same app; a search with the same content words and names) written with
    :data:`GENERAL_HELD_OUT_PHRASINGS`, so its gap to the test list, task by task, is the
    phrasing's alone."""
    rng = random.Random(seed + 48)
    return [rephrase_general(line, GENERAL_HELD_OUT_PHRASINGS, rng) for line in test_lines]


def build_task_sets(seed: int = 0) -> dict[str, list[str]]:
    """File name -> lines, deterministic from ``seed``; every line is checked to parse."""
    rng = random.Random(seed)
    train_products, test_products = webshop_products(seed)
    train_topics, test_topics = general_topics(seed)
    sets = {
        "webshop_train.txt": webshop_lines(train_products, rng),
        "webshop_test.txt": webshop_lines(test_products, rng),
    }
    sets["webshop_unseen_products.txt"] = unseen_products_lines(seed)
    sets["webshop_unseen_phrasings.txt"] = unseen_phrasings_lines(sets["webshop_test.txt"], seed)
    sets["webshop_final_phrasings.txt"] = final_phrasings_lines(sets["webshop_test.txt"], seed)
    for name, topics, (n_search, n_open) in (
        ("general_train.txt", train_topics, GENERAL_TRAIN),
        ("general_test.txt", test_topics, GENERAL_TEST),
    ):
        lines = _search_lines(topics, n_search, rng) + _open_lines(n_open, rng)
        rng.shuffle(lines)
        sets[name] = lines
    sets["general_unseen_names.txt"] = general_unseen_names_lines(sets["general_test.txt"], seed)
    sets["general_unseen_phrasings.txt"] = general_unseen_phrasings_lines(
        sets["general_test.txt"], seed)
    for name, lines in sets.items():
        for line in lines:
            parse_task(line)  # raises on a line the simulator would not accept
        if len(set(lines)) != len(lines) and name.startswith("general"):
            raise AssertionError(f"{name}: repeated lines")
    return sets


def main(argv: list[str] | None = None) -> dict[str, int]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(data_dir() / "tasks"),
                    help="output folder (made if absent; default: tasks/ in the package's "
                         "assets, or $DIGIRL_LITE_DATA)")
    ap.add_argument("--seed", type=int, default=0, help="everything is deterministic from it")
    args = ap.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, lines in build_task_sets(args.seed).items():
        (out / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        counts[name] = len(lines)
        print(f"{out / name}: {len(lines)} lines")
    return counts


if __name__ == "__main__":
    main()
