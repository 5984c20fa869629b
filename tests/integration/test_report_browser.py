"""report.html in a real browser (headless Chromium) at a desktop and a narrow width:
nothing runs off the page, every image loads."""

import json
import re
import shutil
import subprocess

import pytest

from tests.unit.test_report import synthetic_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Added to a copy of the page only: the report itself carries no script.
CHECK = """<script>
window.addEventListener('load', () => {
  const width = window.innerWidth, overflowing = [];
  for (const el of document.body.querySelectorAll('*')) {
    if (el.closest('.scroll') && !el.classList.contains('scroll')) continue;  // scrolls inside its own box
    const box = el.getBoundingClientRect();
    if (box.right > width + 1 || box.left < -1) overflowing.push(el.tagName + ' ' + Math.round(box.right));
  }
  // tables that set our numbers beside a paper's (their note names the paper's CSV) and need scrolling
  const wide = [...document.querySelectorAll('.scroll')].filter(
    box => box.textContent.includes('paper numbers from') && box.scrollWidth > box.clientWidth + 1);
  const images = [...document.images];
  document.body.setAttribute('data-check', JSON.stringify({
    width, overflowing: overflowing.slice(0, 10), images: images.length, wide_paper_tables: wide.length,
    broken: images.filter(i => !(i.complete && i.naturalWidth > 0)).length,
    page_wider: document.documentElement.scrollWidth > width + 1}));
});
</script></body>"""


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A synthetic sweep's report.html, with the checking script added to a copy."""
    _, report, _ = synthetic_report(tmp_path_factory)
    checked = report / "checked.html"
    checked.write_text((report / "report.html").read_text().replace("</body>", CHECK))
    return checked


@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium package (apt-get install chromium); .ci/run installs it"
)
@pytest.mark.parametrize("width", [1280, 800])
def test_report_fits_the_window_and_every_image_loads(page, width, tmp_path):
    dom = subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--window-size={width},1000",
            "--virtual-time-budget=10000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    found = re.search(r"data-check=\"([^\"]*)\"", dom)
    assert found, dom[-2000:]
    check = json.loads(found.group(1).replace("&quot;", '"'))
    assert check["width"] == width
    assert check["images"] >= 4 and check["broken"] == 0
    assert check["overflowing"] == [] and not check["page_wider"], check
    if width >= 1280:  # the compact paper table fits a desktop window without scrolling
        assert check["wide_paper_tables"] == 0, check
