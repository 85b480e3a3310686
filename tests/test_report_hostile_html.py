"""Hostile strings in an HTML report: a real browser's DOM is the DOM of the same report with harmless text.

A committed endpoint audit's report has every free text in it -- the implementation and command,
errors, scenario names and descriptions, test names, methods and positions, and every string in
the details, the endpoint section and the environment -- replaced by payloads that break out of
HTML (script and event-handler injection, closing tags, comments, template and mathtext syntax,
entities, bidi overrides, control characters and a lone surrogate).  The same report with each
payload replaced by as many ``x`` is the control (the renderer's ``<wbr>`` line-break hints, which
follow the text's ``:_,/``, are left out of the comparison).  Headless Chromium loads both pages, runs
whatever script they hold, and dumps its DOM: the two trees must have the same elements with the
same attributes in the same order, no injected script may have run, and each payload must be on
the page as text.  Plots are rendered too (matplotlib must not read the payloads as mathtext).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import warnings
from html.parser import HTMLParser
from pathlib import Path

import pytest

from specverify.core.results import Report
from specverify.report import render_html, render_markdown, write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
#: CI installs Chromium and sets this: there the browser tests fail rather than skip without it.
REQUIRED = os.environ.get("SPECVERIFY_REQUIRE_BROWSER") == "1"
browser = pytest.mark.skipif(
    CHROMIUM is None and not REQUIRED, reason="needs Chromium (Debian: apt-get install chromium)"
)
SERVED = Path(__file__).resolve().parents[1] / "reports" / "vllm" / "served"
#: A failing audit (test tables, counterexample) and one that could not test the server (its errors).
SOURCES = {
    "fail": SERVED / "eagle_k3_t1.0_skip_determinism" / "report.json",
    "error": SERVED / "ngram_k3_t1.0" / "report.json",
}

PAYLOADS = [
    "<script>document.documentElement.setAttribute('data-pwned','script')</script>",
    "<img src=x onerror=\"document.documentElement.setAttribute('data-pwned','img')\">",
    "\"><svg onload=document.documentElement.setAttribute('data-pwned','svg')>",
    "'><b id=pwned class=pwned>bold</b>",
    "</td></tr></table></pre></code></textarea></style></script><h1>owned</h1>",
    "<a href=\"javascript:document.documentElement.setAttribute('data-pwned','href')\">link</a>",
    "$\\frac{a}{b}$ and $x^$ {{7*7}} ${7*7} %s %(x)s \\n",
    "<!-- <![CDATA[ ]]> --> &amp; &lt; &#x3C;script&#x3E;",
    "\u202egnp.exe\u202c \x1b[31mred\x1b[0m \x07 \ud800 end",
]
#: Keys whose string values are the report's structure (a verdict, a grade, a family): kept as they are.
STRUCTURAL = {"kind", "verdict", "grade", "family", "tier", "schema", "mode", "name_of_family"}


class _Replacer:
    """Replaces every free text by a payload (``hostile``) or by as many ``x`` (the control), consistently."""

    def __init__(self, hostile: bool):
        self.hostile = hostile
        self.seen: dict[str, str] = {}

    def text(self, value: str) -> str:
        if value not in self.seen:
            n = len(self.seen)
            payload = PAYLOADS[n % len(PAYLOADS)] + f" #{n}"
            self.seen[value] = payload if self.hostile else "x" * (len(payload) - len(f" #{n}")) + f" #{n}"
        return self.seen[value]

    def walk(self, value, key: str = ""):
        if isinstance(value, str):
            return value if key in STRUCTURAL else self.text(value)
        if isinstance(value, list):
            return [self.walk(v, key) for v in value]
        if isinstance(value, dict):
            return {k: self.walk(v, k) for k, v in value.items()}
        return value


def _report(source: str, hostile: bool) -> Report:
    data = json.loads(SOURCES[source].read_text())
    data.pop("conformance", None)
    replaced = _Replacer(hostile).walk(data)
    for key in ("seed", "alpha", "gate_conformance", "schema"):
        replaced[key] = data[key]
    return Report.from_dict(replaced)


class _Structure(HTMLParser):
    """The elements of a DOM, in order, with their attribute names; and its text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple] = []
        self.attributes: list[tuple] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag != "wbr":  # the renderer's line-break hints after ":_,/" depend on the text, not its escaping
            self.elements.append((tag, tuple(sorted(name for name, _ in attrs))))
        self.attributes += attrs

    def handle_data(self, data):
        self.text.append(data)


def _dom(page: Path, profile: Path) -> _Structure:
    assert CHROMIUM is not None, "SPECVERIFY_REQUIRE_BROWSER=1 but no Chromium is installed"
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--virtual-time-budget=3000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0 and "<html" in out.stdout, out.stderr[-2000:]
    structure = _Structure()
    structure.feed(out.stdout)
    return structure


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_hostile_strings_render_as_text(source):
    """Without a browser: every renderer takes the payloads, and the HTML holds none of them raw."""
    report = _report(source, hostile=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. a layout squeezed away by a long name
        page = render_html(report, plots=True)
    for payload in PAYLOADS[:6]:
        assert payload not in page
    render_markdown(report)
    report.summary()


@browser
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_hostile_strings_leave_the_dom_of_the_report_unchanged(tmp_path, source):
    pages = {}
    for name, hostile in (("control", False), ("hostile", True)):
        paths = write_report(_report(source, hostile), tmp_path / name, plots=False)
        pages[name] = _dom(paths["html"], tmp_path / f"profile-{name}")
    control, hostile = pages["control"], pages["hostile"]
    assert len(hostile.elements) > 100  # a whole report was rendered
    assert hostile.elements == control.elements
    names = {name for name, _ in hostile.attributes}
    assert "data-pwned" not in names and ("id", "pwned") not in hostile.attributes
    text = "".join(hostile.text)
    for payload in PAYLOADS[:8]:
        assert payload in text, payload


@browser
def test_the_dom_check_sees_a_renderer_that_does_not_escape(tmp_path, monkeypatch):
    """The planted fault: with escaping switched off, an injected script runs and the trees differ."""
    import specverify.report.html as html_renderer

    monkeypatch.setattr(html_renderer, "esc", str)
    pages = {}
    for name, hostile in (("control", False), ("hostile", True)):
        paths = write_report(_report("error", hostile), tmp_path / name, plots=False)
        pages[name] = _dom(paths["html"], tmp_path / f"profile-{name}")
    assert pages["hostile"].elements != pages["control"].elements
    assert "data-pwned" in {name for name, _ in pages["hostile"].attributes}
