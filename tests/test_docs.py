"""The repository stands on its own.

* ``docs/bugs.md`` and the mutation catalogue (:mod:`specverify.mutants`) cannot drift: every
  name in the page's ``mutant`` / ``variant`` columns is a catalogue entry of its section's
  subject, and every deliberately wrong entry whose provenance is not specverify's own (its
  ``provenance`` does not start with ``"specverify"``) has a row in one of the page's subject
  sections -- an exact rule on the catalogue's fields, no fuzzy matching of provenance text.
* No file of the repository points outside it: no reference to the design notes of the
  machine the project was started on (only their copies under ``docs/``), no absolute path of
  one machine, and no relative Markdown link to a file that does not exist.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import specverify.mutants as mutants

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BUGS = ROOT / "docs/bugs.md"

#: A ``mutant`` cell without a mutant starts with this marker, followed by the reason.
NO_MUTANT = "\u2014"
LOSSY_KINDS = frozenset(pair[0] for pair in mutants.SUBJECTS.values())
EQUIVALENT_KINDS = frozenset(pair[1] for pair in mutants.SUBJECTS.values())
#: Heading (its start) of each section of docs/bugs.md -> the kinds its names may have.
SUBJECT_SECTIONS = {
    "Verifier": frozenset({mutants.SUBJECTS["verifier"][0]}),
    "Drafter": frozenset({mutants.SUBJECTS["drafter"][0]}),
    "Decoder": frozenset({mutants.SUBJECTS["decoder"][0]}),
    "Tree": frozenset({mutants.SUBJECTS["tree"][0]}),
}
OWN_SECTION = "Bug classes specverify adds"
SECTIONS = {
    **SUBJECT_SECTIONS,
    "Found by specverify's audits": LOSSY_KINDS,
    OWN_SECTION: LOSSY_KINDS,
    "Equivalent variants": EQUIVALENT_KINDS,
}
NAME_COLUMNS = ("mutant", "variant")
NAMES_CELL = re.compile(r"`[a-z0-9_]+`(?:, `[a-z0-9_]+`)*")


def _section(heading: str) -> str:
    for prefix in SECTIONS:
        if heading.startswith(prefix):
            return prefix
    raise AssertionError(f"docs/bugs.md: unknown section {heading!r} (known: {sorted(SECTIONS)})")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def bugs_rows() -> list[tuple[str, int, str]]:
    """``(section, line number, names cell)`` of every table row of docs/bugs.md."""
    lines = BUGS.read_text(encoding="utf-8").splitlines()
    rows, section, header = [], None, None
    for i, line in enumerate(lines, 1):
        if line.startswith("## "):
            section, header = _section(line[3:].strip()), None
        elif not line.startswith("|"):
            header = None
        elif header is None:
            header = _cells(line)
            assert section is not None, f"docs/bugs.md:{i}: a table before the first section"
            assert header[-1] in NAME_COLUMNS, f"docs/bugs.md:{i}: the last column must be one of {NAME_COLUMNS}"
        elif set(line.replace("|", "").strip()) <= set("-: "):
            continue  # the separator row
        else:
            cells = _cells(line)
            assert len(cells) == len(header), f"docs/bugs.md:{i}: {len(cells)} cells, header has {len(header)}"
            rows.append((section, i, cells[-1]))
    return rows


def _names(cell: str, where: str) -> list[str]:
    if cell.startswith(NO_MUTANT):
        assert len(cell.lstrip(NO_MUTANT).strip()) >= 10, f"{where}: a row without a mutant must say why: {cell!r}"
        return []
    assert NAMES_CELL.fullmatch(cell), f"{where}: expected `name`[, `name`...] or '{NO_MUTANT} reason', got {cell!r}"
    return re.findall(r"`([a-z0-9_]+)`", cell)


def named() -> dict[str, set[str]]:
    """Section -> the catalogue names its rows give."""
    out: dict[str, set[str]] = {s: set() for s in SECTIONS}
    for section, line, cell in bugs_rows():
        out[section].update(_names(cell, f"docs/bugs.md:{line}"))
    return out


def test_bugs_md_has_every_section():
    rows = bugs_rows()
    assert {s for s, _, _ in rows} == set(SECTIONS)


def test_every_named_entry_exists_with_its_sections_subject():
    for section, line, cell in bugs_rows():
        for name in _names(cell, f"docs/bugs.md:{line}"):
            try:
                entry = mutants.by_name(name)
            except Exception as exc:  # InvalidArgument names the known entries
                raise AssertionError(f"docs/bugs.md:{line}: {name!r} is not in specverify.mutants") from exc
            assert entry.kind in SECTIONS[section], (
                f"docs/bugs.md:{line}: {name!r} is a {entry.kind!r} entry, section {section!r} takes {sorted(SECTIONS[section])}"
            )
            if section == OWN_SECTION:
                assert entry.provenance.startswith("specverify"), (
                    f"docs/bugs.md:{line}: {name!r} has provenance {entry.provenance!r}: it belongs in a subject section"
                )


def test_every_upstream_mutant_has_a_row():
    rows = named()
    in_subject_sections = set().union(*(rows[s] for s in SUBJECT_SECTIONS), rows["Found by specverify's audits"])
    upstream = [e for e in mutants.CATALOGUE if e.lossy and not e.provenance.startswith("specverify")]
    assert upstream, "the catalogue has no upstream mutant: the rule below would be vacuous"
    missing = [
        f"{e.name} ({e.kind}; provenance {e.provenance!r})" for e in upstream if e.name not in in_subject_sections
    ]
    assert not missing, f"mutants with an upstream provenance but no row in docs/bugs.md: {missing}"


def test_every_entry_citing_docs_bugs_md_is_listed():
    listed = set().union(*named().values())
    citing = [e.name for e in mutants.CATALOGUE if "docs/bugs.md" in e.provenance]
    assert citing
    missing = [n for n in citing if n not in listed]
    assert not missing, f"entries whose provenance cites docs/bugs.md but that it does not list: {missing}"


# ---------------------------------------------------------------- self-contained
#: The design notes that lived outside the repository; their copies are docs/<name>.
NOTES = ("design", "bugs", "trees-and-lossy")
#: A path into the outside notes folder (written so that this file does not match itself).
OUTSIDE_FOLDER = re.compile(r"(?<![\w./-])shared[/]")
#: A note named without its docs/ folder (a relative link inside docs/ is fine).
BARE_NOTE = re.compile(r"(?<![\w./-])(" + "|".join(map(re.escape, NOTES)) + r")\.md\b")
#: An absolute path of one machine.
ABSOLUTE = re.compile(r"(?<![\w.~-])/(?:" + "|".join(["work", "root", "home", "Users", "opt"]) + r")/")
#: Relative Markdown link targets: ``[text](target)``.
LINK = re.compile(r"\]\(([^)\s]+)\)")


def repository_files() -> list[Path]:
    """Tracked files, and new files not ignored (so that what is about to be committed is checked)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    paths = sorted({ROOT / p for p in out.decode().split("\0") if p})
    return [p for p in paths if p.is_file()]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:
        return None  # binary (plots)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def outside_references(path: Path, text: str) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    found: list[str] = []
    if not any(pattern.search(text) for pattern in (OUTSIDE_FOLDER, ABSOLUTE, BARE_NOTE)):
        return found  # one scan of the whole text; the lines are read only where a pattern occurs
    for i, line in enumerate(text.splitlines(), 1):
        for pattern, why in ((OUTSIDE_FOLDER, "the outside notes folder"), (ABSOLUTE, "an absolute machine path")):
            if pattern.search(line):
                found.append(f"{rel}:{i}: {why}: {line.strip()[:160]}")
        for m in BARE_NOTE.finditer(line):
            if rel.startswith("docs/") and (DOCS / f"{m.group(1)}.md").is_file():
                continue  # a relative link between the docs pages
            found.append(f"{rel}:{i}: {m.group(0)} without docs/: {line.strip()[:160]}")
    return found


def test_no_file_points_outside_the_repository():
    found = []
    for path in repository_files():
        text = _text(path)
        if text is not None:
            found += outside_references(path, text)
    assert not found, "references outside the repository:\n" + "\n".join(found)


def test_markdown_links_resolve():
    pages = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    broken = []
    for page in pages:
        for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue  # a URL or an anchor
                if not (page.parent / target.split("#")[0]).exists():
                    broken.append(f"{page.relative_to(ROOT).as_posix()}:{i}: {target}")
    assert not broken, "links to missing files:\n" + "\n".join(broken)


_NOTE = "bugs" + ".md"  # spelled apart so that this file does not match the patterns it tests


@pytest.mark.parametrize(
    "rel, line, bad",
    [
        ("specverify/x.py", "see ``docs/design.md`` and docs/" + _NOTE, False),
        ("specverify/x.py", f"see [{_NOTE}]({_NOTE})", True),  # outside docs/ a bare name is not a link
        ("docs/x.md", f"see [{_NOTE}]({_NOTE})", False),  # a relative link between docs pages
        ("specverify/x.py", "the design follows `" + "shared" + "/design.md`", True),
        ("specverify/x.py", "References: design" + ".md.", True),
        ("README.md", "python -m venv " + "/wo" + "rk/venvs/vllm", True),
        ("README.md", "cd " + "/ho" + "me/me/specverify", True),
        ("README.md", "https://github.com/home/x, ~/work/x and reports/openvino/README.md", False),
    ],
)
def test_the_patterns(rel, line, bad):
    found = outside_references(ROOT / rel, line)
    assert bool(found) == bad, found


def test_the_readme_leads_with_the_first_ten_minutes_and_names_the_api_as_the_code_has_it():
    """The four first-hour jobs come first, one block each; the catalogue API is named with every kind and subject."""
    readme = (ROOT / "README.md").read_text()
    first = readme.split("## Going further")[0]
    for job in ("specverify audit --verifier", "specverify audit --decoder", "specverify audit --endpoint",
                "pytest -m specverify"):  # fmt: skip
        assert job in first, job
    assert len(readme.splitlines()) < 200
    usage = (DOCS / "usage.md").read_text()
    for name in (*mutants.KINDS, *mutants.SUBJECTS):
        assert f'"{name}"' in usage, name
