"""The report's page in a real headless Chromium (tests/cdp.py) at phone width: nothing runs off the screen, the
claims table reads as one card per claim, every claim's section is there, and no console error. The page is rendered
from the committed reference's results (``attnlab report --from``), so no experiment runs here."""
import subprocess
import sys
from pathlib import Path

import pytest
from cdp import open_page
from serving import chromium

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "reports" / "cpu-full" / "results.json"


@pytest.fixture(scope="module")
def report_page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    r = subprocess.run([sys.executable, "-m", "attnlab", "report", "--from", str(REFERENCE), "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out / "index.html"


@pytest.mark.parametrize("width", [390, 1280])
def test_report_page_fits_the_screen(report_page, width, tmp_path):
    browser = chromium()
    if browser is None:
        pytest.skip("chromium not installed (apt-get install chromium)")
    with open_page(browser, tmp_path, width=width, height=900) as page:
        page.call("Page.navigate", url=report_page.as_uri())
        page.wait("document.readyState === 'complete'", "the report to load")
        assert page.js("document.documentElement.scrollWidth") <= width, "the page is wider than the screen"
        # every claim: a row in the table (its key figure at least half the screen wide, not a word per line) and a
        # section below
        rows = page.js("[...document.querySelectorAll('table.claims td.figure')].map(e => e.getBoundingClientRect()"
                       ".width)")
        sections = page.js("document.querySelectorAll('section.claim').length")
        assert len(rows) == sections == 18
        assert min(rows) >= (0.8 if width < 600 else 0.2) * min(width, 980) - 40, rows
        header_shown = page.js("getComputedStyle(document.querySelector('table.claims tr.head')).display !== 'none'")
        assert header_shown == (width >= 600)
        page.screenshot(tmp_path / f"report_{width}.png")
        assert (tmp_path / f"report_{width}.png").stat().st_size > 10_000
        assert not page.errors(), page.errors()
