"""The README is a short product page and docs/ holds the rest, the dated lab log apart in
docs/notebook/: these checks fail when either drifts (a long README, a broken Spaces header, a dead
link, a session log in a user page, a pointer to notes outside the repository)."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))  # the user pages: the README links each
NOTEBOOK = sorted((REPO / "docs" / "notebook").glob("*.md"))  # the dated lab log they quote
TOOLS = sorted((REPO / "tools").rglob("README.md"))  # development tooling, outside the package
PAGES = [README, *DOCS, *NOTEBOOK, *TOOLS]
# A dated session heading ("### Session 3 (2026-11-26): ...", "## The first device session (...)")
SESSION_LOG = re.compile(r"^#+ .*\bsession\b.*\(\d{4}-\d{2}-\d{2}", re.IGNORECASE | re.MULTILINE)
# Private notes that live outside the repository: nothing shipped may point at them.
OUTSIDE = ("../shared", "ALGORITHMS.md", "DESIGN.md", "ECOSYSTEM.md")
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def first_line(lines: list[str], wanted: str) -> int | None:
    """1-based number of the first line that is exactly ``wanted`` (stripped), or None."""
    return next((i for i, line in enumerate(lines, 1) if line.strip() == wanted), None)


def front_matter() -> str:
    text = README.read_text(encoding="utf-8")
    assert text.startswith("---\n"), "README.md must open with the Spaces front matter (---)"
    end = text.find("\n---\n", 3)
    assert end > 0, "the front matter has no closing ---"
    return text[4 : end + 1]


def parse_front_matter(block: str) -> dict:
    try:
        import yaml
    except ImportError:  # top-level `key: value` lines only; lists and nesting are not needed here
        data = {}
        for line in block.splitlines():
            if line and not line[0].isspace() and ":" in line:
                key, value = line.split(":", 1)
                data[key.strip()] = value.strip().strip("\"'") or None
        return data
    data = yaml.safe_load(block)
    assert isinstance(data, dict), "the front matter is not a YAML mapping"
    return data


def relative_links(path: Path) -> list[str]:
    """Link targets of a Markdown page outside fenced code, without web links and pure anchors."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t for t in targets if not re.match(r"^(https?:|mailto:|#)", t)]


def test_the_docs_exist():
    names = {p.name for p in DOCS}
    assert {"method.md", "design.md", "testing.md", "hosting.md", "tar.md", "training.md"} <= names
    assert (REPO / "docs" / "notebook" / "README.md") in NOTEBOOK


def test_session_logs_live_in_the_notebook():
    logged = [p.name for p in [README, *DOCS] if SESSION_LOG.search(FENCE.sub("", p.read_text(encoding="utf-8")))]
    assert not logged, f"dated session logs belong in docs/notebook/, not in {logged}"
    assert SESSION_LOG.search("x\n### Session 3 (2026-11-26): every stage trained\n")  # the check has power
    assert all(SESSION_LOG.search(p.read_text(encoding="utf-8")) for p in NOTEBOOK if p.stem == "emoji-family")


def test_the_notebook_lists_its_pages():
    index = (REPO / "docs" / "notebook" / "README.md").read_text(encoding="utf-8")
    linked = {t.split("#")[0] for t in relative_links(REPO / "docs" / "notebook" / "README.md")}
    missing = [p.name for p in NOTEBOOK if p.name != "README.md" and p.name not in linked]
    assert index and not missing, f"docs/notebook/README.md does not list {missing}"


def test_readme_is_short_and_leads_with_the_commands_and_results():
    lines = lines_of(README)
    assert len(lines) <= 200, f"README.md has {len(lines)} lines (at most 200)"
    head = lines[:80]
    for heading in ("## Run the demo", "## Run the tests", "## Results"):
        at = first_line(lines, heading)
        assert at is not None and at <= 80, f"{heading!r} must be within the first 80 lines (found at {at})"
    demo, tests = first_line(lines, "## Run the demo"), first_line(lines, "## Run the tests")
    assert any("python app.py" in line for line in head[demo:]), "the demo command must follow its heading"
    assert any(line.strip().startswith("python -m pytest -q") for line in head[tests:]), "the test command must follow"


def test_readme_links_every_doc():
    linked = {(README.parent / t.split("#")[0]).resolve() for t in relative_links(README)}
    missing = [p.name for p in DOCS if p.resolve() not in linked]
    assert not missing, f"README.md does not link {missing}"


def test_spaces_front_matter_parses_and_pins_the_installed_gradio():
    data = parse_front_matter(front_matter())
    assert data.get("sdk") == "gradio"
    assert data.get("app_file") == "app.py"
    assert (REPO / str(data["app_file"])).is_file()
    assert str(data.get("sdk_version")) == version("gradio"), "sdk_version must be the installed gradio"


def broken_links(folder: Path, targets: list[str]) -> list[str]:
    """The targets (relative to ``folder``) that name no file or folder inside the repository."""
    broken = []
    for target in targets:
        path = (folder / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
        elif path != REPO and REPO not in path.parents:
            broken.append(f"{target} (outside the repository)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path):
    broken = broken_links(page.parent, relative_links(page))
    assert not broken, f"{page.name}: links that resolve to nothing in the repository: {broken}"


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated one numbered (``-1``, ``-2``)."""
    anchors, counts = set(), {}
    for heading in re.findall(r"^#+\s+(.+?)\s*#*$", FENCE.sub("", path.read_text(encoding="utf-8")), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        repeat = counts.get(slug, 0)
        counts[slug] = repeat + 1
        anchors.add(slug if repeat == 0 else f"{slug}-{repeat}")
    return anchors


def broken_anchors(page: Path) -> list[str]:
    """Links to a heading of a Markdown page (``file.md#anchor`` or ``#anchor``) that names none."""
    local = re.findall(r"\]\((#[^)\s]+)\)", FENCE.sub("", page.read_text(encoding="utf-8")))
    broken = []
    for target in relative_links(page) + local:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if anchor and file.suffix == ".md" and file.is_file() and anchor not in heading_anchors(file):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_anchors_name_a_heading(page: Path):
    assert not broken_anchors(page), f"{page.name}: anchors that name no heading: {broken_anchors(page)}"


def test_the_anchor_check_has_power(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# A title\n## Data (`x.py`)\n## Data (`x.py`)\n[a](#a-title) [b](#data-xpy-1) [c](#gone)\n")
    assert heading_anchors(page) == {"a-title", "data-xpy", "data-xpy-1"}
    assert broken_anchors(page) == ["#gone"]


def test_the_link_check_has_power(tmp_path):
    page = REPO / "docs" / "page.md"  # never written: only its folder matters
    assert broken_links(page.parent, ["method.md", "../tests/data/golden_tar/PROVENANCE.md#x"]) == []
    assert broken_links(page.parent, ["metod.md", "../README.md#x"]) == ["metod.md"]
    outside = tmp_path / "x.md"
    outside.write_text("x")
    assert broken_links(REPO, [str(outside)]) == [f"{outside} (outside the repository)"]
    fake = tmp_path / "fake.md"
    fake.write_text("[a](gone.md#x) [b](https://e.org) [c](#top)\n```\n[d](in-code.md)\n```\n")
    assert relative_links(fake) == ["gone.md#x"]
    assert any("PROVENANCE.md" in t for t in relative_links(REPO / "docs" / "testing.md"))


def shipped_text_files() -> list[Path]:
    files = [*PAGES, REPO / "app.py"]
    files += [p for p in (REPO / "mulo").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return files


def test_nothing_points_outside_the_repository():
    found = []
    for path in shipped_text_files():
        text = path.read_bytes().decode("utf-8", errors="ignore")
        found += [f"{path.relative_to(REPO)}: {name}" for name in OUTSIDE if name in text]
    assert not found, f"pointers to notes outside the repository: {found}"


def test_readme_holds_the_ci_test_command():
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    commands = re.findall(r"^(?:\w+=\S+\s+)*(python -m pytest\b[^\n#]*)", script, re.MULTILINE)
    assert commands, ".ci/run runs no pytest command"
    readme = {line.strip() for line in lines_of(README)}
    for command in commands:
        assert command.strip() in readme, f"README.md must give .ci/run's test command {command.strip()!r}"


def modules_missing_from_design(table: str, root: Path) -> list[str]:
    """The package's modules that design.md's module table does not name: a module counts as named
    when its file name appears in the table or a row stands for its whole folder (``mulo/methods/``)."""
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    folders = {
        cell.strip("`/ ") for line in rows for cell in line.split("|")[1].split(",") if cell.strip().endswith("/`")
    }
    named = " ".join(rows)
    missing = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        if path.name == "__init__.py" or any(str(rel.parent).startswith(f) for f in folders):
            continue
        if f"{path.name}`" not in named and f"{path.stem}`" not in named:
            missing.append(str(rel))
    return missing


def test_design_names_every_module():
    """docs/design.md's table of modules follows the layout: a module added or moved is named there."""
    design = (REPO / "docs" / "design.md").read_text()
    table = design[design.index("## What is here") :]
    table = table[: table.index("\n## ", 3)]
    assert modules_missing_from_design(table, REPO / "mulo") == []
    # the check has power: a table without the engine's row misses the engine
    without = "\n".join(line for line in table.splitlines() if "`mulo/engine.py`" not in line)
    assert "mulo/engine.py" in modules_missing_from_design(without, REPO / "mulo")
