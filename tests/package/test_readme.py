"""The README and docs/ name only what exists (issue 49, item 2).

Every repository path the README names (in a link, in backticks, in a code block), every
``python X.py`` script and ``python -m digirl_lite...`` module it runs, and every anchor it
links to must exist; a missing one fails naming the README's line. The README stays short (at
most 250 lines) and carries no commit hash and no issue number: those belong to docs/, whose
links, paths, scripts and modules must exist too. Reads files only: nothing is imported from
the package, no model is loaded.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_README_LINES = 250

#: top-level folders of the repository whose paths the README may name
REPO_DIRS = ("recipes", "benchmarks", "docs", "digirl_lite", "tests", "data", "notebooks", ".ci")
_DIRS = "|".join(re.escape(d) for d in REPO_DIRS)
_PATH = re.compile(rf"(?<![\w./-])((?:{_DIRS})/[\w./-]*)")
_SCRIPT = re.compile(r"\bpython3?\s+((?:[\w.-]+/)*[\w.-]+\.py)\b")
_MODULE = re.compile(r"\bpython3?\s+-m\s+(digirl_lite(?:\.\w+)*)")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
_ISSUE = re.compile(r"\bissues?\s*#?\s*\d+|(?<![\w&/])#\d+\b|/(?:issues|pull)/\d+", re.I)


def _looks_like_path(token: str) -> bool:
    """A folder (ends with /) or a file (its last part has an extension); a Gymnasium id such
    as ``digirl_lite/SimPhone-v0`` is neither."""
    last = token.rsplit("/", 1)[-1]
    return token.endswith("/") or re.search(r"\.[A-Za-z0-9]+$", last) is not None


def slugs(text: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown text (fenced code skipped)."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def link_problems(text: str, where: Path) -> list[str]:
    """Each relative link of ``text`` (a Markdown file at ``where``) whose file or anchor does
    not exist, as ``name:line: ...``."""
    problems = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for target in _LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (where.parent / path).resolve() if path else where
            label = f"{where.name}:{lineno}"
            if not dest.exists():
                problems.append(f"{label}: link to {target!r}: no {path}")
            elif anchor and dest.suffix == ".md" and anchor not in slugs(dest.read_text()):
                problems.append(f"{label}: link to {target!r}: {dest.name} has no heading "
                                f"#{anchor}")
    return problems


def name_problems(text: str, root: Path = ROOT, label: str = "README.md") -> list[str]:
    """Each repository path, ``python X.py`` script and ``python -m digirl_lite...`` module
    that ``text`` names and ``root`` does not hold, as ``label:line: ...`` (a placeholder
    script, ``python path/to/...``, is not checked)."""
    problems = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        scripts = [x for x in _SCRIPT.findall(line) if not x.startswith("path/to/")]
        for script in scripts:
            if not (root / script).is_file():
                problems.append(f"{label}:{lineno}: runs python {script}, which does not exist")
        for token in _PATH.findall(line):
            token = token.rstrip(".,;:")
            if token in scripts or not _looks_like_path(token):
                continue
            if not (root / token).exists():
                problems.append(f"{label}:{lineno}: names {token}, which does not exist")
        for module in _MODULE.findall(line):
            base = root.joinpath(*module.split("."))
            if not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()):
                problems.append(f"{label}:{lineno}: runs python -m {module}, which does not "
                                "exist")
    return problems


def reference_problems(text: str, label: str = "README.md") -> list[str]:
    """Commit hashes and issue numbers in ``text``, as ``label:line: ...``."""
    problems = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for h in _HASH.findall(line):
            problems.append(f"{label}:{lineno}: a commit hash, {h}")
        for m in _ISSUE.finditer(line):
            problems.append(f"{label}:{lineno}: an issue number, {m.group(0)!r}")
    return problems


def test_the_readme_is_at_most_250_lines():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES})"


def test_every_path_script_and_module_the_readme_names_exists():
    problems = name_problems(README.read_text())
    assert not problems, "\n".join(problems)


def test_every_link_of_the_readme_resolves():
    problems = link_problems(README.read_text(), README)
    assert not problems, "\n".join(problems)


def test_the_readme_has_no_commit_hash_and_no_issue_number():
    problems = reference_problems(README.read_text())
    assert not problems, "\n".join(problems)


def test_the_readme_links_every_docs_page():
    text = README.read_text()
    missing = [p.name for p in DOCS if f"(docs/{p.name}" not in text]
    assert DOCS and not missing, f"docs pages the README does not link: {missing}"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_link_of_a_docs_page_resolves(page):
    problems = link_problems(page.read_text(), page)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_path_script_and_module_a_docs_page_names_exists(page):
    problems = name_problems(page.read_text(), label=f"docs/{page.name}")
    assert not problems, "\n".join(problems)


def test_a_missing_name_fails_naming_its_line(tmp_path):
    """Bad input: a README naming a recipe, a path, a module and a link that do not exist,
    with a commit hash and an issue number, is refused line by line."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "real.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n")
    text = ("# T\n"
            "python recipes/real.py\n"
            "python recipes/missing.py --quick\n"
            "see `benchmarks/results/nothing.json`\n"
            "python -m digirl_lite.nowhere\n"
            "gym id `digirl_lite/SimPhone-v0` is not a path\n"
            "[ok](docs/a.md#a-page) [bad](docs/b.md) [bad anchor](docs/a.md#nope)\n"
            "fixed at 90e6a9f in issue 49 and #12\n")
    readme = tmp_path / "README.md"
    readme.write_text(text)
    names = name_problems(text, root=tmp_path)
    assert names == [
        "README.md:3: runs python recipes/missing.py, which does not exist",
        "README.md:4: names benchmarks/results/nothing.json, which does not exist",
        "README.md:5: runs python -m digirl_lite.nowhere, which does not exist",
        "README.md:7: names docs/b.md, which does not exist",
    ]
    links = link_problems(text, readme)
    assert len(links) == 2 and all(p.startswith("README.md:7: ") for p in links), links
    refs = reference_problems(text)
    assert len(refs) == 3 and all(p.startswith("README.md:8: ") for p in refs), refs


def test_the_readme_states_the_measured_time_of_the_first_command():
    """The README's time figure is the one benchmarks/main_job_time.py wrote from a fresh
    clone (issue 49, item 1): between its markers stands exactly the sentence built from the
    ``fresh_clone`` entry of benchmarks/results/main_job_time.json."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("main_job_time",
                                                  ROOT / "benchmarks" / "main_job_time.py")
    mjt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mjt)  # standard library only at import
    record = json.loads((ROOT / "benchmarks" / "results" / "main_job_time.json")
                        .read_text())["fresh_clone"]
    text = README.read_text()
    assert mjt.readme_with_figure(text, record) == text, (
        "the README's time figure differs from main_job_time.json's fresh_clone entry: "
        "run python benchmarks/main_job_time.py --readme")
